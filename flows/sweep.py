"""The Prefect flow `regimen-sweep`: one SFT and dry run, then one GRPO+eval per value of one field."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow
from prefect.artifacts import create_link_artifact, create_markdown_artifact

from flows.cycle import resolve_recipe, stage
from flows.publish import artifact_key
from stages.cycle import Evaluation
from stages.plots import read_log
from stages.policy import base_policy
from stages.store import Store
from stages.sweep import comparison, variant


@flow(name="regimen-sweep")
def regimen_sweep(config: str, field: str, values: list[Any], experiment: str | None = None,
                  overrides: dict[str, Any] | None = None, store: str | None = None) -> dict[str, Any]:
    """Compare values of one recipe field (e.g. grpo.num_generations=[2, 8, 16]) from the same SFT policy."""
    recipe = resolve_recipe(config, experiment, overrides, store)
    variants = [variant(recipe, field, v) for v in values]  # all validated before anything runs
    st = Store(recipe.store)
    results: list[dict[str, Any]] = []
    rows, logs = [], {}
    with st.lock(recipe.experiment):
        sft = stage("sft", recipe, {"policy": base_policy(recipe, st), "cycle": 1}, st, results)
        stage("reward-dry-run", recipe, {"policy": sft["ref"]}, st, results)
        baseline = [Evaluation(1, 0, sft["metrics"]["heldout_accuracy"]).__dict__]
        for value, r in zip(values, variants):
            t0 = time.perf_counter()
            grpo = stage("grpo", r, {"policy": sft["ref"]}, st, results, 1, 1)
            g = grpo["metrics"]
            ev = stage("eval", r, {"policy": grpo["ref"], "cycle": 1, "round": 1, "history": baseline,
                                   "train_reward": g.get("train_reward_last"), "train_reward_first": g.get("train_reward_first")}, st, results, 1, 1)
            gs = r.grpo_settings()
            rows.append({field: value, "heldout_accuracy": ev["metrics"]["heldout_accuracy"], "train_reward_mean": g.get("train_reward_mean"),
                         "frac_reward_zero_std_mean": g.get("frac_reward_zero_std_mean"),
                         "prompts_per_step": gs["per_device_train_batch_size"] * r.num_processes() // gs["num_generations"],
                         "completions_per_step": gs["per_device_train_batch_size"] * r.num_processes(),
                         "grpo_wall_s": grpo["stage_wall_s"], "grpo_reused": grpo["reused"],
                         "wall_s": time.perf_counter() - t0, "grpo_version": grpo["version"], "verdict": ev["verdict"]})
            logs[str(value)] = read_log(st.local_path(st.find(recipe.experiment, "grpo", grpo["ref"]["fingerprint"])) / "train_log.jsonl")
    completions = {row["completions_per_step"] for row in rows}
    note = (f"Per-step compute is held fixed: {'/'.join(map(str, sorted(completions)))} completions per GRPO step for every value "
            f"(prompts per step = completions / num_generations); SFT and the dry run are shared (sft v{sft['version']}).")
    tag = f"{field}={'_'.join(map(str, values))}".replace("/", "-")
    files = comparison(rows, field, st.cache / recipe.experiment / "sweeps" / tag, logs, note)
    create_markdown_artifact(markdown=files["md"].read_text(), key=artifact_key(recipe.experiment, "sweep", field), description=note)
    create_link_artifact(link=files["png"].resolve().as_uri(), link_text="sweep.png", key=artifact_key(recipe.experiment, "sweep", field, "plot"))
    return {"field": field, "rows": rows, "note": note, "files": {k: str(v) for k, v in files.items()}, "results": results}
