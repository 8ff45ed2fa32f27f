"""Reward functions with TRL's signature, a registry by name, and weighted combination.

A reward is `f(prompts, completions, **columns) -> list[float | None]`: dataset columns arrive as
keyword arguments, exactly as `trl.GRPOTrainer` passes them, so any function here can be handed to
TRL unchanged. `None` means "this reward has no opinion on this sample" (e.g. the reference answer is
missing); TRL ignores it in the weighted sum, and Regimen never turns it into a free 1.0.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from stages.errors import InputError

RewardFn = Callable[..., list[float | None]]

_REGISTRY: dict[str, RewardFn] = {}
# Builders of configured variants, for rewards that take options in the recipe (`args:`).
_FACTORIES: dict[str, Callable[..., RewardFn]] = {}
# Modules whose import registers more built-in rewards (kept out of this module so that plain
# answer/format scoring never imports the code sandbox).
_BUILTIN_MODULES = ("stages.code_rewards",)


def register(name: str, *, gameable: bool = False) -> Callable[[RewardFn], RewardFn]:
    """Register a reward under `name`. `gameable=True` marks a reward that pays for form, not
    substance: every run that uses one says so in its output."""

    def deco(fn: RewardFn) -> RewardFn:
        fn.__name__ = name  # TRL logs rewards by __name__: rewards/<name>/mean
        fn.gameable = gameable  # type: ignore[attr-defined]
        _REGISTRY[name] = fn
        return fn

    return deco


def register_factory(name: str, factory: Callable[..., RewardFn]) -> None:
    """Let recipes configure reward `name`: `{name: ..., args: {...}}` calls `factory(**args)`."""
    _FACTORIES[name] = factory


def completion_text(completion: Any) -> str:
    """The text of a completion, whether plain text or chat (a list of messages)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    if isinstance(completion, Sequence):
        parts = [m.get("content", "") for m in completion if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
        return "".join(str(p) for p in parts)
    return str(completion)


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


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def known_rewards() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_reward(name: str, **options: Any) -> RewardFn:
    """Resolve a reward by registry name or by dotted path `package.module:function`.
    `options` configure rewards that take them (`format` takes `pattern`)."""
    if ":" in name:
        if options:
            raise InputError(f"rewards: {name!r}: options (args/pattern) are for built-in rewards; configure your own function in code")
        module_name, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise InputError(f"rewards: cannot load reward {name!r}: {exc}") from None
        if not callable(fn):
            raise InputError(f"rewards: {name!r} is not callable")
        return fn
    _load_builtins()
    if name not in _REGISTRY:
        raise InputError(f"rewards: unknown reward {name!r}; known: {', '.join(sorted(_REGISTRY))}, or a dotted path 'pkg.module:function'")
    if not options:
        return _REGISTRY[name]
    if name not in _FACTORIES:
        raise InputError(f"rewards: reward {name!r} takes no options (got {', '.join(options)})")
    try:
        return _FACTORIES[name](**options)
    except TypeError as exc:
        raise InputError(f"rewards: bad options for {name!r}: {exc}") from None


def is_gameable(fn: RewardFn) -> bool:
    return bool(getattr(fn, "gameable", False))


def weighted_total(per_reward: dict[str, list[float | None]], weights: dict[str, float]) -> list[float]:
    """A weighted sum over the rewards that scored the sample (None is skipped, as TRL's nansum does).
    Unlike TRL, which gives 0.0 to a sample no reward scored, this gives NaN so such samples are left
    out of the dry run's statistics instead of posing as failures."""
    names = list(per_reward)
    n = len(per_reward[names[0]]) if names else 0
    totals: list[float] = []
    for i in range(n):
        vals = [(per_reward[k][i], weights[k]) for k in names]
        scored = [(v, w) for v, w in vals if v is not None]
        totals.append(sum(v * w for v, w in scored) if scored else float("nan"))
    return totals


def score(fns: dict[str, RewardFn], prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]]) -> dict[str, list[float | None]]:
    """Run each reward over a batch; each must return one value per completion."""
    out: dict[str, list[float | None]] = {}
    for name, fn in fns.items():
        values = fn(prompts=prompts, completions=completions, **columns)
        if values is None or len(values) != len(completions):
            raise ValueError(f"reward {name!r} returned {0 if values is None else len(values)} values for {len(completions)} completions")
        out[name] = [None if v is None else float(v) for v in values]
    return out


def from_specs(specs) -> dict[str, RewardFn]:
    """The recipe's `rewards` list as {report name: function}, in order."""
    fns: dict[str, RewardFn] = {}
    for spec in specs:
        key = spec.name.rsplit(":", 1)[-1]
        if key in fns:
            raise InputError(f"rewards: {key!r} is listed twice")
        fns[key] = get_reward(spec.name, **spec.options())
    return fns


def gameable_names(fns: dict[str, RewardFn]) -> list[str]:
    return [name for name, fn in fns.items() if is_gameable(fn)]


GAMEABLE_WARNING = (
    "WARNING: reward(s) {names} are gameable on purpose: they pay for the shape of an answer, not its "
    "correctness. Expect the training reward to climb while held-out quality does not."
)
