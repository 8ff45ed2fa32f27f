"""Rewards that misbehave on purpose, for the tests of the reward checks (given by dotted path)."""

import math


def nan_reward(prompts, completions, **_):
    return [math.nan for _ in completions]


def none_reward(prompts, completions, **_):
    return [None for _ in completions]


def string_reward(prompts, completions, **_):
    return ["1.0" for _ in completions]


def short_reward(prompts, completions, **_):
    return [1.0]


def raising_reward(prompts, completions, **_):
    raise ZeroDivisionError("the reward's own bug")


def inf_reward(prompts, completions, **_):
    return [0.0] * (len(completions) - 1) + [math.inf]


def string_in_training(prompts, completions, **_):
    """Numbers at the preflight and the dry run; a string once a Trainer calls it (a bug that shows late)."""
    import inspect

    training = any("trainer" in (frame.filename or "").lower() for frame in inspect.stack(0))
    return ["0.5" if training else 0.5 for _ in completions]


def reference_anywhere(prompts, completions, answer=None, **_):
    """Gameable on purpose: 1.0 whenever the reference appears anywhere in the completion."""
    return [None if a is None else float(str(a) in c) for c, a in zip(completions, answer or [None] * len(completions))]


def pays_empty(prompts, completions, answer=None, **_):
    """Gameable on purpose: the right answer pays 1.0, an empty completion pays 0.5, anything else 0."""
    return [1.0 if c.strip() == str(a) else 0.5 if not c.strip() else 0.0 for c, a in zip(completions, answer)]


def length_parity(prompts, completions, **_):
    """Pays 1.0 for a completion of even length: a signal with variance for any policy (tests of the plumbing)."""
    return [float(len(str(c)) % 2 == 0) for c in completions]
