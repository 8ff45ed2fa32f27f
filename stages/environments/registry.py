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
from regimen.stages.environments import code, probe  # noqa: F401 - they register themselves
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


@functools.cache
def adapted(cls: type) -> type:
    """A TRL-protocol class as GRPO gets it: the same class, with `get_reward` hidden from TRL's look-up (the
    recipe's `get_reward` reward calls it instead, through `rewards.text.ENVIRONMENT_REWARDS`)."""
    own = getattr(cls, "get_reward", None)
    if not callable(own):
        return cls
    made = type(cls.__name__, (cls,), {"get_reward": None, "__module__": cls.__module__, "__doc__": cls.__doc__})
    ENVIRONMENT_REWARDS[made] = own
    return made


def factory(spec) -> Callable[[], Any]:
    """What `GRPOTrainer(environment_factory=...)` takes: a callable making one instance per rollout."""
    cls = get(spec.name)
    if trl_protocol(cls):
        if spec.args:
            raise InputError(
                f"environment.args: {spec.name} follows TRL's environment_factory protocol (made with no arguments); "
                "it takes no args"
            )
        return adapted(cls)
    return functools.partial(cls, max_turns=spec.max_turns, **spec.args)
