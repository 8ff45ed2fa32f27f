"""Trajectories: what the model actually wrote, with each reward's value, for a person to read.

Every stage writes `trajectories.jsonl` (one object per sample: prompt, completion, rewards, and
context such as the step or the reference answer). Reading these is how reward hacking gets caught.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from regimen.stages.core.errors import InputError
from regimen.stages.environments.bounds import rollout_counts
from regimen.stages.rewards import completion_text
from regimen.stages.rewards.registry import check_values
from regimen.stages.rewards.scoring import trained_totals

FILE = "trajectories.jsonl"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def rows_from_batch(
    prompts: list[Any], completions: list[Any], rewards: dict[str, list[float | None]], **context: list[Any]
) -> list[dict[str, Any]]:
    rows = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        row = {
            "prompt": prompt,
            "completion": completion_text(completion),
            "rewards": {k: _clean(v[i]) for k, v in rewards.items()},
        }
        for key, values in context.items():
            row[key] = _clean(values[i])
        rows.append(row)
    return rows


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    path = Path(path)
    if path.is_dir():
        path = path / FILE
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")


def read(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    path = Path(path)
    if path.is_dir():
        path = path / FILE
    rows = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
                if limit is not None and len(rows) >= limit:
                    break
    return rows


def checked(name: str, fn, step) -> Any:
    """`fn` whose every batch of values is checked as TRL needs them (one real number or None per completion): a bad
    value names the reward, the row, the value and the training step (`step()`), at every step, not only at the door."""

    def call(prompts, completions, **kwargs):
        try:
            return check_values(name, fn(prompts=prompts, completions=completions, **kwargs), len(completions))
        except InputError as exc:
            raise InputError(f"{exc} (at training step {max(step(), 1)})") from None

    return call


class Sampler:
    """A bounded sample of the batches TRL scores (the first ones and the latest), kept as trajectories. TRL calls
    each reward in turn on the same batch: the first reward's call opens a batch record, each adds its values."""

    def __init__(self, keep_first: int = 2, keep_last: int = 2, rows_per_batch: int = 32):
        self.keep_first, self.keep_last, self.rows_per_batch = keep_first, keep_last, rows_per_batch
        self.batches: list[dict[str, Any]] = []

    def add(self, first: bool, step: int, name, prompts, completions, values, kwargs) -> None:
        n = self.rows_per_batch
        if not self.batches or first:  # (not by id(): CPython reuses a freed list's id)
            batch = {
                "step": step,
                "prompts": list(prompts[:n]),
                "completions": list(completions[:n]),
                "answer": list(kwargs.get("answer", [None] * len(prompts))[:n]),
                "rewards": {},
            }
            if kwargs.get("environments"):  # episodes: every turn, each tool call and what it returned
                from regimen.stages.training.episodes import transcript

                batch["episode"] = [transcript(c, e) for c, e in zip(completions[:n], kwargs["environments"][:n])]
            self.batches.append(batch)
            if len(self.batches) > self.keep_first + self.keep_last:
                del self.batches[self.keep_first]
        self.batches[-1]["rewards"][name] = [None if v is None else float(v) for v in values[:n]]

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for b in self.batches:
            k = len(b["completions"])
            extra = {"episode": b["episode"]} if "episode" in b else {}
            out += rows_from_batch(
                b["prompts"], b["completions"], b["rewards"], step=[b["step"]] * k, answer=b["answer"], **extra
            )
        return out


class Listeners:
    """Whoever hears each whole batch the trainer scores (the curriculum, pass rates): once every reward has scored
    it, `fn(kwargs, values)` with the values in the rewards' order."""

    def __init__(self):
        self.fns: list[Any] = []
        self.expected = 0
        self.values: dict[str, list[Any]] = {}

    def add(self, fn, rewards: int) -> None:
        self.fns.append(fn)
        self.expected = rewards

    def hear(self, first: bool, name, values, kwargs) -> None:
        if not self.fns:
            return
        if first:
            self.values = {}
        self.values[name] = list(values)
        if len(self.values) == self.expected:
            columns, self.values = list(self.values.values()), {}
            for fn in self.fns:
                fn(kwargs, columns)


GROUPS_FILE = "groups.jsonl"


class Groups:
    """Every group GRPO scored, per step: the prompt's id, each attempt's weighted reward and its advantage (TRL's rule:
    the reward less the group's mean, over the group's standard deviation with `scale_rewards: group`, the batch's
    with `batch`, unscaled with `none`), so a person sees which groups taught something (an all-alike group's
    advantages are all 0). One line per scored batch in `groups.jsonl`."""

    def __init__(self, weights: list[float], group: int, scale: str = "group"):
        self.weights, self.group, self.scale = weights, max(int(group), 1), str(scale)
        self.batches: list[dict[str, Any]] = []

    def listener(self, recorder: Recorder):
        def heard(kwargs: dict[str, Any], values: list[list[float | None]]) -> None:
            totals = trained_totals(values, self.weights)  # the scoring module's rule, as GRPO trains
            ids = kwargs.get("prompt_id") or [None] * len(totals)
            batch_std = _std(totals)
            groups = []
            for k in range(0, len(totals) - self.group + 1, self.group):
                g = totals[k : k + self.group]
                mean = sum(g) / len(g)
                spread = {"batch": batch_std, "none": 1.0 - 1e-4}.get(self.scale, _std(g))
                groups.append(
                    {
                        "id": ids[k],
                        "rewards": [round(x, 6) for x in g],
                        "advantage": [round((x - mean) / (spread + 1e-4), 6) for x in g],
                        "alike": max(g) - min(g) < 1e-9,
                    }
                )
            self.batches.append({"step": recorder.step, "groups": groups})

        return heard

    def write(self, path: Path) -> None:
        write(Path(path) / GROUPS_FILE, self.batches)


def _std(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))  # torch.std's unbiased estimate, as TRL's


class Recorder:
    """The reward functions GRPO gets: each checked (`checked`), its batches sampled as trajectories (`Sampler`)
    and heard by the curriculum (`Listeners`), three small pieces joined here."""

    def __init__(self, keep_first: int = 2, keep_last: int = 2, rows_per_batch: int = 32):
        self.sampler = Sampler(keep_first, keep_last, rows_per_batch)
        self.listeners = Listeners()
        self.step = 0
        self.order: list[str] = []
        self.groups: Groups | None = None  # set by the trainer's builder: every scored group, per step
        self.tool_bounds: dict[str, float] = {}  # rollouts' tool calls past a bound, over this process's training

        self._bounds_seen = rollout_counts()  # what earlier stages of this process counted is theirs

    def listen(self, fn, rewards: int) -> None:
        """Hear each whole batch the trainer scores: `fn(kwargs, values)`, values in the rewards' order."""
        self.listeners.add(fn, rewards)

    def wrap(self, name: str, fn):
        self.order.append(name)  # TRL calls the rewards in this order: the first one opens each batch
        check = checked(name, fn, lambda: self.step)

        def wrapped(prompts, completions, **kwargs):
            values = check(prompts, completions, **kwargs)
            first = name == self.order[0]
            if first and kwargs.get("environments") is not None:
                self._count_tool_bounds(kwargs.get("log_metric"))
            self.sampler.add(first, self.step, name, prompts, completions, values, kwargs)
            self.listeners.hear(first, name, values, kwargs)
            return values

        wrapped.__name__ = name  # TRL logs rewards/<name>/...: the report name, as everywhere else
        wrapped.gameable = getattr(fn, "gameable", False)  # type: ignore[attr-defined]
        return wrapped

    def _count_tool_bounds(self, log_metric) -> None:
        """This batch's rollouts' tool calls past the time limit and replies cut (`environments/bounds.py` counts
        them as TRL's loop makes them): into TRL's training log through its `log_metric` (per batch, averaged over
        a logging step) and into the totals."""
        now = rollout_counts()
        seen, self._bounds_seen = self._bounds_seen, now
        for key, total in now.items():
            n = total - seen.get(key, 0.0)
            self.tool_bounds[key] = self.tool_bounds.get(key, 0.0) + n
            if callable(log_metric):
                log_metric(key, n)

    def rows(self) -> list[dict[str, Any]]:
        return self.sampler.rows()
