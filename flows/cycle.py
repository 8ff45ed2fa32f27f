"""The Prefect flow `regimen-cycle`: SFT → reward dry run → GRPO smoke → GRPO → eval (in rounds), looping
back to SFT when evaluation stalls. The work is in `regimen.stages`; this file only orders it, by the
stages' roles in the registry (teach, gate, train, judge), so a new stage needs no edit here.

Two entries run the same cycles: `regimen_cycle(config, experiment, overrides)` is what deployments and the
UI start (parameters checked against the allow-list in `boundary.py`, the recipe resolved once at the start
of the run); `regimen_cycle_recipe(recipe)` is what the CLI starts with the recipe it already resolved.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task

from regimen.flows.publish import publish, publish_curves, publish_report, publish_stopped, publish_verdict
from regimen.stages import registry
from regimen.stages.cycle import BACK_TO_SFT, CONTINUE, REWARD_HACKING, Evaluation, decide
from regimen.stages.errors import StageInterrupted, StageStopped
from regimen.stages.recipe import Recipe, load_recipe
from regimen.stages.runner import StageResult, execute, stage_key
from regimen.stages.store import Store
from regimen.stages.store.lock import machine_slot
from regimen.stages.training.policy import base_policy, latest_policy


def summary(result: StageResult) -> dict[str, Any]:
    m = result.manifest
    return {
        "stage": m["stage"], "version": m["version"], "cycle": m.get("cycle"), "round": m.get("round"),
        "reused": result.reused, "wall_s": round(result.wall_s, 3), "stage_wall_s": m.get("wall_s"),
        "metrics": m.get("metrics", {}), "warning": m.get("warning") or m.get("guard_warning"),
        "resumed_from_step": m.get("resumed_from_step"), "path": str(result.path), "ref": result.ref,
        "damaged": result.damaged,
    }


def stage_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    """Prefect's cache key for a stage is the store's fingerprint (scoped to the store and experiment),
    so a retried or re-triggered run shows finished stages as Cached in the UI."""
    store = Store(parameters["store_url"])
    where = store.root if store.local else store.url  # two checkouts' `artifacts` folders are two stores
    scope = hashlib.sha256(f"{where}|{parameters['recipe'].experiment}".encode()).hexdigest()[:12]
    return f"regimen-{parameters['stage']}-{scope}-{parameters['key']}"


@task(name="stage", task_run_name="{stage} (cycle {cycle}, round {round})", cache_key_fn=stage_cache_key)
def run_stage(stage: str, recipe: Recipe, inputs: dict[str, Any], store_url: str, key: str, section: dict[str, Any],
              cycle: int = 1, round: int = 1) -> dict[str, Any]:
    """One stage through the store (reused by fingerprint, or run and committed), then its artifacts.
    A stage that computes holds this machine's compute slot, so two runs take turns."""
    logger = get_run_logger()
    st = Store(store_url)

    def progress(event: str, data: dict[str, Any]) -> None:  # the probe curve, live in the UI while GRPO trains
        if event == "probe":
            publish_curves(recipe.experiment, {f"{stage} (running, cycle {cycle}.{round})": data["log_history"]},
                           st.experiment_dir(recipe.experiment, "plots") / "grpo_running.png",
                           f"{stage} cycle {cycle}.{round}: training reward and held-out probe, step {data['step']}", key="curves")

    result = execute(stage, recipe, inputs, st, key=(key, section), cycle=cycle, round_=round,
                     slot=lambda: machine_slot(f"{recipe.experiment}/{stage}", say=logger.warning), progress=progress)
    publish(result, st)
    logger.info("%s v%s %s in %.1fs", stage, result.manifest["version"], "reused" if result.reused else "ran", result.wall_s)
    return summary(result)


def stage(name: str, recipe: Recipe, inputs: dict[str, Any], st: Store, results: list[dict[str, Any]], cycle: int = 1, round: int = 0) -> dict[str, Any]:
    """Run `name` as a task; Prefect's cache may only answer for versions the store still holds intact."""
    key, section = stage_key(name, recipe, inputs)  # once per stage call
    in_store = st.find_intact(recipe.experiment, name, key)[0] is not None
    state = run_stage.with_options(refresh_cache=not in_store)(name, recipe, inputs, st.url, key, section, cycle=cycle, round=round, return_state=True)
    out = state.result()
    if state.name == "Cached":
        out = {**out, "reused": True, "wall_s": 0.0}
    results.append(out)
    return out


@task(name="verdict", task_run_name="verdict (cycle {cycle}, round {round})")
def record_verdict(store_url: str, recipe: Recipe, history: list[dict[str, Any]], eval_result: dict[str, Any], cycle: int, round: int) -> dict[str, Any]:
    """Evaluation measures; the flow decides: the pure decision on the history, kept beside the evaluation."""
    decision = decide([Evaluation.from_dict(e) for e in history], recipe.cycle).as_dict()
    record = {"eval_version": eval_result["version"], "eval_fingerprint": eval_result["ref"]["fingerprint"], "cycle": cycle, "round": round,
              "cycle_settings": recipe.cycle.model_dump(mode="json"), "history": history, **decision}
    Store(store_url).record_decision(recipe.experiment, record)
    publish_verdict(recipe.experiment, record, eval_result["path"])
    return record


@flow(name="regimen-cycle")
def regimen_cycle(config: str = "default.yaml", experiment: str | None = None, overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Train a policy in cycles of SFT and GRPO from a recipe.

    Args:
        config: a recipe in the project's configs folder, by name or relative path (e.g. default.yaml).
        experiment: experiment name in the store (default: the recipe's `experiment`).
        overrides: training hyperparameters to override, as dotted keys (e.g. {"grpo.beta": 0.08});
            keys that choose code or places are refused unless the operator allowed them.
    """
    from regimen.flows import boundary

    extra = dict(boundary.check_overrides(overrides))
    if experiment is not None:
        extra["experiment"] = experiment
    if os.environ.get("REGIMEN_STORE") and "store" not in extra:
        extra["store"] = os.environ["REGIMEN_STORE"]
    recipe = load_recipe(boundary.resolve_config(config), extra)
    return run_cycles(recipe)


@flow(name="regimen-cycle", validate_parameters=False)
def regimen_cycle_recipe(recipe: Recipe) -> list[dict[str, Any]]:
    """The same cycles for a recipe the caller (the CLI) has already resolved."""
    return run_cycles(recipe)


LAST_RESULTS: list[dict[str, Any]] = []  # what the last run in this process did (the CLI prints it after an interruption)


@task(name="preflight")
def preflight(recipe: Recipe) -> dict[str, Any]:
    """Data and rewards checked before anything trains or anything is written (`stages/preflight.py`)."""
    from regimen.stages import preflight as checks

    return checks.check(recipe)


def run_cycles(recipe: Recipe):
    """The cycles under the experiment's lock. An interruption (Ctrl-C, SIGTERM, a cancel) ends the run
    as Cancelled in Prefect, with what was interrupted and how a rerun resumes as its message."""
    from prefect.states import Cancelled

    preflight(recipe)
    st = Store(recipe.store)
    results: list[dict[str, Any]] = []
    LAST_RESULTS[:] = []
    with st.lock(recipe.experiment):
        try:
            cycles(recipe, st, results)
        except StageInterrupted as exc:
            LAST_RESULTS[:] = results
            return Cancelled(message=f"{exc} [exit {exc.exit_code}]")
        except StageStopped as exc:
            exc.results = results  # type: ignore[attr-defined]
            if exc.stage in registry.in_role("train") and str(exc.reason).startswith(REWARD_HACKING):
                _publish_stopped(recipe, st, exc)
            raise
        finally:
            LAST_RESULTS[:] = results
            if results:
                try:
                    publish_report(st, recipe)
                except Exception as exc:  # noqa: BLE001 - a report is never worth hiding the run's own outcome
                    get_run_logger().warning("could not publish the report: %s", exc)
    return results


def _publish_stopped(recipe: Recipe, st: Store, exc: StageStopped) -> None:
    failures = st.failures(recipe.experiment, exc.stage)
    attempt = None
    if failures:
        attempt = str(Path(st.stage_path(recipe.experiment, exc.stage)) / "failed")
        found = sorted(Path(attempt).glob("*/trajectories.jsonl"))
        attempt = str(found[-1].parent) if found else None
    publish_stopped(recipe.experiment, exc.stage, exc.reason, attempt)


def teach(recipe: Recipe, policy: dict[str, Any], st: Store, results: list[dict[str, Any]], cycle: int) -> tuple[dict[str, Any], float]:
    """The cycle's starting policy and its held-out accuracy (the cycle's baseline): the teach stages
    where the recipe has a teacher, else the judge on the policy as it is."""
    if recipe.trains_sft() and registry.in_role("teach"):
        for name in registry.in_role("teach"):
            out = stage(name, recipe, {"policy": policy, "cycle": cycle}, st, results, cycle)
            policy = out["ref"]
        return policy, out["metrics"]["heldout_accuracy"]
    base = stage(registry.judge(), recipe, {"policy": policy}, st, results, cycle, 0)
    return policy, base["metrics"]["heldout_accuracy"]


def gates(recipe: Recipe, policy: dict[str, Any], st: Store, results: list[dict[str, Any]], cycle: int) -> None:
    """Every gate on the policy, in order; a gate that fails stops the flow (StageStopped)."""
    for name in registry.in_role("gate"):
        stage(name, recipe, {"policy": policy}, st, results, cycle)


def train_round(recipe: Recipe, policy: dict[str, Any], st: Store, results: list[dict[str, Any]], cycle: int, round: int) -> dict[str, Any]:
    """The train stages of one round, each from the previous one's policy; the last one's result."""
    for name in registry.in_role("train"):
        out = stage(name, recipe, {"policy": policy}, st, results, cycle, round)
        policy = out["ref"]
    return out


def cycles(recipe: Recipe, st: Store, results: list[dict[str, Any]]) -> None:
    """Cycle after cycle: the teach stages (where a teacher exists), the gates, then training rounds each
    measured by the judge. Which stage plays which role is the registry's (`stages/registry.py`)."""
    latest = recipe.cycle.start_from == "latest" and latest_policy(st, recipe.experiment, registry.judge(), registry.in_role("train"))
    policy = latest or base_policy(recipe, st)
    history: list[dict[str, Any]] = []
    for cycle in range(1, recipe.cycle.max_cycles + 1):
        policy, baseline = teach(recipe, policy, st, results, cycle)
        history.append(Evaluation(cycle, 0, baseline).__dict__)
        gates(recipe, policy, st, results, cycle)
        for round in range(1, recipe.cycle.max_rounds + 1):
            trained = train_round(recipe, policy, st, results, cycle, round)
            policy, g = trained["ref"], trained["metrics"]
            ev = stage(registry.judge(), recipe, {"policy": policy}, st, results, cycle, round)
            history.append(Evaluation(cycle, round, ev["metrics"]["heldout_accuracy"], g.get("train_reward_last"), g.get("train_reward_first")).__dict__)
            verdict = record_verdict(st.url, recipe, list(history), ev, cycle, round)
            ev.update(verdict=verdict["verdict"], decision=verdict)
            if verdict["verdict"] != CONTINUE:
                break
        if verdict["verdict"] == REWARD_HACKING:
            raise StageStopped(registry.judge(), f"{REWARD_HACKING}: {verdict['reason']} (trajectories: {ev['path']})")
        if verdict["verdict"] != BACK_TO_SFT:
            return
