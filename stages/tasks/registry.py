"""The one list of tasks, by `data.task` name. Adding a task: write its module (see `tasks/__init__.py`)
and add it here; the recipe's `data:` section validates against the task's `Options` from this list."""

from __future__ import annotations

import json
from typing import Any

from regimen.stages.tasks import Task, addition, code, hf, jsonl

TASKS = {m.NAME: m for m in (addition, code, jsonl, hf)}


def options_models() -> tuple[type, ...]:
    return tuple(m.Options for m in TASKS.values())


def identity(data) -> dict[str, Any]:
    """What the data is, for fingerprints: the task's options and the data's digest."""
    return TASKS[data.task].identity(data)


_LOADED: dict[str, Task] = {}


def load_task(data) -> Task:
    """The recipe's `data` section as rows (generated deterministically, or read and checked); loaded
    once per process for the same data (the stages of one run share it)."""
    key = json.dumps(identity(data), sort_keys=True)
    if key not in _LOADED:
        if len(_LOADED) >= 8:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = TASKS[data.task].load(data)
    return _LOADED[key]
