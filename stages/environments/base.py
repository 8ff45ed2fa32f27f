"""The pieces every environment is made of (see the package docstring): `Environment`, the `tool`
decorator whose failures end an episode, `Episode`, and `register`."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_RESULT_CHARS = 2000
_REGISTRY: dict[str, type] = {}


@dataclass
class Episode:
    """One rollout's state: the row, every tool call (name, arguments, result or error), why it ended."""

    row: dict[str, Any]
    max_turns: int
    score: Callable[[str], float]
    calls: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None  # set when a tool failed: the episode ended with reward 0

    @property
    def over(self) -> bool:
        return self.failure is not None

    def reward(self, final_answer: str) -> float:
        if self.failure is not None:
            return 0.0
        value = float(self.score(final_answer))
        return value if math.isfinite(value) else 0.0

    def end(self, why: str) -> None:
        """End the episode from outside its tools (the turn limit reached by the trainer's loop)."""
        if self.failure is None:
            self.failure = why

    def record(self) -> dict[str, Any]:
        return {"calls": list(self.calls), "failure": self.failure, "turns": len(self.calls)}


def tool(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Make an environment method a tool whose failures end the episode (see the module docstring)."""

    @functools.wraps(fn)
    def call(self, *args: Any, **kwargs: Any) -> str:
        ep: Episode = self.episode
        entry: dict[str, Any] = {"tool": fn.__name__, "arguments": kwargs or list(args)}
        ep.calls.append(entry)
        if ep.over:
            entry["error"] = "the episode had ended"
            return f"error: the episode ended ({ep.failure})"
        if len(ep.calls) > ep.max_turns:
            ep.failure = entry["error"] = f"turn limit: more than {ep.max_turns} tool calls"
            return f"error: {ep.failure}"
        try:
            result = fn(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure of a tool ends the episode, never the stage
            ep.failure = entry["error"] = f"{fn.__name__} raised {type(exc).__name__}: {exc}"[:500]
            return f"error: {ep.failure}"
        if (
            isinstance(result, bool)
            or not isinstance(result, (str, int, float))
            or (isinstance(result, float) and not math.isfinite(result))
        ):
            ep.failure = entry["error"] = f"{fn.__name__} returned {type(result).__name__}, not text or a number"
            return f"error: {ep.failure}"
        text = str(result)
        if len(text) > MAX_RESULT_CHARS:
            ep.failure = entry["error"] = f"{fn.__name__} returned {len(text)} characters (at most {MAX_RESULT_CHARS})"
            return f"error: {ep.failure}"
        entry["result"] = text
        return text

    call.is_tool = True  # type: ignore[attr-defined]
    return call


class Environment:
    """Base of Regimen's environments. Subclasses define tools (methods decorated with `tool`), `_score`
    (the final answer's reward, given `self.episode.row`) and optionally `_observation` (text appended to
    the user's message at reset). `max_turns` comes from the recipe (`environment.max_turns`)."""

    max_turns = 4

    def __init__(self, max_turns: int | None = None):
        """Options from `environment.args` arrive as keyword arguments: a subclass that takes some declares
        them in its own `__init__` (an unknown one is a TypeError, refused at the door)."""
        self.max_turns = int(max_turns or self.max_turns)
        self.episode = Episode({}, self.max_turns, self._score)

    def reset(self, **row: Any) -> str | None:
        self.episode = Episode(dict(row), self.max_turns, self._score)
        return self._observation()

    def _observation(self) -> str | None:
        return None

    def _score(self, final_answer: str) -> float:
        raise NotImplementedError


def registered() -> dict[str, type]:
    """Name -> environment class, for `registry.py`."""
    return dict(_REGISTRY)


def register(name: str):
    def deco(cls: type) -> type:
        _REGISTRY[name] = cls
        cls.registered_as = name
        return cls

    return deco


def tools_of(instance: Any) -> list[Callable[..., Any]]:
    """The tools an instance exposes, as TRL finds them: public methods other than reset/get_reward."""
    return [
        getattr(instance, n)
        for n, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if n not in ("reset", "get_reward") and not n.startswith("_")
    ]
