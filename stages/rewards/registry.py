"""The reward registry: rewards with TRL's signature registered by name (or given by dotted path), their
checks, and weighted combination.

A reward is `f(prompts, completions, **columns) -> list[float | None]`: dataset columns arrive as
keyword arguments, exactly as `trl.GRPOTrainer` passes them, so any function here can be handed to
TRL unchanged. `None` means "this reward has no opinion on this sample" (e.g. the reference answer is
missing); TRL ignores it in the weighted sum, and Regimen never turns it into a free 1.0.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

from regimen.stages.core.errors import InputError

RewardFn = Callable[..., list[float | None]]

_REGISTRY: dict[str, RewardFn] = {}
# Builders of configured variants, for rewards that take options in the recipe (`args:`).
_FACTORIES: dict[str, Callable[..., RewardFn]] = {}


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
        parts = [
            m.get("content", "")
            for m in completion
            if isinstance(m, dict) and m.get("role", "assistant") == "assistant"
        ]
        return "".join(str(p) for p in parts)
    return str(completion)


def known_rewards() -> list[str]:
    return sorted(_REGISTRY)


def get_reward(name: str, **options: Any) -> RewardFn:
    """Resolve a reward by registry name or by dotted path `package.module:function`.
    `options` configure rewards that take them (`format` takes `pattern`)."""
    if ":" in name:
        if options:
            raise InputError(
                f"rewards: {name!r}: options (args/pattern) are for built-in rewards; configure your own function in "
                f"code"
            )
        module_name, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise InputError(f"rewards: cannot load reward {name!r}: {exc}") from None
        if not callable(fn):
            raise InputError(f"rewards: {name!r} is not callable")
        if isinstance(
            fn, type
        ):  # a reward class: one instance per use (training's, the audit's), made without arguments
            try:
                fn = fn()
            except Exception as exc:  # noqa: BLE001 - the user's constructor: its error, named
                raise InputError(
                    f"rewards: {name!r} is a class; it is made with no arguments, which failed: {type(exc).__name__}: "
                    f"{exc}"
                ) from None
            if not callable(fn):
                raise InputError(f"rewards: {name!r} is a class whose instances are not callable (no __call__)")
        return fn
    if name not in _REGISTRY:
        raise InputError(
            f"rewards: unknown reward {name!r}; known: {', '.join(sorted(_REGISTRY))}, or a dotted path "
            f"'pkg.module:function'"
        )
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


def check_values(name: str, values: Any, n: int) -> list[float | None]:
    """A reward's output as Regimen and TRL need it: one real number or None per completion. Anything
    else (NaN, infinity, a string, a wrong length) is an InputError naming the reward, the row and the value."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise InputError(
            f"reward {name!r} returned {type(values).__name__}, not a list of numbers (one per completion)"
        )
    if len(values) != n:
        raise InputError(f"reward {name!r} returned {len(values)} values for {n} completions")
    out: list[float | None] = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            and not (hasattr(v, "__float__") and type(v).__module__ in ("numpy", "torch"))
        ):
            raise InputError(
                f"reward {name!r}: row {i}: returned {v!r} ({type(v).__name__}); a reward returns a real number or None"
            )
        f = float(v)
        if not math.isfinite(f):
            raise InputError(
                f"reward {name!r}: row {i}: returned {f}; a reward returns a finite number or None (no opinion)"
            )
        out.append(f)
    return out


def is_chat(prompt: Any) -> bool:
    """A conversational prompt, as TRL's `is_conversational` reads one: a list of messages with roles."""
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(m, dict) and "role" in m for m in prompt)


def trl_shaped(prompts: list[Any], completions: list[Any]) -> list[Any]:
    """Completions as TRL's GRPOTrainer hands them to rewards: text after a text prompt; after a chat prompt, a list of
    messages starting with the assistant's (`[{"role": "assistant", "content": ...}]`; an episode's turns as they
    are)."""
    return [
        [{"role": "assistant", "content": c}] if isinstance(c, str) and is_chat(p) else c
        for p, c in zip(prompts, completions)
    ]


def _no_log(*args: Any, **kwargs: Any) -> None:
    """`log_extra` / `log_metric` outside training: TRL's own hooks log to the training run; here nothing is running."""


@functools.cache
def _fresh_state():
    from transformers import TrainerState

    return TrainerState()


def trl_kwargs(columns: dict[str, list[Any]]) -> dict[str, Any]:
    """The keywords TRL 1.16's GRPOTrainer passes a reward beside prompts and completions: every dataset column but
    prompt, completion and completion_ids, `trainer_state` (a fresh `TrainerState` outside training: step 0),
    `log_extra` and `log_metric` (no-ops outside training), `completion_ids` and `environments` where the caller has
    them (the columns hold them)."""
    out = {k: v for k, v in columns.items() if k not in ("prompt", "completion")}
    out.setdefault("trainer_state", _fresh_state())
    out.setdefault("log_extra", _no_log)
    out.setdefault("log_metric", _no_log)
    return out


def score(
    fns: dict[str, RewardFn], prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]]
) -> dict[str, list[float | None]]:
    """Run each reward over a batch as TRL's GRPOTrainer calls it (`trl_shaped` completions, `trl_kwargs`); each must
    return one real number or None per completion."""
    out: dict[str, list[float | None]] = {}
    shaped, kwargs = trl_shaped(prompts, completions), trl_kwargs(columns)
    for name, fn in fns.items():
        try:
            values = fn(prompts=prompts, completions=shaped, **kwargs)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - a reward's own bug: name it
            raise InputError(f"reward {name!r} raised {type(exc).__name__}: {exc}") from None
        out[name] = check_values(name, values, len(completions))
    return out


def preflight(
    fns: dict[str, RewardFn],
    rows: list[dict[str, Any]],
    completions: list[Any],
    extra: dict[str, list[Any]] | None = None,
) -> dict[str, list[float | None]]:
    """Call every reward on a few rows before anything trains, so a broken one is named now (reward, row,
    value), not after SFT. `completions` are the task's reference answers where it has them; `extra`: columns the
    caller has beside the rows' (an environment's instances, reset on each row)."""
    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("prompt", "completion")}
    return score(fns, [r["prompt"] for r in rows], completions, {**columns, **(extra or {})})


def from_specs(specs) -> dict[str, RewardFn]:
    """The recipe's `rewards` list as {report name: function}, in order."""
    fns: dict[str, RewardFn] = {}
    for spec in specs:
        key = spec.key
        if key in fns:
            raise InputError(f"rewards: {key!r} is listed twice")
        fns[key] = get_reward(spec.name, **spec.options())
    return fns


def identity(specs) -> list[dict[str, Any]]:
    """The recipe's rewards as they enter fingerprints: each spec, and for a reward given by dotted path
    the digest of the file it is defined in (the built-in ones are covered by the stages' code version),
    so editing your own reward reruns what it scored."""
    out = []
    for spec in specs:
        item = spec.model_dump(mode="json", by_alias=True)
        if item.get("as") is None:  # unset: as before `as` existed (fingerprints of existing recipes unchanged)
            item.pop("as", None)
        if ":" in spec.name:
            import inspect

            from regimen.stages.core.fingerprint import file_digest

            fn = get_reward(spec.name)
            try:
                item["source_sha256"] = file_digest(
                    inspect.getsourcefile(fn if inspect.isroutine(fn) else type(fn)) or ""
                )
            except (TypeError, OSError):
                item["source_sha256"] = None
        out.append(item)
    return out


def error_counts(fns: dict[str, RewardFn]) -> dict[str, int]:
    """How many completions each guarded reward has scored 0 because its scorer raised (so far, in this process):
    a reward that counts them keeps `counts = {"errors": n}` (reasoning_gym)."""
    return {name: int(fn.counts["errors"]) for name, fn in fns.items() if isinstance(getattr(fn, "counts", None), dict)}


def check_specs(specs) -> list[str]:
    """Resolve the recipe's rewards (names, dotted paths, options) and return their report names."""
    return list(from_specs(specs))


def gameable_names(fns: dict[str, RewardFn]) -> list[str]:
    return [name for name, fn in fns.items() if is_gameable(fn)]


GAMEABLE_WARNING = (
    "WARNING: reward(s) {names} are gameable on purpose: they pay for the shape of an answer, not its "
    "correctness. Expect the training reward to climb while held-out quality does not."
)
