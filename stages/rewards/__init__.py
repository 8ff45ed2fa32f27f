"""Rewards: plain functions with TRL's signature `f(prompts, completions, **columns) -> list[float | None]`,
registered by name, each with a weight in the recipe (0: a monitor, logged and never trained on).

- `registry.py`: `register`, `get_reward`, `from_specs`, `score` (checks each value);
- `scoring.py`: the one place that says what a completion earns (weighted total) and whether it is correct;
- `text.py`: `answer`, `format`, and the gameable-on-purpose `digits`;
- `reasoning_gym.py`: `reasoning_gym`, each row scored by its reasoning-gym task's own scorer, guarded;
- `code.py`: `unit_tests` (judged in the sandbox, `sandbox/`: the tests run in a judge process apart from the solution)
  and the gameable-on-purpose `code_block`;
- `audit.py`: the reward audit the dry run and `regimen reward-check` run (made-up completions that a
  gameable reward pays);
- `regimen reward-check` (a reward's dry run on sample text) is a command: `regimen.flows.cli.reward_check`.

Adding a reward: write the function in a module here (or anywhere: `pkg.module:function` in a recipe)
and decorate it with `@register("name")`; importing this package registers the built-in ones.
"""

from regimen.stages.rewards import code, reasoning_gym, text  # noqa: F401  (their import registers the built-in rewards)
from regimen.stages.rewards.registry import (  # noqa: F401
    GAMEABLE_WARNING,
    RewardFn,
    check_specs,
    check_values,
    completion_text,
    from_specs,
    gameable_names,
    get_reward,
    identity,
    is_gameable,
    known_rewards,
    preflight,
    register,
    register_factory,
    score,
)
from regimen.stages.rewards.scoring import (  # noqa: F401
    PASS,
    Scorer,
    Scores,
    as_trained,
    columns,
    exact_correct,
    passes,
    weighted_total,
)
from regimen.stages.rewards.text import answer, digits, first_line, format_reward, normalize_answer  # noqa: F401
