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
