"""Environments by name (`environment.name`): the registered ones (`probe`, `code`) or `pkg.module:Class`.

A class of your own comes in either shape: a subclass of Regimen's `Environment` (its tools end the episode on
a failure, `environment.args` are its options), or a class written for TRL's `environment_factory` as TRL
documents it, importing nothing of Regimen: `__init__()` without arguments, `reset(**row)` (a returned string
is appended to the user's message), public methods with docstrings as tools, and optionally `get_reward()`.
Such a class runs unchanged; a tool that raises answers the model `{'error': ...}` as TRL's loop does (counted),
and its `get_reward()` is the `get_reward` reward, listed in the recipe like any other (weights, monitors, the
audit, trajectories and the guard then treat it alike). Regimen hides `get_reward` from TRL's own look-up in
a subclass made here, so GRPO does not count it twice."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from regimen.stages.core.errors import InputError
from regimen.stages.environments import bounds, code, probe  # noqa: F401 - they register themselves
from regimen.stages.environments.base import Environment, registered
from regimen.stages.rewards.text import ENVIRONMENT_REWARDS


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


def trl_protocol(cls: type) -> bool:
    """Whether `cls` is written to TRL's protocol rather than as a subclass of Regimen's `Environment`."""
    return not issubclass(cls, Environment)


def adapted(
    cls: type, timeout_s: float | None = bounds.DEFAULT_TIMEOUT_S, max_chars: int | None = bounds.DEFAULT_MAX_CHARS
) -> type:
    """See `_adapted` (one class per class and bounds, however they are passed)."""
    return _adapted(cls, timeout_s, max_chars)


@functools.cache
def _adapted(cls: type, timeout_s: float | None, max_chars: int | None) -> type:
    """The class as GRPO and Regimen's episodes get it: a subclass whose tools run within the bounds
    (`environments/bounds.py`: a time limit, a size limit, a reply that is text), and, for a TRL-protocol class,
    `get_reward` hidden from TRL's look-up (the recipe's `get_reward` reward calls it instead, through
    `rewards.text.ENVIRONMENT_REWARDS`). Names, signatures and docstrings of the tools are kept."""
    attrs: dict[str, Any] = {
        **bounds.bounded(cls, timeout_s, max_chars),
        "__module__": cls.__module__,
        "__doc__": cls.__doc__,
        "__qualname__": cls.__qualname__,
    }
    attrs["reset"] = _named_reset(cls)
    own = getattr(cls, "get_reward", None) if trl_protocol(cls) else None
    if callable(own):
        attrs["get_reward"] = None
    made = type(cls.__name__, (cls,), attrs)
    if callable(own):
        ENVIRONMENT_REWARDS[made] = bounds.plain(own)  # its calls of its own methods are plain calls
    return made


def _named_reset(cls: type) -> Callable[..., Any]:
    """`cls.reset`, whose failure names the class and the row (TRL's loop and Regimen's episodes call it with a
    dataset row; a raw KeyError from deep in a rollout says neither)."""
    reset = cls.reset

    @functools.wraps(reset)
    def named(self, **row: Any) -> Any:
        try:
            with bounds.inside():  # its calls of its own methods are plain calls
                return reset(self, **row)
        except Exception as exc:  # noqa: BLE001 - the user's class: its error, with where it happened
            raise InputError(
                f"environment: {cls.__name__}.reset failed on the row with prompt {shown(row.get('prompt'))}: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            ) from None

    return named


def shown(prompt: Any) -> str:
    """A prompt (text or messages) in a few characters, for a message."""
    text = (
        str(prompt[-1].get("content", ""))
        if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict)
        else str(prompt)
    )
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def factory(spec) -> Callable[[], Any]:
    """What `GRPOTrainer(environment_factory=...)` takes: a callable making one instance per rollout."""
    cls = get(spec.name)
    made = adapted(cls, spec.tool_timeout_s, spec.tool_max_chars)
    if trl_protocol(cls):
        if spec.args:
            raise InputError(
                f"environment.args: {spec.name} follows TRL's environment_factory protocol (made with no arguments); "
                "it takes no args"
            )
        return made
    return functools.partial(made, max_turns=spec.max_turns, **spec.args)
