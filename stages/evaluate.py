"""Stage 5, eval: greedy held-out accuracy of a GRPO policy and each reward's held-out mean.

Evaluation measures; the flow decides. The fingerprint is the policy, the eval settings, the data and the
rewards, never the `cycle:` settings, so changing a target or a patience re-runs no evaluation: the flow
calls the pure `decide()` on the measurements and records the verdict beside them.
"""

from __future__ import annotations

from typing import Any

from regimen.stages.contract import StageOutput

NAME = "eval"
TRAINS = False
KEY_METRICS = ("heldout_accuracy",)


def config_section(recipe) -> dict[str, Any]:
    from regimen.stages.tasks.registry import identity

    return {
        "data": identity(recipe.data),
        "rewards": [r.model_dump(mode="json") for r in recipe.rewards],
        "eval": {**recipe.eval.model_dump(mode="json"), "max_new_tokens": recipe.max_new_tokens()},
        "dtype": recipe.model.dtype,
    }


def run(recipe, inputs: dict[str, Any], dirs) -> StageOutput:
    from regimen.stages.tasks.registry import load_task
    from regimen.stages.training import trajectories
    from regimen.stages.training.heldout import heldout_eval
    from regimen.stages.training.model import load_policy

    task = load_task(recipe.data)
    model, tokenizer = load_policy(inputs["policy"]["model"], recipe)
    metrics, rows = heldout_eval(model, tokenizer, recipe, task.heldout)
    trajectories.write(dirs.out, rows[: max(recipe.eval.trajectories, 1)])
    return StageOutput(metrics)
