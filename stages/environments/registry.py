"""Environments by name (`environment.name`): the registered ones (`probe`, `code`) or `pkg.module:Class`."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from regimen.stages.core.errors import InputError
from regimen.stages.environments import code, probe  # noqa: F401 - they register themselves
from regimen.stages.environments.base import registered


def known() -> list[str]:
    return sorted(registered())


def get(name: str) -> type:
    """An environment class by registry name or `pkg.module:Class`."""
    if name in registered():
        return registered()[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise InputError(f"environment.name: cannot import {name!r} ({exc})") from None
        if not isinstance(cls, type) or not callable(getattr(cls, "reset", None)):
            raise InputError(f"environment.name: {name!r} is not an environment class (it needs a reset method)")
        return cls
    raise InputError(
        f"environment.name: unknown environment {name!r}; known: {', '.join(known())}, or a dotted path "
        f"'pkg.module:Class'"
    )


def factory(spec) -> Callable[[], Any]:
    """What `GRPOTrainer(environment_factory=...)` takes: a callable making one instance per rollout."""
    cls = get(spec.name)
    return functools.partial(cls, max_turns=spec.max_turns, **spec.args)
