"""Stage 4, grpo: full GRPO with `trl.GRPOTrainer` and a KL penalty (`beta > 0`).

Trainer checkpoints go to the stage's work folder every `save_steps`; a rerun resumes from the last
good one and records `resumed_from_step`. The training-reward curve is kept (`train_log.jsonl`), and
the batches TRL scored are kept as trajectories.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from stages import trajectories
from stages.data import data_identity, load_task
from stages.rewards import GAMEABLE_WARNING, from_specs, gameable_names


def config_section(recipe) -> dict[str, Any]:
    return {
        "data": data_identity(recipe.data),
        "rewards": [r.model_dump() for r in recipe.rewards],
        "grpo": recipe.grpo_settings(),
        "peft": recipe.peft,
        "model": {"dtype": recipe.model.dtype, "merge_lora": recipe.model.merge_lora},
    }


class _Step(TrainerCallback):
    """Tells the trajectory recorder which step a scored batch belongs to."""

    def __init__(self, recorder: trajectories.Recorder):
        self.recorder = recorder

    def on_step_begin(self, args, state, control, **kwargs):
        self.recorder.step = state.global_step + 1


class _Clock(TrainerCallback):
    """Adds `wall_s` (seconds since this process started training) to each log entry."""

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0 = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if hasattr(self, "t0") and state.log_history:
            state.log_history[-1]["wall_s"] = round(time.perf_counter() - self.t0, 3)  # the Trainer stored a copy of `logs`


class FaultInjection(TrainerCallback):
    """Test hooks: `REGIMEN_FAULT=<stage>@<step>` raises after that step; `REGIMEN_KILL=<stage>@<step>`
    SIGKILLs the process there (a crash at a known step, for resume tests and benchmarks)."""

    def __init__(self, stage: str):
        import os

        def at(var: str) -> int | None:
            name, _, step = os.environ.get(var, "").partition("@")
            return int(step) if name == stage and step.isdigit() else None

        self.fault, self.kill = at("REGIMEN_FAULT"), at("REGIMEN_KILL")

    def on_step_end(self, args, state, control, **kwargs):
        if self.kill is not None and state.global_step >= self.kill:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault is not None and state.global_step >= self.fault:
            raise RuntimeError(f"injected fault (REGIMEN_FAULT) at step {state.global_step}")


def build_trainer(recipe, policy: str, output_dir: Path, recorder: trajectories.Recorder, *, stage: str = "grpo", **overrides: Any):
    """A GRPOTrainer over the task's training prompts with the recipe's rewards and weights."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from stages.checkpoints import MarkComplete
    from stages.model import load_tokenizer
    from stages.policy import peft_config
    from stages.trl_args import grpo_args

    fns = from_specs(recipe.rewards)
    if "reward_weights" not in recipe.grpo:
        overrides.setdefault("reward_weights", [recipe.reward_weights()[k] for k in fns])
    if recipe.model.dtype != "float32":
        overrides.setdefault("model_init_kwargs", {"dtype": recipe.model.dtype})
    args = grpo_args(recipe, output_dir, **overrides)
    task = load_task(recipe.data)
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=[recorder.wrap(name, fn) for name, fn in fns.items()],
        args=args,
        train_dataset=Dataset.from_list(task.train),
        processing_class=load_tokenizer(policy),
        peft_config=peft_config(recipe),
        callbacks=[MarkComplete(), _Step(recorder), _Clock(), FaultInjection(stage)],
    )
    return trainer, fns


def curve_metrics(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """Summary numbers of the training curve (the first and last logging windows, averages)."""
    logs = [h for h in log_history if "reward" in h]
    if not logs:
        return {}
    first, last = logs[0], logs[-1]

    def mean(key: str) -> float:
        vals = [h[key] for h in logs if key in h and h[key] is not None]
        return statistics.fmean(vals) if vals else math.nan

    out = {
        "train_reward_first": first["reward"],
        "train_reward_last": last["reward"],
        "train_reward_mean": mean("reward"),
        "reward_std_last": last.get("reward_std", math.nan),
        "frac_reward_zero_std_mean": mean("frac_reward_zero_std"),
        "frac_reward_zero_std_last": last.get("frac_reward_zero_std", math.nan),
        "kl_last": last.get("kl", math.nan),
        "loss_last": last.get("loss", math.nan),
    }
    for key in last:
        if key.startswith("rewards/") and key.endswith("/mean"):
            out[f"train_{key}"] = last[key]
    return out


def run(recipe, inputs: dict[str, Any], dirs) -> Any:
    from stages.checkpoints import train_resumable
    from stages.policy import save_policy
    from stages.runner import StageOutput

    policy = inputs["policy"]["model"]
    recorder = trajectories.Recorder()
    trainer, fns = build_trainer(recipe, policy, dirs.checkpoints, recorder)
    t0 = time.perf_counter()
    resumed = train_resumable(trainer, dirs.checkpoints, trainer.args.max_steps)
    train_s = time.perf_counter() - t0
    save_policy(trainer, trainer.processing_class, Path(dirs.out) / "model", merge=recipe.model.merge_lora)
    history = trainer.state.log_history
    with open(Path(dirs.out) / "train_log.jsonl", "w") as fh:
        for h in history:
            fh.write(json.dumps(h) + "\n")
    trajectories.write(dirs.out, recorder.rows())
    steps_run = trainer.state.global_step - resumed
    metrics = curve_metrics(history)
    metrics.update({
        "steps": float(trainer.state.global_step),
        "steps_run": float(steps_run),
        "beta": float(trainer.args.beta),
        "train_s": train_s,
        "completions_per_s": steps_run * trainer.args.generation_batch_size / trainer.args.steps_per_generation / train_s if train_s > 0 and steps_run else 0.0,
    })
    extra: dict[str, Any] = {"resumed_from_step": resumed}
    if gameable := gameable_names(fns):
        extra["warning"] = GAMEABLE_WARNING.format(names=", ".join(gameable))
    return StageOutput(metrics, extra=extra)
