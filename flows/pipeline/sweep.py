"""The Prefect flow `regimen-sweep`: one SFT and its gates (dry run, smoke test), then one GRPO+eval per
value of one field."""

from __future__ import annotations

import time
from contextlib import closing
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from regimen.flows.pipeline.cycle import Run, gates, preflight, stage, train_round
from regimen.flows.pipeline.publish import Presenter, artifact_key
from regimen.flows.present.comparison import comparison
from regimen.flows.present.plots import data_uri, read_log
from regimen.stages import registry
from regimen.stages.recipe import Recipe
from regimen.stages.store import Store, check_name
from regimen.stages.training.policy import base_policy


@flow(name="regimen-sweep", validate_parameters=False)
def regimen_sweep(
    recipe: Recipe, field: str, values: list[Any], variants: list[Recipe], experiment: str | None = None
) -> dict[str, Any]:
    """Compare values of one recipe field (e.g. grpo.num_generations=[2, 8, 16]) from the same SFT policy, in
    `experiment` (data of the run, as for the cycle; None: the recipe's `experiment:`)."""
    preflight(recipe)
    st = Store(recipe.store)
    experiment = check_name(experiment or recipe.experiment)
    run = Run(st, Presenter(), experiment)
    results = run.results
    rows, logs = [], {}
    with st.lock(experiment), closing(run.presenter):
        policy = base_policy(recipe, st)
        for name in registry.in_role("teach"):
            if registry.applies(name, recipe):
                policy = stage(name, recipe, {"policy": policy, "cycle": 1}, run)["ref"]
        gates(recipe, policy, run, 1)
        for value, r in zip(values, variants):
            t0 = time.perf_counter()
            grpo = train_round(r, policy, run, 1, 1)
            g = grpo["metrics"]
            ev = stage(registry.judge(), r, {"policy": grpo["ref"]}, run, 1, 1)
            per_step = r.grpo_value("per_device_train_batch_size") * r.num_processes()
            rows.append(
                {
                    field: value,
                    "heldout_accuracy": ev["metrics"]["heldout_accuracy"],
                    "train_reward_mean": g.get("train_reward_mean"),
                    "frac_reward_zero_std_mean": g.get("frac_reward_zero_std_mean"),
                    "prompts_per_step": per_step // r.grpo_value("num_generations"),
                    "completions_per_step": per_step,
                    "grpo_wall_s": grpo["stage_wall_s"],
                    "grpo_reused": grpo["reused"],
                    "wall_s": time.perf_counter() - t0,
                    "grpo_version": grpo["version"],
                }
            )
            logs[str(value)] = read_log(Path(grpo["path"]) / "train_log.jsonl")
    completions = {row["completions_per_step"] for row in rows}
    note = (
        f"Per-step compute is held fixed: {'/'.join(map(str, sorted(completions)))} completions per GRPO step for "
        f"every value "
        f"(prompts per step = completions / num_generations); SFT and its gates (dry run, smoke test with the base "
        f"recipe) are shared."
    )
    tag = f"{field}={'_'.join(map(str, values))}".replace("/", "-")
    files = comparison(rows, field, st.experiment_dir(experiment, "sweeps", tag), logs, note)
    markdown = files["md"].read_text().replace("](sweep.png)", f"]({data_uri(files['png'])})")
    create_markdown_artifact(markdown=markdown, key=artifact_key(experiment, "sweep", field), description=note)
    return {
        "field": field,
        "rows": rows,
        "note": note,
        "files": {k: str(v) for k, v in files.items()},
        "results": results,
    }
