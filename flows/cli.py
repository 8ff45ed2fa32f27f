"""The `regimen` command: run, check, reward-check, status, sweep, report, serve, pool setup. Thin: it parses, calls the
flow or a helper, prints, and maps failures to exit codes: 0 done, 1 a gate, a stage or the store stopped
it, 2 bad input, 130 Ctrl-C (or a cancel), 143 SIGTERM. Prefect's own tracebacks of a failure stay in
Prefect's logs; the terminal gets one line that says what happened and what to do."""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from regimen.flows.present.fmt import num
from regimen.stages.core.errors import InputError, RegimenError

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="Regimen: distillation-style SFT and GRPO in cycles, orchestrated by Prefect.",
)
console = Console(stderr=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True)

SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a recipe field: KEY=VALUE with a dotted key, e.g. grpo.beta=0.05"),
]
StoreOpt = Annotated[str | None, typer.Option("--store", help="artifact store: a folder or an fsspec URL")]
ExperimentOpt = Annotated[str | None, typer.Option("--experiment", help="experiment name in the store")]


def summary_table(results: list[dict[str, Any]]) -> Table:
    from regimen.stages import registry

    table = Table(title="regimen run", show_lines=False)
    for col in ("stage", "version", "cycle", "", "wall s", "key metrics"):
        table.add_column(col)
    for r in results:
        metrics = r.get("metrics") or {}
        shown = ", ".join(f"{k}={num(metrics[k])}" for k in registry.get(r["stage"]).KEY_METRICS if k in metrics)
        if r.get("resumed_from_step"):
            shown += f", resumed_from_step={r['resumed_from_step']}"
        if r.get("verdict"):
            shown += f", verdict={r['verdict']}"
        if r.get("damaged"):
            shown += f", damaged versions not reused: {', '.join('v' + str(d['version']) for d in r['damaged'])}"
        where = f"{r.get('cycle')}" + (f".{r['round']}" if r.get("round") else "")
        table.add_row(
            r["stage"], f"v{r['version']}", where, "reused" if r["reused"] else "ran", f"{r['wall_s']:.1f}", shown
        )
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
        console.print(
            f"wall time {total:.1f}s; stages {stages:.1f}s; fixed cost {total - stages:.1f}s (wall minus the stages' "
            f"own time)"
        )
    else:
        console.print(f"wall time {total:.1f}s; every stage reused (nothing changed)")
    last_eval = next((r for r in reversed(results) if r.get("decision")), None)
    if last_eval:
        console.print(f"verdict: [bold]{last_eval['verdict']}[/] — {last_eval['decision']['reason']}")


def resolve(config: str, set_: list[str] | None, store: str | None):
    """The recipe, validated and resolved once (exit 2 on bad input). The experiment is not part of it: the
    commands hand it to the flow as data of the run."""
    from regimen.stages.recipe import load_recipe, parse_set

    overrides = parse_set(set_ or [])
    if store:
        overrides["store"] = store
    return load_recipe(config, overrides)


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
    read_yaml(config)  # the cheap checks first: no server for a missing file or broken YAML
    if experiment:
        from regimen.stages.store import check_name

        check_name(experiment)  # the run's experiment: data handed to the flow, not put into the recipe
    from regimen.flows.present.terminal import terminal
    from regimen.flows.server import api_for_this_run

    with api_for_this_run() as api_ready:  # a temporary server boots while the recipe is validated
        recipe = resolve(config, set_, store)  # validated and resolved once: exit 2, nothing written
        experiment = experiment or recipe.experiment  # else the recipe's own `experiment:`
        from regimen.flows.cycle import RunResult, regimen_cycle_recipe

        api_ready()
        from regimen.flows import orchestrator

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
    """Validate a recipe and print it fully resolved, each value with where it came from; runs nothing."""
    from regimen.stages.recipe import explain, load_recipe

    recipe = load_recipe(config, set_ or [])
    console.print(explain(recipe, all_fields=all_fields), markup=False, highlight=False, soft_wrap=True)
    console.print(f"# {config}: OK", markup=False)


@app.command("reward-check")
def reward_check(
    samples: Annotated[
        str,
        typer.Option("--samples", help="JSONL: one object per line with `completion` (+ prompt, answer, tests, ...)"),
    ],
    config: Annotated[str | None, typer.Option("--config", help="take the rewards from this recipe")] = None,
    reward: Annotated[list[str] | None, typer.Option("--reward", help="reward name (repeatable)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON line per sample")] = False,
) -> None:
    """Score completions with rewards, no model: the dry run of a reward on sample text."""
    from regimen.flows.present.reward_check import main as reward_main

    code = reward_main(samples, config, list(reward or []), as_json)
    raise typer.Exit(code)


@app.command()
def status(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    store: Annotated[str, typer.Option("--store", help="artifact store")] = "artifacts",
) -> None:
    """Each stage's state: completed (or damaged) versions, failed attempts, running, checkpoints."""
    from regimen.flows.present.status import experiment_status, libraries_line

    rows = experiment_status(store, experiment)
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
    from regimen.flows.server import api_for_this_run

    with api_for_this_run() as api_ready:
        recipe = resolve(config, rest, store)
        if experiment:
            from regimen.stages.store import check_name

            check_name(experiment)  # a bad name is bad input (exit 2) before anything runs
        variants = [variant(recipe, field, v) for v in values]  # all validated before anything runs
        from regimen.flows.sweep import regimen_sweep

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
    cols = ["label", "heldout_accuracy", "train_reward", "kl", "frac_reward_zero_std", "best_step", "verdict"]
    for c in cols:
        table.add_column(c)
    for r in rows:
        table.add_row(*[num(r.get(c)) for c in cols])
    console.print(table)
    for png in make_plots(st, experiment):
        console.print(f"plot: {png}")


@app.command()
def serve(
    config: Annotated[str, typer.Argument(help="recipe in the configs folder the deployments run by default")],
    store: Annotated[str | None, typer.Option("--store", help="artifact store for runs of these deployments")] = None,
    cron: Annotated[str, typer.Option("--cron", help="schedule of the nightly deployment")] = "0 2 * * *",
    timezone: Annotated[str, typer.Option("--timezone", help="time zone of the cron schedule")] = "UTC",
    allow: Annotated[
        list[str] | None,
        typer.Option(
            "--allow",
            help="let UI runs also set this recipe key (a dotted key or pattern, e.g. model.name_or_path); repeatable",
        ),
    ] = None,
    configs: Annotated[
        str | None,
        typer.Option(
            "--configs",
            help="the folder UI runs choose recipes from (default: ./configs); it must hold the served recipe",
        ),
    ] = None,
    allow_unauthenticated_api: Annotated[
        bool,
        typer.Option(
            "--allow-unauthenticated-api",
            help="serve a Prefect API other machines can reach without authentication (behind your own proxy)",
        ),
    ] = False,
    max_steps: Annotated[
        int,
        typer.Option(
            "--max-steps", min=0, help="a served run's training stages train at most this many steps (0: no limit)"
        ),
    ] = 100_000,
    max_checkpoints: Annotated[
        int,
        typer.Option(
            "--max-checkpoints", min=0, help="checkpoints a training stage keeps at most (0: no limit; else at least 2)"
        ),
    ] = 5,
    max_hours: Annotated[
        float,
        typer.Option("--max-hours", min=0, help="wall time of a served run: training stops past it (0: no limit)"),
    ] = 24.0,
    max_disk_gb: Annotated[
        float,
        typer.Option(
            "--max-disk-gb",
            min=0,
            help="size of a served run's experiment folder: training stops past it (0: no limit)",
        ),
    ] = 50.0,
) -> None:
    """Register and serve the deployments `on-demand` and `nightly` of the flow regimen-cycle."""
    from regimen.flows.deploy import serve_deployments

    serve_deployments(
        config,
        store=store,
        cron=cron,
        timezone=timezone,
        allow=list(allow or []),
        configs_dir=configs,
        allow_unauthenticated=allow_unauthenticated_api,
        limits={
            "max_steps": max_steps,
            "max_checkpoints": max_checkpoints,
            "max_hours": max_hours,
            "max_disk_gb": max_disk_gb,
        },
    )


pool_app = typer.Typer(no_args_is_help=True, help="Several hosts: a Prefect process work pool, one worker per host.")
app.add_typer(pool_app, name="pool")


@pool_app.command("setup")
def pool_setup(
    store: Annotated[str, typer.Option("--store", help="the bucket every host shares, e.g. s3://bucket/prefix")],
    pool: Annotated[str, typer.Option("--pool", help="the process work pool's name")] = "regimen",
    config: Annotated[
        str, typer.Option("--config", help="recipe in the configs folder the deployments run by default")
    ] = "configs/default.yaml",
    configs: Annotated[
        str | None, typer.Option("--configs", help="the folder UI runs choose recipes from (default: ./configs)")
    ] = None,
    cron: Annotated[str, typer.Option("--cron", help="schedule of the nightly deployment")] = "0 2 * * *",
    timezone: Annotated[str, typer.Option("--timezone", help="time zone of the cron schedule")] = "UTC",
    allow: Annotated[
        list[str] | None,
        typer.Option("--allow", help="let UI runs also set this recipe key; repeatable (as serve --allow)"),
    ] = None,
    allow_unauthenticated_api: Annotated[
        bool,
        typer.Option("--allow-unauthenticated-api", help="a Prefect API other machines reach without authentication"),
    ] = False,
    max_steps: Annotated[int, typer.Option("--max-steps", min=0, help="as `regimen serve --max-steps`")] = 100_000,
    max_checkpoints: Annotated[
        int, typer.Option("--max-checkpoints", min=0, help="as `regimen serve --max-checkpoints`")
    ] = 5,
    max_hours: Annotated[float, typer.Option("--max-hours", min=0, help="as `regimen serve --max-hours`")] = 24.0,
    max_disk_gb: Annotated[float, typer.Option("--max-disk-gb", min=0, help="as `regimen serve --max-disk-gb`")] = 50.0,
    heartbeat_s: Annotated[
        int, typer.Option("--heartbeat-s", help="seconds between a run's heartbeats (Prefect's least: 30)")
    ] = 30,
    host_lost_after_s: Annotated[
        int | None,
        typer.Option(
            "--host-lost-after-s",
            help="no heartbeat this long: the run's host is lost and the run is scheduled again (default: the store "
            "lease's 120 s + a heartbeat)",
        ),
    ] = None,
) -> None:
    """Create (or update) a process work pool, deploy regimen-cycle/on-demand and /nightly to it, and the automations
    that redo a run whose host was lost."""
    from regimen.flows.deploy import WORKER_COMMAND
    from regimen.flows.pool import pool_setup as setup

    made = setup(
        store,
        pool=pool,
        config=config,
        configs_dir=configs,
        cron=cron,
        timezone=timezone,
        allow=list(allow or []),
        allow_unauthenticated=allow_unauthenticated_api,
        heartbeat_s=heartbeat_s,
        host_lost_after_s=host_lost_after_s,
        limits={
            "max_steps": max_steps,
            "max_checkpoints": max_checkpoints,
            "max_hours": max_hours,
            "max_disk_gb": max_disk_gb,
        },
    )
    console.print(
        f"work pool {made['pool']!r}: regimen-cycle/on-demand and /nightly deployed (recipe {made['config']}, store "
        f"{store}); "
        f"a run without a heartbeat for {made['host_lost_after_s']} s is marked Crashed (HostLost) and scheduled again",
        markup=False,
        highlight=False,
    )
    console.print(
        f"on each host, in this project's folder, with the bucket's AWS_* environment: "
        f"{WORKER_COMMAND.format(pool=made['pool'])}",
        markup=False,
        highlight=False,
    )


@app.command("make-model")
def make_model(
    out: Annotated[str, typer.Argument(help="folder to write the model into (like a hub snapshot)")],
    arch: Annotated[
        str, typer.Option("--arch", help="qwen3 or llama (either with a byte-level BPE tokenizer and a chat template)")
    ] = "qwen3",
    hidden_size: Annotated[int, typer.Option("--hidden-size")] = 64,
    layers: Annotated[int, typer.Option("--layers")] = 2,
) -> None:
    """Build a small standard-architecture causal LM locally (no download), saved with save_pretrained."""
    from regimen.stages.training.model import build_real_shaped_model

    if arch not in ("qwen3", "llama"):
        raise InputError(f"--arch {arch!r}: use qwen3 or llama")
    path = build_real_shaped_model(out, arch=arch, hidden_size=hidden_size, num_layers=layers)
    console.print(f"model saved to {path} (model.name_or_path: {path})")


from regimen.flows import models_cli  # noqa: E402  (champion, promote, rollback, export, heldout refresh)

models_cli.register(app)


def main() -> None:
    import atexit
    import gc

    # Runs after every exit handler registered later (Prefect's, which send the run's last events and logs):
    # the interpreter's final garbage collection over a heap of models and libraries took 1.8 s of a tiny
    # run's exit and frees nothing the operating system would not free at once.
    atexit.register(gc.freeze)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        app(standalone_mode=False)
    except InputError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        sys.exit(2)
    except RegimenError as exc:
        stopped = "interrupted" if getattr(exc, "exit_code", 1) in (130, 143) else "stopped"
        err.print(f"{stopped}: {exc}", markup=False, highlight=False)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print(
            "interrupted (Ctrl-C): finished stages are kept; a rerun reuses them and resumes the interrupted one from "
            "its last checkpoint"
        )
        sys.exit(130)
    except OSError as exc:  # the machine, not the user: a full disk, a read-only folder
        from regimen.stages.store.files import describe_os_error

        err.print(
            f"stopped: {describe_os_error(exc, getattr(exc, 'filename', '') or '')}", markup=False, highlight=False
        )
        sys.exit(1)
    except BaseException as exc:
        if type(exc).__name__ == "TerminationSignal":  # prefect.exceptions.TerminationSignal: SIGTERM between stages
            err.print(
                "interrupted (SIGTERM): finished stages are kept; a rerun reuses them and resumes the interrupted one "
                "from its last checkpoint"
            )
            sys.exit(143)
        if isinstance(exc, (SystemExit, GeneratorExit)):
            raise
        if isinstance(exc, _click_exceptions()):
            sys.exit(_say_usage_error(exc))
        raise
    sys.exit(0)


def _click_exceptions() -> tuple[type, ...]:
    """The exception classes a command-line misuse raises: typer's own vendored click's (reached through its
    public `typer.BadParameter`, whose bases they are) and click's, for commands built on click itself."""
    import click

    vendored = [k for k in typer.BadParameter.__mro__ if k.__name__ == "ClickException"]
    return (click.exceptions.ClickException, *vendored)


def _say_usage_error(exc) -> int:
    """A misuse (a missing argument, an unknown option, a bad value) as one line naming the command, and
    exit 2; a bare command group (`regimen`, `regimen heldout`) shows its help."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else "regimen"
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        console.print(ctx.get_help(), markup=False, highlight=False)
        return 2
    message = " ".join(exc.format_message().split())
    err.print(f"error: {command}: {message} (see `{command} --help`)", markup=False, highlight=False)
    return 2


if __name__ == "__main__":
    main()
