"""Trajectories: what the model actually wrote, with each reward's value, for a person to read.

Every stage writes `trajectories.jsonl` (one object per sample: prompt, completion, rewards, and
context such as the step or the reference answer). Reading these is how reward hacking gets caught.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from regimen.stages.rewards import completion_text

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


class Recorder:
    """Wraps reward functions so the batches TRL scores during GRPO are kept as trajectories.

    TRL calls each reward function in turn on the same batch; the first wrapper opens a batch record
    and each adds its values. Only a bounded sample of batches is kept (first ones and the latest).
    """

    def __init__(self, keep_first: int = 2, keep_last: int = 2, rows_per_batch: int = 32):
        self.keep_first, self.keep_last, self.rows_per_batch = keep_first, keep_last, rows_per_batch
        self.batches: list[dict[str, Any]] = []
        self.step = 0
        self.order: list[str] = []
        self.listeners: list[Any] = []  # called with (kwargs, [values per reward]) once every reward scored a batch
        self.expected = 0
        self._full: dict[str, Any] = {"id": None, "values": {}}

    def listen(self, fn, rewards: int) -> None:
        """Hear each whole batch the trainer scores: `fn(kwargs, values)`, values in the rewards' order."""
        self.listeners.append(fn)
        self.expected = rewards

    def wrap(self, name: str, fn):
        recorder = self
        self.order.append(name)  # TRL calls the rewards in this order: the first one opens each batch

        def wrapped(prompts, completions, **kwargs):
            from regimen.stages.core.errors import InputError
            from regimen.stages.rewards.registry import check_values

            # at every step, not only at the preflight: a bad value names the reward, the row and the value
            try:
                values = check_values(name, fn(prompts=prompts, completions=completions, **kwargs), len(completions))
            except InputError as exc:
                raise InputError(f"{exc} (at training step {max(recorder.step, 1)})") from None
            recorder._add(name, prompts, completions, values, kwargs)
            recorder.hear(name, completions, values, kwargs)
            return values

        wrapped.__name__ = name  # TRL logs rewards/<name>/...: the report name, as everywhere else
        wrapped.gameable = getattr(fn, "gameable", False)  # type: ignore[attr-defined]
        return wrapped

    def _add(self, name, prompts, completions, values, kwargs) -> None:
        n = self.rows_per_batch
        if not self.batches or name == self.order[0]:  # (not by id(): CPython reuses a freed list's id)
            batch = {
                "step": self.step,
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

    def hear(self, name, completions, values, kwargs) -> None:
        if not self.listeners:
            return
        if name == self.order[0]:
            self._full = {"id": None, "values": {}}
        self._full["values"][name] = list(values)
        if len(self._full["values"]) == self.expected:
            columns = list(self._full["values"].values())
            self._full = {"id": None, "values": {}}
            for fn in self.listeners:
                fn(kwargs, columns)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for b in self.batches:
            k = len(b["completions"])
            extra = {"episode": b["episode"]} if "episode" in b else {}
            out += rows_from_batch(
                b["prompts"], b["completions"], b["rewards"], step=[b["step"]] * k, answer=b["answer"], **extra
            )
        return out
