"""The one list of tasks, by `data.task` name. Adding a task: write its module (see `tasks/__init__.py`)
and add it here; the recipe's `data:` section validates against the task's `Options` from this list."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from regimen.stages.tasks import Task, addition, code, hf, jsonl, reasoning_gym, tool_probe, with_frozen_heldout

TASKS = {m.NAME: m for m in (addition, code, jsonl, hf, tool_probe, reasoning_gym)}


def options_models() -> tuple[type, ...]:
    return tuple(m.Options for m in TASKS.values())


def identity(data) -> dict[str, Any]:
    """What the data is, for fingerprints: the task's options and the data's digest."""
    return TASKS[data.task].identity(data)


_LOADED: dict[str, Task] = {}


def frozen_rows(ref: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a frozen held-out set (`rows.jsonl` in the version folder its reference names)."""
    text = (Path(ref["path"]) / "rows.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_task(data, heldout: dict[str, Any] | None = None) -> Task:
    """The recipe's `data` section as rows (generated deterministically, or read and checked); loaded
    once per process for the same data (the stages of one run share it). With `heldout` (a reference to
    the experiment's frozen held-out set, a stage input), evaluation uses exactly that set and training
    rows equal to one of its prompts are dropped (`tasks.with_frozen_heldout`)."""
    key = json.dumps([identity(data), (heldout or {}).get("fingerprint")], sort_keys=True)
    if key not in _LOADED:
        if len(_LOADED) >= 8:
            _LOADED.pop(next(iter(_LOADED)))
        task = TASKS[data.task].load(data)
        if heldout:
            task = with_frozen_heldout(task, frozen_rows(heldout))
        _LOADED[key] = task
    return _LOADED[key]
