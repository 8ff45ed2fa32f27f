"""`curriculum.kind: levels`: GRPO's prompts generated at a difficulty level that rises with the policy.

GRPO learns only from groups whose attempts differ. A fixed pool re-weighted by pass rate (`curriculum.py`) can
only choose among the problems it holds; a task that generates problems by level (reasoning-gym's curricula) can
make the next harder one when the policy is ready. The controller (`LevelController`, pure and scripted in
`tests/test_levels.py`) watches the pass rate at the current level over the last `window` completions there:
at or above `up` it moves one level up (to `top` at most), at or below `down` one level down, and starts a fresh
window either way. The stream (`LevelsCurriculum.stream`) generates each next prompt at the current level
(`mode: adaptive`), at `start` always (`fixed`), or at a level drawn uniformly from `start` to `top`
(`uniform`): the two baselines `bench/curriculum.py` measures it against. A generated prompt equal to a held-out
one is skipped.

TRL reads the stream as an IterableDataset with `max_steps` (its documented way for a dataset without a
length), a batch ahead of training: a level change lands at the next generation batch. The controller's state
(level, window, the levels over time) is saved in every checkpoint and restored on resume; the levels over time
are the manifest's `curriculum.levels` (and a plot); the section is part of the stage's fingerprint. Pass: the
recipe's held-out metric reward scoring 1.0 (the task's scorer for reasoning_gym), else a positive total.

Hand-written: TRL has no difficulty controller, and reasoning-gym's own (its coaching module) drives a single
dataset from its evaluation, not a trainer's stream; this rule is twenty lines and tested on scripted rates.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from regimen.stages.rewards.scoring import passes, trained_totals
from regimen.stages.tasks import normalized_prompt
from regimen.stages.training import streams
from regimen.stages.training.pass_rates import prompt_id

log = logging.getLogger("regimen.curriculum")
STATE = "levels.json"


class LevelController:
    """The level and its moves (see the module doc). `observe(level, passed)` per completion; `decide(step)`
    between steps."""

    def __init__(self, cfg, top: int):
        self.cfg, self.top = cfg, top
        self.level = min(cfg.start, top)
        self.window: list[float] = []
        self.history: list[dict[str, Any]] = [{"step": 0, "level": self.level, "rate": None}]

    def observe(self, level: int, passed: float) -> None:
        if level == self.level:  # a completion of a prompt drawn before the last move counts for nothing
            self.window.append(float(passed))

    def decide(self, step: int) -> int:
        """Move one level when the window is full and its rate is past a threshold; the level after."""
        if self.cfg.mode != "adaptive" or len(self.window) < self.cfg.window:
            return self.level
        rate = sum(self.window[-self.cfg.window :]) / self.cfg.window
        moved = self.level
        if rate >= self.cfg.up and self.level < self.top:
            moved = self.level + 1
        elif rate <= self.cfg.down and self.level > 0:
            moved = self.level - 1
        self.window = []
        if moved != self.level:
            log.info("curriculum: level %d -> %d at step %d (pass rate %.2f)", self.level, moved, step, rate)
            self.level = moved
        self.history.append({"step": step, "level": self.level, "rate": round(rate, 4)})
        return self.level

    def state(self) -> dict[str, Any]:
        return {"level": self.level, "window": self.window, "history": self.history}

    def load(self, state: dict[str, Any]) -> None:
        self.level = int(state["level"])
        self.window = [float(x) for x in state["window"]]
        self.history = list(state["history"])


class LevelsCurriculum:
    """GRPO's stream of generated prompts and its controller (the `curriculum` build_trainer takes)."""

    def __init__(self, task_module, data, cfg, seed: int, heldout: list[dict[str, Any]], metric: str | None = None):
        self.task, self.data, self.cfg, self.seed, self.metric = task_module, data, cfg, seed, metric
        top = cfg.top if cfg.top is not None else task_module.top_level(data)
        self.controller = LevelController(cfg, top)
        self.held = {normalized_prompt(r["prompt"]) for r in heldout}
        self.index = 0
        self.step = 0
        self.rng = random.Random(seed + 17)
        self.drawn: dict[int, int] = {}

    def next_level(self) -> int:
        if self.cfg.mode == "uniform":
            return self.rng.randint(self.cfg.start, self.controller.top)
        if self.cfg.mode == "fixed":
            return min(self.cfg.start, self.controller.top)
        return self.controller.level

    def stream(self) -> Iterator[dict[str, Any]]:
        while True:
            level = self.next_level()
            row = self.task.row_at(self.data, level, self.seed, self.index)
            self.index += 1
            if normalized_prompt(row["prompt"]) in self.held:
                continue
            self.drawn[level] = self.drawn.get(level, 0) + 1
            yield {**row, "prompt_id": prompt_id(row["prompt"])}

    def observe(self, levels: list[Any], passed: list[float]) -> None:
        for level, ok in zip(levels, passed):
            if level is not None:
                self.controller.observe(int(level), ok)

    def screened(self, candidates: list[dict[str, Any]], scores, k: int) -> None:
        """What the screen saw (`screen.py`): each candidate's `k` answers count toward the pass rate at its level,
        by the listener's rule, so a level whose prompts are all solved (and screened out) still says when to rise."""
        names = list(scores.values)
        passed = verdicts(names, [scores.values[n] for n in names], None, self.metric, totals=scores.totals)
        self.observe([c.get("level") for c in candidates for _ in range(k)], passed)

    def state(self) -> dict[str, Any]:
        return {
            "controller": self.controller.state(),
            "index": self.index,
            "drawn": self.drawn,
            "rng": list(self.rng.getstate()[1]),
        }

    def load(self, state: dict[str, Any]) -> None:
        self.controller.load(state["controller"])
        self.index = int(state["index"])
        self.drawn = {int(k): int(v) for k, v in state["drawn"].items()}
        version, _, gauss = self.rng.getstate()
        self.rng.setstate((version, tuple(state["rng"]), gauss))

    def summary(self) -> dict[str, Any]:
        c = self.controller
        return {
            "kind": "levels",
            "mode": self.cfg.mode,
            "level": c.level,
            "top": c.top,
            "levels": c.history,
            "drawn_by_level": {str(k): v for k, v in sorted(self.drawn.items())},
        }


def dataset(curriculum: LevelsCurriculum):
    """An endless `datasets.IterableDataset` of prompts at the level the curriculum chooses as training goes."""
    return streams.dataset(curriculum)


def listener(curriculum: LevelsCurriculum, names: list[str], weights: list[float], metric: str | None):
    """For `Recorder.listen`: each completion's pass (the metric reward at 1.0, else a positive weighted total)
    at the level its prompt was generated at."""

    def heard(kwargs: dict[str, Any], values: list[list[float | None]]) -> None:
        levels = kwargs.get("level")
        if levels:
            curriculum.observe(list(levels), verdicts(names, values, weights, metric))

    return heard


def verdicts(
    names: list[str],
    values: list[list[float | None]],
    weights: list[float] | None,
    metric: str | None,
    *,
    totals: list[float] | None = None,
) -> list[float]:
    """A pass per completion: the metric reward's verdict by the scoring module's rule (no opinion: not a pass), else a
    positive weighted total (`totals` when already summed, else summed from `values` and `weights`)."""
    if metric in names:
        return [passes(v) or 0.0 for v in values[names.index(metric)]]
    if totals is None:
        totals = trained_totals(values, weights or [1.0] * len(values))
    return [float(t == t and t > 0) for t in totals]


class LevelsCallback(TrainerCallback):
    """Decides the level between steps, logs it (`curriculum/level`), saves the curriculum in each checkpoint
    and restores it on resume."""

    def __init__(self, curriculum: LevelsCurriculum):
        self.curriculum = curriculum

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step:
            self.restore(Path(args.output_dir) / f"checkpoint-{state.global_step}")

    def restore(self, ckpt: Path) -> None:
        path = Path(ckpt) / STATE
        try:
            self.curriculum.load(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("curriculum levels not restored from %s (%s): they start afresh", path, exc)

    def on_step_end(self, args, state, control, **kwargs):
        self.curriculum.step = state.global_step
        self.curriculum.controller.decide(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.log_history:
            state.log_history[-1]["curriculum/level"] = self.curriculum.controller.level

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                tmp = ckpt / f".{STATE}.tmp"
                tmp.write_text(json.dumps(self.curriculum.state()))
                os.replace(tmp, ckpt / STATE)
