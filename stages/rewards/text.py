"""Text rewards: `answer` (exact match after normalisation), `format` (a pattern the completion must
match) and the gameable-on-purpose `digits`."""

from __future__ import annotations

import math
import re
from typing import Any

from regimen.stages.core.errors import InputError
from regimen.stages.rewards.registry import RewardFn, completion_text, register, register_factory

_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def normalize_answer(text: Any) -> str | float | None:
    """Strip, unify whitespace and case; numbers become floats so `85`, ` 85.0` and `+85` agree."""
    if text is None:
        return None
    s = " ".join(str(text).strip().split())
    if not s:
        return None
    candidate = s.replace(",", "") if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", s) else s
    if _NUMBER.match(candidate):
        value = float(candidate)
        return value if math.isfinite(value) else None
    return s.lower()


def first_line(text: str) -> str:
    """The answer a model commits to: its first non-empty line (later lines are rambling)."""
    for line in text.strip().splitlines():
        if line.strip():
            return line
    return ""


@register("answer")
def answer(prompts: list[Any], completions: list[Any], answer: list[Any] | None = None, **_: Any) -> list[float | None]:
    """1.0 when the completion's first line equals the `answer` column after normalisation
    (numbers compared as numbers), else 0.0; None when the reference is missing or empty."""
    refs = answer if answer is not None else [None] * len(completions)
    scores: list[float | None] = []
    for completion, ref in zip(completions, refs):
        want = normalize_answer(ref)
        if want is None:
            scores.append(None)
            continue
        got = normalize_answer(first_line(completion_text(completion)))
        scores.append(1.0 if got is not None and got == want else 0.0)
    return scores


def format_reward(pattern: str = r"[^\n]+", *, name: str = "format") -> RewardFn:
    """An easy reward: 1.0 when the whole (stripped) completion matches `pattern`, else 0.0.
    It gives a struggling policy some signal beside a hard correctness reward; alone it is gameable."""
    try:
        regex = re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise InputError(f"rewards: format pattern {pattern!r} is not a valid regular expression: {exc}") from None

    def fmt(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
        return [1.0 if regex.fullmatch(completion_text(c).strip()) else 0.0 for c in completions]

    fmt.__name__ = name
    fmt.gameable = False  # type: ignore[attr-defined]
    return fmt


@register("format")
def format_(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
    """Default format check: the completion is a single line of text (no rambling past one line).
    Recipes usually configure their own pattern: `{name: format, pattern: '^\\d+$'}`."""
    return format_reward(r"[^\n]+")(prompts, completions, **columns)


register_factory("format", format_reward)


@register("digits", gameable=True)
def digits(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
    """GAMEABLE ON PURPOSE: pays 1.0 for any digits-shaped answer, right or wrong. It is the
    arithmetic task's version of `code_block`: a training curve that climbs to its ceiling while
    held-out accuracy does not move. Use it to see the reward-hacking guard fire, never to train."""
    return [1.0 if re.fullmatch(r"\d+", first_line(completion_text(c)).strip()) else 0.0 for c in completions]


ENVIRONMENT_REWARDS: dict[type, Any] = {}
"""A TRL-protocol environment class (as adapted for GRPO) -> its own `get_reward` (`environments/registry.py`)."""


@register("get_reward")
def get_reward_(
    prompts: list[Any], completions: list[Any], environments: list[Any] | None = None, **_: Any
) -> list[float | None]:
    """A TRL-protocol environment's own reward: its `get_reward()` after the episode, as TRL calls it. None without
    environments, or for an environment that has no `get_reward`."""
    if environments is None:
        return [None] * len(completions)
    out: list[float | None] = []
    for env in environments:
        own = ENVIRONMENT_REWARDS.get(type(env))
        out.append(None if own is None else _a_number(type(env).__name__, own(env)))
    return out


def _a_number(cls: str, value: Any) -> float | None:
    """`get_reward()`'s value as TRL takes it: a real number (int or float, not a bool) or None. A string such as
    "1.0" is refused rather than parsed: TRL would put it in a tensor and fail later, far from the class."""
    if value is None:
        return None
    numeric = isinstance(value, (int, float)) or (
        hasattr(value, "__float__") and type(value).__module__ in ("numpy", "torch")
    )
    if isinstance(value, bool) or not numeric:
        raise InputError(
            f"environment: {cls}.get_reward() returned {type(value).__name__} {str(value)[:40]!r}; it must return a "
            "number (int or float) or None"
        )
    return float(value)


@register("episode")
def episode(
    prompts: list[Any], completions: list[Any], environments: list[Any] | None = None, **_: Any
) -> list[float | None]:
    """An environment's episode reward (`environment:` recipes): the environment judges the final assistant
    message, and a tool failure or the turn limit makes it 0 (`stages/environments`). None without an
    environment (a recipe without one has no episodes to judge)."""
    if environments is None:
        return [None] * len(completions)
    out: list[float | None] = []
    for env, c in zip(environments, completions):
        if failed := trainer_tool_error(c):  # a call the trainer's loop could not make (no such tool, bad arguments)
            env.episode.end(f"tool call failed: {failed}")
        answer_text = final_answer(c)
        if answer_text is None:  # the episode ended on a tool call: the turn limit, no answer
            env.episode.end("turn limit: the episode ended on a tool call, without an answer")
            out.append(0.0)
        else:
            out.append(env.episode.reward(answer_text))
    return out


def trainer_tool_error(completion: Any) -> str | None:
    """A tool message that is TRL's own error for a call it could not make (`{'error': ...}`), if any: an
    environment's tools answer `error: ...` themselves, and have ended the episode already."""
    if isinstance(completion, list):
        for m in completion:
            if isinstance(m, dict) and m.get("role") == "tool" and str(m.get("content", "")).startswith("{'error': "):
                return str(m["content"])[:300]
    return None


def final_answer(completion: Any) -> str | None:
    """The last assistant message's text of a multi-turn completion (a plain completion as it is); None
    when the episode ended on a tool call (the turn limit): there is no answer."""
    if isinstance(completion, list):
        last = next((m for m in reversed(completion) if isinstance(m, dict) and m.get("role") == "assistant"), None)
        if last is None or last.get("tool_calls"):
            return None
        return str(last.get("content") or "")
    return completion_text(completion)
