"""The Prefect flow `regimen-cycle`: SFT → reward dry run → GRPO smoke → GRPO (+ eval, in rounds),
looping back to SFT when evaluation stalls. The work is in `stages/`; this file only orders it."""

from __future__ import annotations

import hashlib
from typing import Any

from prefect import flow, get_run_logger, task

from flows.publish import publish, publish_report
from stages.config import Recipe, load_recipe
from stages.cycle import BACK_TO_SFT, CONTINUE, REWARD_HACKING, Evaluation
from stages.errors import StageStopped
from stages.policy import base_policy, latest_policy
from stages.runner import StageResult, execute, stage_fingerprint
from stages.store import Store


def summary(result: StageResult) -> dict[str, Any]:
    m = result.manifest
    return {
        "stage": m["stage"], "version": m["version"], "cycle": m.get("cycle"), "round": m.get("round"),
        "reused": result.reused, "wall_s": round(result.wall_s, 3), "stage_wall_s": m.get("wall_s"),
        "metrics": m.get("metrics", {}), "verdict": m.get("verdict"), "decision": m.get("decision"), "warning": m.get("warning"),
        "resumed_from_step": m.get("resumed_from_step"), "path": str(result.path), "ref": result.ref,
    }


def stage_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    """Prefect's cache key for a stage is the store's fingerprint (scoped to the store and experiment),
    so a retried or re-triggered run shows finished stages as Cached in the UI."""
    key, _ = stage_fingerprint(parameters["stage"], parameters["recipe"], parameters["inputs"])
    scope = hashlib.sha256(f"{parameters['store_url']}|{parameters['recipe'].experiment}".encode()).hexdigest()[:12]
    return f"regimen-{parameters['stage']}-{scope}-{key}"


@task(name="stage", task_run_name="{stage} (cycle {cycle}, round {round})", cache_key_fn=stage_cache_key)
def run_stage(stage: str, recipe: Recipe, inputs: dict[str, Any], store_url: str, cycle: int = 1, round: int = 1) -> dict[str, Any]:
    """One stage through the store (reused by fingerprint, or run and committed), then its artifacts."""
    result = execute(stage, recipe, inputs, Store(store_url), cycle=cycle, round_=round)
    publish(result)
    get_run_logger().info("%s v%s %s in %.1fs", stage, result.manifest["version"], "reused" if result.reused else "ran", result.wall_s)
    return summary(result)


def stage(name: str, recipe: Recipe, inputs: dict[str, Any], st: Store, results: list[dict[str, Any]], cycle: int = 1, round: int = 0) -> dict[str, Any]:
    """Run `name` as a task; Prefect's cache may only answer for versions the store still holds."""
    in_store = st.find(recipe.experiment, name, stage_fingerprint(name, recipe, inputs)[0]) is not None
    state = run_stage.with_options(refresh_cache=not in_store)(name, recipe, inputs, st.url, cycle=cycle, round=round, return_state=True)
    out = state.result()
    if state.name == "Cached":
        out = {**out, "reused": True, "wall_s": 0.0}
    results.append(out)
    return out


def resolve_recipe(config: str, experiment: str | None, overrides: dict[str, Any] | None, store: str | None) -> Recipe:
    extra = dict(overrides or {})
    if experiment:
        extra["experiment"] = experiment
    if store:
        extra["store"] = store
    return load_recipe(config, extra)


@flow(name="regimen-cycle")
def regimen_cycle(
    config: str = "configs/default.yaml",
    experiment: str | None = None,
    overrides: dict[str, Any] | None = None,
    store: str | None = None,
) -> list[dict[str, Any]]:
    """Train a policy in cycles of SFT and GRPO from a recipe.

    Args:
        config: path of a YAML recipe in the project (e.g. configs/default.yaml).
        experiment: experiment name in the store (default: the recipe's `experiment`).
        overrides: dotted recipe keys to override, as `--set` takes them (e.g. {"grpo.beta": 0.05}).
        store: artifact store root, a folder or an fsspec URL (default: the recipe's `store`).
    """
    recipe = resolve_recipe(config, experiment, overrides, store)
    st = Store(recipe.store)
    results: list[dict[str, Any]] = []
    with st.lock(recipe.experiment):
        try:
            cycles(recipe, st, results)
        except StageStopped as exc:
            exc.results = results  # type: ignore[attr-defined]
            raise
        finally:
            if results:
                publish_report(st, recipe)
    return results


def cycles(recipe: Recipe, st: Store, results: list[dict[str, Any]]) -> None:
    """Cycle after cycle: SFT, its gates, then GRPO rounds each judged by an evaluation."""
    policy = (recipe.cycle.start_from == "latest" and latest_policy(st, recipe.experiment)) or base_policy(recipe, st)
    history: list[dict[str, Any]] = []
    for cycle in range(1, recipe.cycle.max_cycles + 1):
        sft = stage("sft", recipe, {"policy": policy, "cycle": cycle}, st, results, cycle)
        history.append(Evaluation(cycle, 0, sft["metrics"]["heldout_accuracy"]).__dict__)
        stage("reward-dry-run", recipe, {"policy": sft["ref"]}, st, results, cycle)
        stage("grpo-smoke", recipe, {"policy": sft["ref"]}, st, results, cycle)
        policy = sft["ref"]
        for round in range(1, recipe.cycle.max_rounds + 1):
            grpo = stage("grpo", recipe, {"policy": policy}, st, results, cycle, round)
            policy, g = grpo["ref"], grpo["metrics"]
            ev = stage("eval", recipe, {"policy": policy, "cycle": cycle, "round": round, "history": list(history),
                                        "train_reward": g.get("train_reward_last"), "train_reward_first": g.get("train_reward_first")},
                       st, results, cycle, round)
            history.append(Evaluation(cycle, round, ev["metrics"]["heldout_accuracy"], g.get("train_reward_last"), g.get("train_reward_first")).__dict__)
            if ev["verdict"] != CONTINUE:
                break
        if ev["verdict"] == REWARD_HACKING:
            raise StageStopped("eval", f"{REWARD_HACKING}: {ev['decision']['reason']} (trajectories: {ev['path']})")
        if ev["verdict"] != BACK_TO_SFT:
            return
