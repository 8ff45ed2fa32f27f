"""The Prefect flow `regimen-cycle`: SFT → reward dry run → GRPO smoke → GRPO → eval (in rounds), looping
back to SFT when evaluation stalls. The work is in `regimen.stages`; this file only orders it, by the
stages' roles in the registry (teach, gate, train, judge), so a new stage needs no edit here.

Two entries run the same cycles: `regimen_cycle(config, experiment, overrides)` is what deployments and the
UI start (parameters checked against the allow-list in `boundary.py`, the recipe resolved once at the start
of the run); `regimen_cycle_recipe(recipe, experiment)` is what the CLI starts with the recipe it already
resolved. The experiment is data of the run (`Run.experiment`, handed to the runner in each `StageCall`),
chosen where the run starts: the caller's name, else the recipe's `experiment:` (its default).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, get_client, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.events import emit_event
from prefect.logging.loggers import flow_run_logger
from prefect.states import Cancelled, Completed, Failed

from regimen.flows.pipeline import champion
from regimen.flows.pipeline.publish import (
    Presenter,
    publish,
    publish_champion,
    publish_curves,
    publish_report,
    publish_stopped,
    publish_verdict,
)
from regimen.flows.pipeline.tracking import Trackers
from regimen.flows.serving import boundary, orchestrator
from regimen.stages import registry
from regimen.stages.core.errors import RegimenError, StageInterrupted, StageStopped
from regimen.stages.decide.verdicts import (
    BACK_TO_SFT,
    CONTINUE,
    OVERFITTING_VERDICT,
    REWARD_HACKING,
    Evaluation,
    decide,
)
from regimen.stages.recipe import Recipe, load_recipe
from regimen.stages.records import datasets as data_records
from regimen.stages.run import preflight as checks
from regimen.stages.run.runner import StageCall, StageResult, execute
from regimen.stages.store import Store, check_name
from regimen.stages.store.lock import lease_lost_here, machine_slot
from regimen.stages.store.retention import collect
from regimen.stages.tasks.registry import load_task
from regimen.stages.training import sampler
from regimen.stages.training.pass_rates import FILE as PASS_RATES
from regimen.stages.training.policy import base_policy, latest_policy

# one line per stage start and end (the CLI shows them; Prefect's log keeps them)
log = logging.getLogger("regimen.run")


@dataclass
class RunResult:
    """What a run did, as the flow's result: on Completed, and as the data of the Failed or Cancelled state
    a stopped or interrupted run ends in. The CLI reads its exit code and table from here."""

    results: list[dict[str, Any]] = field(default_factory=list)  # one summary per stage call, in order
    exit_code: int = 0  # 0 done, 1 a gate, the guard, a stage or the store stopped it, 2 bad input, 130/143 interrupted
    message: str | None = None  # why it stopped
    stage: str | None = None  # the stage that stopped it
    error: str | None = None  # the kind of stop: StageStopped, StageInterrupted, InputError, StoreError, ExperimentBusy


def summary(result: StageResult) -> dict[str, Any]:
    m = result.manifest
    return {
        "stage": m["stage"],
        "version": m["version"],
        "cycle": m.get("cycle"),
        "round": m.get("round"),
        "reused": result.reused,
        "wall_s": round(result.wall_s, 3),
        "wait_s": round(result.wait_s, 3),  # waiting for the machine's compute slot, apart from the work
        "stage_wall_s": m.get("wall_s"),
        "metrics": m.get("metrics", {}),
        "warning": m.get("warning") or m.get("guard_warning"),
        "finding": m.get("guard_finding"),
        "resumed_from_step": m.get("resumed_from_step"),
        "path": str(result.path),
        "ref": result.ref,
        "damaged": result.damaged,
    }


def key_figures(out: dict[str, Any]) -> str:
    metrics = out.get("metrics") or {}
    shown = [
        f"{k}={metrics[k]:.3g}" if isinstance(metrics[k], float) else f"{k}={metrics[k]}"
        for k in registry.get(out["stage"]).KEY_METRICS
        if k in metrics
    ]
    return ", ".join(shown)


@dataclass
class Run:
    """What the stages of one run share: one Store, one Presenter (publishing off the critical path), the
    experiment it runs, and the summaries of the stages so far."""

    store: Store
    presenter: Presenter
    experiment: str
    results: list[dict[str, Any]] = field(default_factory=list)
    heldout: dict[str, Any] | None = None  # the experiment's frozen held-out set: an input of every stage
    data: dict[str, Any] = field(default_factory=dict)  # tonight's training data next to its last version
    started_from: dict[str, Any] | None = None  # the policy cycle 1 started from
    challenger: tuple[dict[str, Any], dict[str, Any]] | None = None  # (policy, its evaluation): the last one measured
    trackers: Any = None  # `tracking:` (flows/pipeline/tracking.py): the run mirrored into MLflow, trackio, ...


@task(name="stage", task_run_name="{stage} (cycle {cycle}, round {round})", cache_policy=NO_CACHE, persist_result=False)
def run_stage(stage: str, recipe: Recipe, inputs: dict[str, Any], run: Run, cycle: int = 1, round: int = 1):
    """One stage through the store: the runner reuses an intact version with the stage's fingerprint (the
    one place that decides reuse; the task run then ends as *Cached*) or runs the stage and commits it;
    then its artifacts. A stage that computes holds this machine's compute slot, so two runs take turns."""
    logger = get_run_logger()
    store, experiment = run.store, run.experiment

    trackers = run.trackers
    key = trackers.start(stage, cycle, round, _prefect_tags()) if trackers else None

    def progress(event: str, data: dict[str, Any]) -> None:  # the probe curve, live in the UI while GRPO trains
        if event == "log" and trackers:  # the Trainer's log entries, live in the trackers
            trackers.log(key, data["entry"], data["step"])
        if event == "probe":
            run.presenter.submit_latest(
                "curves",
                publish_curves,
                experiment,
                {f"{stage} (running, cycle {cycle}.{round})": data["log_history"]},
                store.experiment_dir(experiment, "plots") / "grpo_running.png",
                f"{stage} cycle {cycle}.{round}: training reward and held-out probe, step {data['step']}",
                key="curves",
            )

    try:
        result = execute(
            StageCall(
                stage,
                recipe,
                inputs,
                experiment,
                cycle=cycle,
                round=round,
                slot=lambda: machine_slot(f"{experiment}/{stage}", say=logger.warning),
                progress=progress,
            ),
            store,
        )
    except BaseException as exc:
        if trackers:
            trackers.finish(key, {}, "", failed=f"{type(exc).__name__}: {exc}")
        raise
    run.presenter.submit(publish, result, store)
    out = summary(result)
    if trackers:
        where = store.join(experiment, stage, f"v{result.manifest['version']}")
        trackers.finish(key, {**out, "fingerprint": result.manifest.get("fingerprint")}, where)
        out["tracker"] = trackers.links(key)
    return Completed(name="Cached", data=out) if result.reused else out  # how Prefect names a reused result in the UI


def stage(
    name: str, recipe: Recipe, inputs: dict[str, Any], run: Run, cycle: int = 1, round: int = 0
) -> dict[str, Any]:
    """Run `name` as a task and add its summary to the run's results."""
    where = f"cycle {cycle}" + (f", round {round}" if round else "") if cycle else "the champion"
    if run.heldout is not None:
        inputs = {**inputs, "heldout": run.heldout}
    log.info("%s (%s) ...", name, where)
    out = run_stage(name, recipe, inputs, run, cycle=cycle, round=round, return_state=True).result()
    log.info(
        "%s v%s %s in %.1fs%s%s",
        name,
        out["version"],
        "reused" if out["reused"] else "ran",
        out["wall_s"],
        f" (after waiting {out['wait_s']:.1f}s for the machine's compute slot)" if out.get("wait_s", 0) >= 0.1 else "",
        f": {figures}" if (figures := key_figures(out)) else "",
    )
    run.results.append(out)
    return out


@task(
    name="verdict", task_run_name="verdict (cycle {cycle}, round {round})", cache_policy=NO_CACHE, persist_result=False
)
def record_verdict(
    run: Run, recipe: Recipe, history: list[dict[str, Any]], eval_result: dict[str, Any], cycle: int, round: int
) -> dict[str, Any]:
    """Evaluation measures; the flow decides: the pure decision on the history, kept beside the evaluation."""
    decision = decide([Evaluation.from_dict(e) for e in history], recipe.cycle).as_dict()
    record = {
        "eval_version": eval_result["version"],
        "eval_fingerprint": eval_result["ref"]["fingerprint"],
        "cycle": cycle,
        "round": round,
        "cycle_settings": recipe.cycle.model_dump(mode="json"),
        "history": history,
        **decision,
    }
    run.store.record_decision(run.experiment, record)
    if run.trackers:
        run.trackers.verdict(record, step=len(history))
    run.presenter.submit(publish_verdict, run.experiment, record, eval_result["path"])
    return record


def _refuse_when_tampered(flow, flow_run, state) -> None:
    """Prefect's on-failure and on-crashed hook: a run that failed or crashed before the flow's body ran (its
    parameters did not fit the flow: a parameter schema opened through the API lets the server accept
    them, and Prefect's engine then stops the run process before the flow's first line; serve's runner
    calls this hook when it reports the crash) is refused like any run of a tampered deployment: the
    reason as its state's message, the tampered event, a line in the log. A run the body already refused,
    or one that failed or crashed for another reason, is left as it is."""
    if state.name == boundary.REFUSED:  # the body refused it (serve's runner calls the hook too, with that state)
        return
    refused = boundary.check_deployment(flow_run.deployment_id)
    if not refused:
        return

    flow_run_logger(flow_run, flow).error("refused: %s", refused)
    _tampered_event(refused, flow_run)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run.id, Failed(name=boundary.REFUSED, message=f"refused: {refused}"), force=True)


@flow(
    name="regimen-cycle", persist_result=False, on_failure=[_refuse_when_tampered], on_crashed=[_refuse_when_tampered]
)
def regimen_cycle(config: str = "default.yaml", experiment: str | None = None, overrides: dict[str, Any] | None = None):
    """Train a policy in cycles of SFT and GRPO from a recipe.

    Args:
        config: a recipe in the project's configs folder, by name or relative path (e.g. default.yaml).
        experiment: experiment name in the store (default: the recipe's `experiment`).
        overrides: training hyperparameters to override, as dotted keys (e.g. {"grpo.beta": 0.08});
            keys that choose code or places are refused unless the operator allowed them.
    """
    if refused := boundary.check_deployment():  # a deployment changed through the API since serve registered it
        get_run_logger().error("refused: %s", refused)
        _tampered_event(refused)
        return Failed(name=boundary.REFUSED, message=f"refused: {refused}")
    return run_cycles(resolve_ui_recipe(config, overrides), experiment)


def resolve_ui_recipe(config: Any, overrides: Any) -> Recipe:
    """The door of a run started from the UI or the API: the overrides against the allow-list, then the
    operator's limits (after them: `limits.*` is the operator's), then the recipe resolved and bounded."""
    extra = dict(boundary.check_overrides(overrides))
    extra.update(boundary.operator_limits())
    if os.environ.get("REGIMEN_STORE") and "store" not in extra:
        extra["store"] = os.environ["REGIMEN_STORE"]
    return load_recipe(boundary.resolve_config(config), extra)


def _tampered_event(reason: str, run=None) -> None:
    """`regimen.deployment.tampered`, for an operator's automation (Prefect's event feed keeps it)."""
    run = run or FlowRunContext.get().flow_run
    emit_event(
        event="regimen.deployment.tampered",
        resource={"prefect.resource.id": f"prefect.deployment.{run.deployment_id}"},
        related=[{"prefect.resource.id": f"prefect.flow-run.{run.id}", "prefect.resource.role": "flow-run"}],
        payload={"reason": reason},
    )


@flow(name="regimen-cycle", validate_parameters=False, persist_result=False)
def regimen_cycle_recipe(recipe: Recipe, experiment: str | None = None):
    """The same cycles for a recipe the caller (the CLI) has already resolved."""
    return run_cycles(recipe, experiment)


@task(name="preflight", cache_policy=NO_CACHE, persist_result=False)
def preflight(recipe: Recipe) -> dict[str, Any]:
    """Data and rewards checked before anything trains or anything is written (`stages/run/preflight.py`)."""
    summary = checks.check(recipe)
    summary["doors"] = registry.doors(recipe)  # the stages' own (distill: the teacher resolves, same tokenizer)
    return summary


def run_cycles(recipe: Recipe, experiment: str | None = None):
    """The cycles of `experiment` (None: the recipe's `experiment:`) under its lock, with one Store for the
    whole run. Returns a RunResult; a run that a gate, the guard, a stage or the store stopped ends as
    Failed, an interrupted one (Ctrl-C, SIGTERM, a cancel) as Cancelled, each with its message and the
    RunResult as the state's data."""
    with orchestrator.watching():
        outcome = _run_cycles(recipe, experiment or recipe.experiment)
    if getattr(outcome, "type", None) is not None and _taken_over(experiment or recipe.experiment):
        from prefect.exceptions import Abort

        log.warning(
            "this host lost the experiment's lease (it was paused or cut off) and another host took the run over: "
            "nothing of this attempt was committed, and the run's state is the other host's"
        )
        raise Abort("the run was taken over by another host; this attempt leaves its state alone")
    result = outcome.data if hasattr(outcome, "data") and isinstance(outcome.data, RunResult) else outcome
    if isinstance(result, RunResult):
        orchestrator.finish(result)
    return outcome


def _taken_over(experiment: str) -> bool:
    """Whether this attempt lost the experiment's lease and the flow run is another attempt's now: the server's run
    count moved past ours (a lost host's run scheduled again and started elsewhere), or its state is final while we
    still run. Such an attempt must not write the run's final state (Failed over the other host's Completed)."""
    if not lease_lost_here(experiment):
        return False
    try:
        from prefect import get_client
        from prefect.runtime import flow_run

        if not flow_run.id:
            return False
        with get_client(sync_client=True) as client:
            now = client.read_flow_run(flow_run.id)
        return (now.run_count or 0) > (flow_run.run_count or 0) or bool(now.state and now.state.is_final())
    except Exception:  # noqa: BLE001 - the API cannot tell: end as this attempt did
        return False


def _run_cycles(recipe: Recipe, experiment: str):
    results: list[dict[str, Any]] = []
    presenter = Presenter()
    try:
        check_name(experiment)  # a deployment's parameter: bad input (exit 2) before anything runs
        preflight(recipe)
        run = Run(Store(recipe.store), presenter, experiment, results)
        with run.store.lock(experiment), _tracked(recipe, run):
            try:
                prepare_data(recipe, run)
                cycles(recipe, run)
                crown(recipe, run, stopped=None)
                retain(recipe, run)
            except StageStopped as exc:
                verdict = (getattr(exc, "finding", None) or {}).get("verdict")  # the guard's finding, as data
                if exc.stage in registry.in_role("train") and verdict:
                    presenter.submit(_publish_stopped, experiment, run.store, exc)
                crown(recipe, run, stopped=verdict or exc.stage)
                raise
            finally:
                if results:
                    presenter.submit(publish_report, run.store, recipe, experiment)
                interrupted = isinstance(sys.exc_info()[1], StageInterrupted)  # a person asked to stop: not long
                # what is still queued is published before the run ends
                presenter.close(patience=5.0 if interrupted else None)
    except StageInterrupted as exc:
        return Cancelled(
            message=str(exc), data=RunResult(results, exc.exit_code, str(exc), exc.stage, type(exc).__name__)
        )
    except RegimenError as exc:  # a gate, the guard, a stage, the store, the lock; bad input found at preflight
        return Failed(
            message=str(exc),
            data=RunResult(results, exc.exit_code, str(exc), getattr(exc, "stage", None), type(exc).__name__),
        )
    finally:
        presenter.close(patience=5.0)  # closed above unless the run stopped before taking the lock
    return RunResult(results)


@contextlib.contextmanager
def _tracked(recipe: Recipe, run: Run):
    """The run's trackers, open while it runs (`tracking:`), closed as it ends (failed or not)."""
    run.trackers = Trackers.open(recipe, run.experiment, run.store, _prefect_tags().get("prefect.flow_run_id"))
    if run.trackers:
        from regimen.flows.pipeline.publish import publish_trackers

        run.presenter.submit(publish_trackers, run.experiment, run.trackers.group, run.trackers.links())
    failed = True
    try:
        yield
        failed = False
    finally:
        if run.trackers:
            run.trackers.close(failed)


def _prefect_tags() -> dict[str, str]:
    """The Prefect flow run this runs in, for the trackers' runs (a link back to the UI)."""
    try:
        from prefect.runtime import flow_run

        return {"prefect.flow_run_id": str(flow_run.id)} if flow_run.id else {}
    except Exception:  # noqa: BLE001 - no Prefect context: nothing to link
        return {}


def retain(recipe: Recipe, run: Run) -> None:
    """`store.keep`: the operator's retention after the run, under its lease (`stages/store/retention.py`). A gc
    that fails says so and leaves the run's result as it is."""
    if recipe.keep is None:
        return

    try:
        done = collect(
            run.store, run.experiment, last=recipe.keep.last, days=recipe.keep.days, champions=recipe.keep.champions
        )
    except RegimenError as exc:
        log.warning("retention (store.keep) did not run: %s", exc)
        return
    if done["remove"]:
        log.info(
            "retention (store.keep): removed %d version(s), %.3g MB freed", len(done["remove"]), done["freed"] / 1e6
        )


def _publish_stopped(experiment: str, st: Store, exc: StageStopped) -> None:
    failures = st.failures(experiment, exc.stage)
    attempt = None
    if failures:
        attempt = str(Path(st.stage_path(experiment, exc.stage)) / "failed")
        found = sorted(Path(attempt).glob("*/trajectories.jsonl"))
        attempt = str(found[-1].parent) if found else None
    publish_stopped(experiment, exc.stage, exc.reason, attempt)


def teach(recipe: Recipe, policy: dict[str, Any], run: Run, cycle: int) -> tuple[dict[str, Any], float]:
    """The cycle's starting policy and its held-out accuracy (the cycle's baseline): the teach stages that
    apply (SFT where the recipe has a teacher, distillation where it has `distill:`), each from the one
    before, else the judge on the policy as it is."""
    teaching = [name for name in registry.in_role("teach") if registry.applies(name, recipe)]
    if teaching:
        for name in teaching:
            out = stage(name, recipe, {"policy": policy, "cycle": cycle}, run, cycle)
            policy = out["ref"]
        return policy, out["metrics"]["heldout_accuracy"]
    base = stage(registry.judge(), recipe, {"policy": policy}, run, cycle, 0)
    return policy, base["metrics"]["heldout_accuracy"]


def gates(recipe: Recipe, policy: dict[str, Any], run: Run, cycle: int) -> dict[str, Any] | None:
    """Every gate on the policy, in order; a gate that fails stops the flow (StageStopped). Returns the
    last gate's result that measured per-prompt pass rates (the dry run's), for the curriculum."""
    seen = None
    for name in registry.in_role("gate"):
        out = stage(name, recipe, {"policy": policy}, run, cycle)
        if (Path(out["ref"]["path"]) / PASS_RATES).is_file():
            seen = out["ref"]
    return seen


def train_round(
    recipe: Recipe, policy: dict[str, Any], run: Run, cycle: int, round: int, seen: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The train stages of one round, each from the previous one's policy; the last one's result. With the
    curriculum on, `seen` (the dry run's or the round before's pass rates) is where it starts."""
    for name in registry.in_role("train"):
        reads = seen is not None and sampler.reads_pass_rates(recipe)  # GRPO's sampler says what it reads
        inputs = {"policy": policy, **({"pass_rates": seen} if reads else {})}
        out = stage(name, recipe, inputs, run, cycle, round)
        policy = out["ref"]
    return out


def prepare_data(recipe: Recipe, run: Run) -> None:
    """The experiment's frozen held-out set (frozen now on its first run) and tonight's training data next
    to its last version (`stages/records/datasets.py`)."""
    run.heldout, frozen_now = data_records.resolve(run.store, run.experiment, load_task(recipe.data).heldout)
    task = load_task(recipe.data, run.heldout)
    run.data = data_records.record_training_data(run.store, run.experiment, task.train, task.dropped_heldout)
    d = run.data
    log.info(
        "data: %d training rows (%d new since data v%s%s%s); held-out set v%d, %d prompts%s",
        d["rows"],
        d["new"],
        d["version"] - 1 if d["changed"] else d["version"],
        f", {d['gone']} gone" if d["gone"] else "",
        f", {d['dropped_heldout']} dropped as held-out prompts" if d["dropped_heldout"] else "",
        run.heldout["version"],
        run.heldout.get("rows") or 0,
        " (frozen now: the experiment's first run)" if frozen_now else "",
    )


def starting_policy(recipe: Recipe, run: Run) -> dict[str, Any]:
    """Cycle 1's policy, by `cycle.start_from`: the champion (or, on the data it was trained on, what it was
    trained from: the same training again), the latest good policy, or the base model."""
    st = run.store
    if recipe.cycle.start_from == "champion":
        found = champion.start_policy(st, run.experiment, _data_digest(run))
        if found and found.get("stage") == "base":
            return base_policy(recipe, st)
        if found:
            return found
    if recipe.cycle.start_from == "latest":
        found = latest_policy(st, run.experiment, registry.judge(), registry.in_role("train"))
        if found:
            return found
    return base_policy(recipe, st)


def _data_digest(run: Run) -> str | None:
    """Tonight's training rows, by content (the data version's fingerprint)."""
    return run.data.get("digest")


def crown(recipe: Recipe, run: Run, stopped: str | None) -> None:
    """The challenger against the champion, decided and recorded (`flows/pipeline/champion.py`); then its artifact
    and event. Never the run's failure: a problem here is a warning."""
    if run.heldout is None:
        return
    measured = champion.measured(run.challenger[0], run.challenger[1], run.heldout) if run.challenger else None
    try:
        line = champion.conclude(
            run.store,
            recipe,
            run.experiment,
            challenger=measured,
            stopped=stopped,
            trained_from=run.started_from,
            data_digest=_data_digest(run),
            champion_eval=lambda policy: stage(registry.judge(), recipe, {"policy": policy}, run, 0, 0),
        )
    except RegimenError as exc:
        if stopped:
            log.warning("champion: not decided (%s)", exc)
            return
        raise
    run.presenter.submit(publish_champion, run.experiment, champion.record(run.store, run.experiment), line)
    if run.trackers and line.get("event") == "promoted":
        from regimen.flows.pipeline.tracking import champion_move

        if move := champion_move(run.store, run.experiment, line):
            run.trackers.champion(move)


def cycles(recipe: Recipe, run: Run) -> None:
    """Cycle after cycle: the teach stages (where a teacher exists), the gates, then training rounds each
    measured by the judge. Which stage plays which role is the registry's (`stages/registry.py`)."""
    policy = run.started_from = starting_policy(recipe, run)
    history: list[dict[str, Any]] = []
    for cycle in range(1, recipe.cycle.max_cycles + 1):
        policy, baseline = teach(recipe, policy, run, cycle)
        history.append(Evaluation(cycle, 0, baseline).__dict__)
        if recipe.cycle.stop_when_taught and baseline >= recipe.cycle.target:
            # the cycle's start already meets the target: GRPO has nothing left to add. Measured by the judge
            # like any challenger (the champion's comparison needs its per-prompt outcomes), and recorded.
            log.info(
                "held-out accuracy %.3f before GRPO already meets the target %.3f: no GRPO round this cycle",
                baseline,
                recipe.cycle.target,
            )
            ev = stage(registry.judge(), recipe, {"policy": policy}, run, cycle, 0)
            if ev["metrics"]["heldout_accuracy"] >= recipe.cycle.target:
                run.challenger = (policy, ev)
                verdict = record_verdict(run, recipe, list(history), ev, cycle, 0)
                ev.update(verdict=verdict["verdict"], decision=verdict)
                return
        seen = gates(recipe, policy, run, cycle)
        for round in range(1, recipe.cycle.max_rounds + 1):
            trained = train_round(recipe, policy, run, cycle, round, seen)
            policy, g = trained["ref"], trained["metrics"]
            seen = policy
            ev = stage(registry.judge(), recipe, {"policy": policy}, run, cycle, round)
            run.challenger = (policy, ev)
            history.append(
                Evaluation(
                    cycle,
                    round,
                    ev["metrics"]["heldout_accuracy"],
                    g.get("train_reward_last"),
                    g.get("train_reward_first"),
                    trained.get("finding"),
                ).__dict__
            )
            verdict = record_verdict(run, recipe, list(history), ev, cycle, round)
            ev.update(verdict=verdict["verdict"], decision=verdict)
            if verdict["verdict"] != CONTINUE:
                break
        if verdict["verdict"] in (REWARD_HACKING, OVERFITTING_VERDICT):
            raise StageStopped(
                registry.judge(),
                f"{verdict['verdict']}: {verdict['reason']} (trajectories: {ev['path']})",
                {**verdict["evidence"], "step": None, "verdict": verdict["verdict"]},
            )
        if verdict["verdict"] != BACK_TO_SFT:
            return
