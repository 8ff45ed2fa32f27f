"""Stage 5, eval: greedy held-out accuracy of a GRPO policy and each reward's held-out mean.

Evaluation measures; the flow decides. The fingerprint is the policy, the eval settings, the data and the
rewards, never the `cycle:` settings, so changing a target or a patience re-runs no evaluation: the flow
calls the pure `decide()` on the measurements and records the verdict beside them.
"""

from __future__ import annotations

from typing import Any

from regimen.stages.core.contract import StageOutput
from regimen.stages.decide.reading import flag_counts, flags
from regimen.stages.rewards import identity as rewards_identity
from regimen.stages.tasks.registry import identity, load_task
from regimen.stages.training import trajectories
from regimen.stages.training.heldout import heldout_eval, spread
from regimen.stages.training.model import load_policy
from regimen.stages.training.pass_rates import PassRates, row_id

NAME = "eval"
ROLE = "judge"
TRAINS = False
KEY_METRICS = ("heldout_accuracy", "heldout_accuracy_unprobed")
HELDOUT_FILE = "heldout.jsonl"


def config_section(recipe, inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """With a frozen held-out set among the inputs, the training data is not part of what evaluation
    measures (the set enters through the inputs): a champion's evaluation is reused night after night
    while the training data grows."""
    return {
        "data": {"task": recipe.data.task} if (inputs or {}).get("heldout") else identity(recipe.data),
        "rewards": rewards_identity(recipe.rewards),
        "eval": {**recipe.eval.model_dump(mode="json"), "max_new_tokens": recipe.max_new_tokens()},
        "dtype": recipe.model.dtype,
        "probe_rows": {"prompts": recipe.probe.prompts, "used": recipe.probe.steps > 0},
    }


def run(recipe, inputs: dict[str, Any], dirs) -> StageOutput:
    task = load_task(recipe.data, inputs.get("heldout"))
    model, tokenizer = load_policy(inputs["policy"]["model"], recipe)
    metrics, rows = heldout_eval(model, tokenizer, recipe, task.heldout)
    if recipe.probe.steps > 0:  # the probe picked the kept checkpoint on some held-out prompts: also report the rest
        import json

        from regimen.stages.training.probe import probe_rows

        probed = {
            json.dumps(r["prompt"], sort_keys=True)
            for r in probe_rows(task.heldout, recipe.probe.prompts, recipe.data.seed)
        }
        rest = [
            t["correct"]
            for t, r in zip(rows, task.heldout)
            if json.dumps(r["prompt"], sort_keys=True) not in probed and t["correct"] is not None
        ]
        if rest:
            metrics["heldout_accuracy_unprobed"] = sum(rest) / len(rest)
            metrics["heldout_unprobed_size"] = float(len(rest))

    trajectories.write(dirs.out, [rows[i] for i in spread(task.heldout, max(recipe.eval.trajectories, 1))])

    flagged = flags(rows)  # what looks like a hack, each with its reason
    metrics.update({f"flags/{k}": float(v) for k, v in flag_counts(flagged).items()})
    # every held-out row (prompt id, completion, each reward, the task's verdict, its flags): `regimen trajectories`
    # compares two evaluations row for row
    trajectories.write(dirs.out / HELDOUT_FILE, [{**t, "flags": f} for t, f in zip(rows, flagged)])

    # each held-out prompt's outcome, in the set's order: the champion's comparison is paired over these
    (dirs.out / "correct.json").write_text(json.dumps([t["correct"] for t in rows]))

    rates = PassRates()  # one greedy attempt per held-out prompt: solved or not
    for t, r in zip(rows, task.heldout):
        if t["correct"] is not None:
            rates.add_group(row_id(r), [float(t["correct"])], 0, "evaluate")
    rates.write(dirs.out)
    return StageOutput(metrics)
