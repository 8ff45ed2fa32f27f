"""The held-out probe inside GRPO, the in-training reward-hacking guard, and keeping the best policy.

Every `probe.steps` steps (and at step 0 and the last step) the policy answers a fixed, seeded sample of
`probe.prompts` held-out prompts greedily; the probe's accuracy is logged beside the training reward
(`heldout_probe` entries in the Trainer's log history, hence `train_log.jsonl`, the plots and the
checkpoints, so a resumed run keeps its curve). After each probe the guard's pure rule
(`regimen.stages.decide.verdicts.guard_in_training`) reads both curves; when it fires the stage stops (`action:
stop`) or records a warning and goes on (`warn`). The weights of the best-probing step (ties: the later)
are kept in the work folder (`best/`, written under a temporary name, then renamed), so the version can
hold the best policy rather than the last.

Under `accelerate launch` the probe's prompts are split across ranks and the verdicts gathered, so the
work is shared, not repeated. Keeping the best is for models whose weights live whole on each rank (one
process, DDP); under FSDP or DeepSpeed the version keeps the last step, and says so.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from regimen.stages.decide.verdicts import SHARPENING, describe, read_guard, stops
from regimen.stages.rewards.scoring import Scorer, as_trained, columns, completion_ids
from regimen.stages.training.episodes import complete

log = logging.getLogger("regimen.probe")
BEST = "best"


def probe_rows(heldout: list[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    rows = list(heldout)
    random.Random(seed + 17).shuffle(rows)
    return rows[:n]


def precision(flags: list[float | None], rewards: list[float]) -> float | None:
    """Of the answers the reward pays in full (the batch's top weighted reward, above 0), the share that
    are correct: near 1 when the reward pays for what the task measures, near 0 when it pays wrong answers
    (the signature of hacking). None when nothing is paid or nothing is judged."""
    top = max(rewards, default=0.0)
    paid = [f for f, r in zip(flags, rewards) if r >= top - 1e-9 and f is not None] if top > 0 else []
    return sum(paid) / len(paid) if paid else None


class HeldoutProbe(TrainerCallback):
    """`rows`: the held-out sample; `train_rows`: a sample of training prompts, answered greedily too, whose
    accuracy and weighted reward (`train_probe`, `train_probe_reward` in the log) let the guard name what
    it sees (`regimen.stages.decide.verdicts.finding`)."""

    def __init__(
        self,
        recipe,
        rows: list[dict[str, Any]],
        tokenizer,
        work_dir: Path,
        progress=None,
        train_rows: list[dict[str, Any]] | None = None,
    ):
        self.recipe, self.rows, self.tokenizer = recipe, rows, tokenizer
        self.scorer = Scorer(recipe)  # the rewards' own instances for the probe
        self.train_rows = list(train_rows or [])
        self.every = recipe.probe.steps
        self.best_dir = Path(work_dir) / BEST
        self.trainer = None  # set by the stage once the trainer exists
        self.fired: dict[str, Any] | None = None  # the guard's finding that stops the stage (hacking, by default)
        self.warned: dict[str, Any] | None = (
            None  # ... one it only warns about (overfitting by default; hacking with action: warn)
        )
        self.noted: dict[str, Any] | None = None  # ... when it is sharpening (never stops a run)
        self.stopped_at_target: int | None = None
        self.warning: str | None = None
        self.probe_s = 0.0
        self.t0 = time.perf_counter()
        self.sharded = False
        self.progress = progress

    # -- curves (from the Trainer's log history, which checkpoints carry) ---------------------
    @staticmethod
    def curve(log_history: list[dict[str, Any]]) -> list[dict[str, float]]:
        return [
            {"step": h["step"], "heldout_accuracy": h["heldout_probe"]} for h in log_history if "heldout_probe" in h
        ]

    @staticmethod
    def train_curve(log_history: list[dict[str, Any]]) -> list[tuple[int, float]]:
        return [(h["step"], h["reward"]) for h in log_history if "reward" in h and "step" in h]

    @staticmethod
    def train_probe_curve(log_history: list[dict[str, Any]]) -> list[tuple[int, float, float, float | None]]:
        """(step, greedy accuracy, greedy weighted reward, precision of the reward) on the sample of training
        prompts."""
        return [
            (h["step"], h["train_probe"], h["train_probe_reward"], h.get("train_probe_precision"))
            for h in log_history
            if "train_probe" in h
        ]

    def best(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.best_dir / "best.json").read_text())
        except (OSError, ValueError):
            return None

    # -- measuring ----------------------------------------------------------------------------
    def measure(
        self, model, rows: list[dict[str, Any]] | None = None, *, with_reward: bool = False
    ) -> float | tuple[float, float]:
        """Greedy accuracy on `rows` (default: the held-out sample); with `with_reward`, also the mean
        weighted reward."""
        rows = self.rows if rows is None else rows
        t0 = time.perf_counter()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        mine = rows[rank::world]
        per_rank = -(-len(rows) // world)
        padded = mine + rows[: per_rank - len(mine)]  # equal shares: sharded models need every rank in step
        outs, envs = complete(
            model,
            self.tokenizer,
            self.recipe,
            padded,
            max_new_tokens=self.recipe.max_new_tokens(),
            batch_size=self.recipe.eval.batch_size,
            desc="held-out probe",
            synced_gpus=self.sharded,
        )
        completions = [c[0] for c in outs]
        extra = {"environments": [e[0] for e in envs][: len(mine)]} if envs is not None else None
        mine_c = completions[: len(mine)]
        flags: list[float | None] = []
        rewards: list[float] = []
        if mine:  # judged once, by the scoring module evaluation uses (`rewards/scoring.py`)
            cols, prompts = columns(mine, extra), [r["prompt"] for r in mine]
            cols["completion_ids"] = completion_ids(self.tokenizer, mine_c)
            if with_reward:
                scores = self.scorer(prompts, mine_c, cols)
                flags, rewards = scores.correct, as_trained(scores.totals)  # the reward as GRPO trains on it
            else:
                flags = self.scorer.correct(mine_c, cols, prompts=prompts)
        if world > 1:
            from accelerate.utils import gather_object

            flags = gather_object(flags)
            rewards = gather_object(rewards) if with_reward else rewards
        self.probe_s += time.perf_counter() - t0
        scored = [f for f in flags if f is not None]
        acc = sum(scored) / len(scored) if scored else 0.0
        if with_reward:
            return acc, (sum(rewards) / len(rewards) if rewards else 0.0), precision(flags, rewards)
        return acc

    def _probe(self, state, model) -> None:
        step = state.global_step
        if not any(h.get("heldout_probe") is not None and h.get("step") == step for h in state.log_history):
            acc = self.measure(model)
            entry = {"step": step, "heldout_probe": acc}
            if self.train_rows:
                entry["train_probe"], entry["train_probe_reward"], entry["train_probe_precision"] = self.measure(
                    model, self.train_rows, with_reward=True
                )
            state.log_history.append(
                {**entry, "probe_s": round(self.probe_s, 3), "wall_s": round(time.perf_counter() - self.t0, 3)}
            )
            train = self.train_curve(state.log_history)
            log.info(
                "held-out probe at step %d: %.3f%s",
                step,
                acc,
                f" (training reward {train[-1][1]:.3f})" if train else "",
            )
            if self.progress is not None and int(os.environ.get("RANK", "0")) == 0:
                try:
                    self.progress("probe", {"step": step, "log_history": list(state.log_history)})
                except Exception as exc:  # noqa: BLE001 - showing progress never stops training
                    log.warning("could not show the probe's progress: %s", exc)
            best = self.best()
            if (
                self.recipe.probe.keep == "best"
                and not self.sharded
                and (best is None or acc >= best["heldout_accuracy"])
            ):
                self._save_best(model, step, acc)
        self.recheck(state)

    def recheck(self, state) -> None:
        """The guard's rule on the curves as they stand (also after a resume, from the restored history):
        it fires when the rule holds at two probes in a row, so one noisy probe does not end a run."""
        if self.fired is not None:
            return
        probes = [(p["step"], p["heldout_accuracy"]) for p in self.curve(state.log_history)]
        train = self.train_curve(state.log_history)
        guard = self.recipe.cycle.guard
        found = read_guard(train, probes, self.train_probe_curve(state.log_history), guard, in_a_row=True)
        if found is not None:
            kind, seen, now = found.kind, found.as_dict(), found.figures
            if kind == SHARPENING:  # harmless: noted once, and the guard keeps watching
                if not self.noted:
                    self.noted = seen
                    log.info(
                        "guard: %s at step %d (training reward %+.3f, held-out probe %+.3f)",
                        describe(kind),
                        seen["step"],
                        now["train_reward_rise"],
                        now["heldout_gain"],
                    )
                return
            if found.stops(guard):
                self.fired = seen
                return
            # warned once per finding; the guard keeps watching
            if self.warned is None or self.warned["finding"] != kind:
                self.warned = seen
                self.warning = (
                    f"guard (warn): {kind} at step {probes[-1][0]}: the training reward had risen "
                    f"{now['train_reward_rise']:+.3f} "
                    f"while held-out probe accuracy changed {now['heldout_gain']:+.3f}; {describe(kind)}"
                )
                log.warning(self.warning)

    def final_look(self, log_history: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The guard's rule on the whole curves once training ended (a round where it never held at two
        probes in a row can still end with it holding): the named finding, else None."""
        probes = [(p["step"], p["heldout_accuracy"]) for p in self.curve(log_history)]
        guard = self.recipe.cycle.guard
        found = read_guard(
            self.train_curve(log_history), probes, self.train_probe_curve(log_history), guard, in_a_row=False
        )
        return None if found is None else found.as_dict()

    def _save_best(self, model, step: int, acc: float) -> None:
        if int(os.environ.get("RANK", "0")) != 0:
            return
        from safetensors.torch import save_file

        tmp = self.best_dir.with_name(f".{BEST}-{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        save_file(snapshot(model), str(tmp / "weights.safetensors"))
        (tmp / "best.json").write_text(json.dumps({"step": step, "heldout_accuracy": acc}))
        old = self.best_dir.with_name(f".{BEST}-old-{uuid.uuid4().hex[:8]}")
        if self.best_dir.exists():
            os.rename(self.best_dir, old)
        os.rename(tmp, self.best_dir)
        shutil.rmtree(old, ignore_errors=True)

    # -- Trainer hooks -------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        # the probe's entries carry wall_s (seconds of this process's training), as the Trainer's logs do
        self.t0 = time.perf_counter()
        self.sharded = bool(
            self.trainer is not None
            and (
                getattr(self.trainer, "is_fsdp_enabled", False) or getattr(self.trainer, "is_deepspeed_enabled", False)
            )
        )
        best = self.best()
        stale = best is not None and (state.global_step == 0 or best["step"] > state.global_step)
        if stale and int(os.environ.get("RANK", "0")) == 0:
            shutil.rmtree(self.best_dir, ignore_errors=True)  # left by another attempt: never this run's
        if self.every and model is not None:
            self._probe(state, self._unwrap(model))
            if self.fired_and_stopped():
                control.should_training_stop = True
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every and model is not None and state.global_step % self.every == 0:
            self._probe(state, self._unwrap(model))
            if self.fired_and_stopped():
                control.should_training_stop = True
            elif self.reached_target(state.log_history):
                self.stopped_at_target = state.global_step
                log.info(
                    "held-out probe at or above the target %.3f twice in a row: the round ends at step %d",
                    self.recipe.cycle.target,
                    state.global_step,
                )
                control.should_training_stop = True
        return control

    def reached_target(self, log_history: list[dict[str, Any]]) -> bool:
        """`probe.stop_at_target`: the last two probes (after step 0) reached `cycle.target`. Groups of a
        policy that solves nearly everything teach little; the evaluation on the whole set decides."""
        if not getattr(self.recipe.probe, "stop_at_target", False):
            return False
        probes = [p for p in self.curve(log_history) if p["step"] > 0]
        return len(probes) >= 2 and all(p["heldout_accuracy"] >= self.recipe.cycle.target for p in probes[-2:])

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.every and model is not None and not self.fired_and_stopped():
            self._probe(state, self._unwrap(model))

    def fired_and_stopped(self) -> bool:
        return bool(self.fired and stops(self.fired["finding"], self.recipe.cycle.guard))

    def _unwrap(self, model):
        if self.trainer is not None:
            return self.trainer.accelerator.unwrap_model(model)
        return model


def snapshot(model) -> dict[str, Any]:
    """The trainable state as CPU tensors: a LoRA model's adapter, else every weight."""
    try:
        from peft import PeftModel, get_peft_model_state_dict

        if isinstance(model, PeftModel):
            return {k: v.detach().to("cpu").clone().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    except ImportError:
        pass
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}


def restore_best(model, best_dir: Path) -> dict[str, Any] | None:
    """Load the kept best weights into `model`; returns best.json's record (None when there is none)."""
    from safetensors.torch import load_file

    try:
        record = json.loads((Path(best_dir) / "best.json").read_text())
        state = load_file(str(Path(best_dir) / "weights.safetensors"))
    except (OSError, ValueError):
        return None
    try:
        from peft import PeftModel, set_peft_model_state_dict

        if isinstance(model, PeftModel):
            set_peft_model_state_dict(model, state)
            return record
    except ImportError:
        pass
    model.load_state_dict(state, strict=False)
    return record
