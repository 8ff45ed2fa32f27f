"""`regimen run`, `check`, `sweep`, `status` and `report`: a recipe through the flow, and what the store holds."""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

import typer
from rich.table import Table

from regimen.flows.cli.app import ExperimentOpt, SetOpt, StoreOpt, app, console, err
from regimen.flows.present.fmt import num
from regimen.stages.core.errors import InputError, RegimenError


def summary_table(results: list[dict[str, Any]]) -> Table:
    from regimen.stages import registry

    table = Table(title="regimen run", show_lines=False)
    waited = any(r.get("wait_s", 0) >= 0.1 for r in results)
    for col in ("stage", "version", "cycle", "", "wall s", *(("wait s",) if waited else ()), "key metrics"):
        table.add_column(col)
    for r in results:
        metrics = r.get("metrics") or {}
        keys = [k for k in registry.get(r["stage"]).KEY_METRICS if k in metrics]
        if "heldout_accuracy" in keys:  # a mixture's tasks and the curriculum's levels, each on its own
            keys += [k for k in metrics if k.startswith("heldout_accuracy/")]
        keys += [k for k in metrics if k.startswith("rewards/") and k.endswith("/errors") and metrics[k]]
        shown = ", ".join(f"{k}={num(metrics[k])}" for k in keys)
        if r.get("resumed_from_step"):
            shown += f", resumed_from_step={r['resumed_from_step']}"
        if r.get("verdict"):
            shown += f", verdict={r['verdict']}"
        if r.get("damaged"):
            shown += f", damaged versions not reused: {', '.join('v' + str(d['version']) for d in r['damaged'])}"
        where = f"{r.get('cycle')}" + (f".{r['round']}" if r.get("round") else "")
        wait = (f"{r.get('wait_s', 0):.1f}",) if waited else ()
        how = "reused" if r["reused"] else "ran"
        table.add_row(r["stage"], f"v{r['version']}", where, how, f"{r['wall_s']:.1f}", *wait, shown)
    return table


def _print_run(outcome, started: float) -> None:
    """The run's table and timings. A run that stopped early (a gate, the guard, an interruption) has not
    run the stage that stopped it, so no overhead ratio is claimed."""
    results = outcome.results
    if not results:
        return
    console.print(summary_table(results))
    for warning in dict.fromkeys(r["warning"] for r in results if r.get("warning")):
        console.print(f"[bold yellow]{warning}[/]")
    total = time.perf_counter() - started
    stages = sum(r["wall_s"] for r in results)
    reused = sum(1 for r in results if r["reused"])
    if outcome.exit_code:
        console.print(
            f"wall time {total:.1f}s; the {len(results)} stage(s) that finished took {stages:.1f}s"
            + (f" ({reused} reused)" if reused else "")
        )
    elif reused < len(results):
        waited = sum(r.get("wait_s", 0) for r in results)
        console.print(
            f"wall time {total:.1f}s; stages {stages:.1f}s"
            + (f"; waited {waited:.1f}s for this machine's compute slot" if waited >= 0.1 else "")
            + f"; fixed cost {total - stages - waited:.1f}s (wall minus the stages' own time"
            + (" and the wait)" if waited >= 0.1 else ")")
        )
    else:
        console.print(f"wall time {total:.1f}s; every stage reused (nothing changed)")
    last_eval = next((r for r in reversed(results) if r.get("decision")), None)
    if last_eval:
        console.print(f"verdict: [bold]{last_eval['verdict']}[/] — {last_eval['decision']['reason']}")


def resolve(config: str, set_: list[str] | None, store: str | None, data: dict | None = None):
    """The recipe, validated and resolved once (exit 2 on bad input); `data` is its YAML when the command read it
    already (parsed once). The experiment is not part of it: the commands hand it to the flow as data of the run."""
    from regimen.stages.recipe import load_recipe, parse_set

    overrides = parse_set(set_ or [])
    if store:
        overrides["store"] = store
    return load_recipe(config, overrides, data=data)


VerboseOpt = Annotated[
    bool,
    typer.Option("--verbose", "-v", help="show everything the libraries print (Prefect's log keeps it either way)"),
]


@app.command()
def run(
    config: Annotated[str, typer.Argument(help="YAML recipe, e.g. configs/default.yaml")],
    set_: SetOpt = None,
    store: StoreOpt = None,
    experiment: ExperimentOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run the flow `regimen-cycle` over the recipe's stages and print a summary."""
    started = time.perf_counter()
    from regimen.stages.recipe import parse_set, read_yaml

    parse_set(set_ or [])
    data = read_yaml(config)  # the cheap checks first: no server for a missing file or broken YAML
    if experiment:
        from regimen.stages.store import check_name

        check_name(experiment)  # the run's experiment: data handed to the flow, not put into the recipe
    from regimen.flows.present.terminal import terminal
    from regimen.flows.serving.server import api_for_this_run

    with api_for_this_run() as api_ready:  # a temporary server boots while the recipe is validated
        recipe = resolve(config, set_, store, data)  # validated and resolved once: exit 2, nothing written
        experiment = experiment or recipe.experiment  # else the recipe's own `experiment:`
        from regimen.flows.pipeline.cycle import RunResult, regimen_cycle_recipe

        api_ready()
        from regimen.flows.serving import orchestrator

        orchestrator.on_finish_while_down(lambda outcome: _present_and_say(outcome, started))
        with terminal(console, verbose=verbose):
            console.print(f"experiment [bold]{experiment}[/] in store {recipe.store}")
            state = regimen_cycle_recipe(recipe, experiment, return_state=True)
            _flush_prefect_logs()
    outcome = state.result(raise_on_failure=False)
    if not isinstance(outcome, RunResult):  # an unexpected crash: one line, Prefect's log has the traceback
        raise _as_regimen_error(outcome, state)
    _print_run(outcome, started)
    if outcome.exit_code:
        error = (
            InputError(outcome.message or "bad input")
            if outcome.exit_code == 2
            else RegimenError(outcome.message or state.message or "the run stopped")
        )
        error.exit_code = outcome.exit_code
        raise error


def _present_and_say(outcome, started: float) -> None:
    """The run's table and its last line, as `main` prints them (for a run ending while Prefect's API is down)."""
    _print_run(outcome, started)
    if outcome.exit_code == 2:
        err.print(f"error: {outcome.message}", markup=False, highlight=False)
    elif outcome.exit_code:
        err.print(
            f"{'interrupted' if outcome.exit_code in (130, 143) else 'stopped'}: {outcome.message}",
            markup=False,
            highlight=False,
        )


def _flush_prefect_logs() -> None:
    """Send the run's remaining log lines to Prefect before a temporary server stops (Prefect's own
    `APILogHandler.flush`)."""
    from prefect.logging.handlers import APILogHandler

    for handler in logging.getLogger("prefect.flow_runs").handlers:
        if isinstance(handler, APILogHandler):
            handler.flush()
            return


def _as_regimen_error(exc: BaseException, state) -> RegimenError:
    from regimen.stages.core.errors import StageInterrupted

    name = type(exc).__name__
    if (
        isinstance(exc, KeyboardInterrupt)
        or name in ("CancelledRun", "TerminationSignal", "Abort")
        or getattr(state, "name", "") == "Cancelled"
    ):
        return StageInterrupted(
            "run",
            "a cancel" if name != "TerminationSignal" else "SIGTERM",
            "rerun resumes from the last finished stage",
        )
    if isinstance(exc, OSError):
        from regimen.stages.store.files import describe_os_error

        return RegimenError(f"the run failed: {describe_os_error(exc, exc.filename or '')}")
    if isinstance(exc, RegimenError):
        return exc
    detail = str(exc).splitlines()[0] if str(exc) else ""
    return RegimenError(f"the run failed: {name}{': ' + detail if detail else ''} (Prefect's log has the traceback)")


@app.command()
def check(
    config: Annotated[str, typer.Argument(help="YAML recipe")],
    set_: SetOpt = None,
    all_fields: Annotated[
        bool, typer.Option("--all", help="also list every TRL default, not only the key fields")
    ] = False,
) -> None:
    """Validate a recipe and print it fully resolved, each value with where it came from; then the run's door checks
    that need no server (the data loads, each reward is called on a few rows, an environment is made and reset): what
    the run would refuse, check refuses. Trains nothing, writes nothing."""
    from regimen.stages.recipe import explain, load_recipe
    from regimen.stages.run.preflight import check as door

    recipe = load_recipe(config, set_ or [])
    summary = door(recipe, offline=True)
    from regimen.stages.training import sampler

    text = explain(recipe, all_fields=all_fields, streams=sampler.streams(recipe))
    console.print(text, markup=False, highlight=False, soft_wrap=True)
    for note in summary.get("skipped", []):
        console.print(f"# not checked here: {note}", markup=False, highlight=False)
    if summary.get("tools"):
        console.print(f"# environment tools: {', '.join(summary['tools'])}", markup=False, highlight=False)
    console.print(f"# {config}: OK", markup=False)


@app.command()
def status(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    store: Annotated[str, typer.Option("--store", help="artifact store")] = "artifacts",
    check: Annotated[
        bool, typer.Option("--check", help="read every manifest: check every version's files and the index")
    ] = False,
) -> None:
    """Each stage's state: completed (or damaged) versions, failed attempts, running, checkpoints."""
    from regimen.flows.present.status import experiment_status, libraries_line

    rows = experiment_status(store, experiment, check=check)
    table = Table(title=f"{experiment} in {store}")
    for col in ("stage", "state", "latest", "cycle", "finished", "detail"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["stage"], r["state"], r["latest"], r["cycle"], r["finished"], r["detail"])
    console.print(table)
    if line := libraries_line(rows):
        console.print(line, markup=False, highlight=False)


@app.command()
def sweep(
    config: Annotated[str, typer.Argument(help="YAML recipe")],
    set_: SetOpt = None,
    store: StoreOpt = None,
    experiment: ExperimentOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """One GRPO+eval per value of one field (--set grpo.num_generations=2,8,16) from the same SFT, then a comparison."""
    from regimen.flows.present.comparison import COLUMNS, parse_sweep, variant

    field, values, rest = parse_sweep(list(set_ or []))
    from regimen.flows.present.terminal import terminal
    from regimen.flows.serving.server import api_for_this_run

    with api_for_this_run() as api_ready:
        recipe = resolve(config, rest, store)
        if experiment:
            from regimen.stages.store import check_name

            check_name(experiment)  # a bad name is bad input (exit 2) before anything runs
        variants = [variant(recipe, field, v) for v in values]  # all validated before anything runs
        from regimen.flows.pipeline.sweep import regimen_sweep

        api_ready()
        with terminal(console, verbose=verbose):
            out = regimen_sweep(recipe=recipe, field=field, values=values, variants=variants, experiment=experiment)
            _flush_prefect_logs()
    table = Table(title=f"sweep over {field}")
    cols = [field, *COLUMNS]
    for c in cols:
        table.add_column(c)
    for r in out["rows"]:
        table.add_row(*[num(r.get(c)) for c in cols])
    console.print(table)
    console.print(out["note"])
    console.print(f"comparison: {out['files']['md']}\nplot: {out['files']['png']}")


@app.command()
def report(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    store: Annotated[str, typer.Option("--store", help="artifact store")] = "artifacts",
) -> None:
    """The experiment's history (cycles, rounds, verdicts, metrics) and freshly drawn plots."""
    from regimen.flows.present.report import history, make_plots
    from regimen.stages.store import Store, check_name

    check_name(experiment)
    st = Store(store)
    rows = history(st, experiment)
    if not rows:
        raise InputError(f"report: no completed stages for experiment {experiment!r} in {store}")
    table = Table(title=f"{experiment}: history")
    cols = ["label", "heldout_accuracy", "train_reward", "kl", "frac_reward_zero_std", "best_step", "groups", "verdict"]
    for c in cols:
        table.add_column(c)
    for r in rows:
        table.add_row(*[num(r.get(c)) for c in cols])
    console.print(table)
    for png in make_plots(st, experiment):
        console.print(f"plot: {png}")
