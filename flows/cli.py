"""The `regimen` command: run, check, reward-check, status. Thin: it parses, calls the flow or a stage
helper, prints, and maps failures to exit codes (0 done, 1 a gate or stage stopped it, 2 bad input)."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from stages.errors import InputError, RegimenError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  help="Regimen: distillation-style SFT and GRPO in cycles, orchestrated by Prefect.")
console = Console(stderr=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)

SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="override a recipe field: KEY=VALUE with a dotted key, e.g. grpo.beta=0.05")]

KEY_METRICS = {
    "sft": ["heldout_accuracy", "traces_kept", "train_loss_last"],
    "reward-dry-run": ["mean_reward", "reward_std", "frac_reward_zero_std"],
    "grpo-smoke": ["mean_reward", "max_reward_std", "max_abs_loss"],
    "grpo": ["train_reward_first", "train_reward_last", "kl_last", "frac_reward_zero_std_mean", "completions_per_s"],
    "eval": ["heldout_accuracy", "train_reward"],
}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.0f}" if v.is_integer() or abs(v) >= 1000 else f"{v:.3f}"
    return str(v)


def summary_table(results: list[dict[str, Any]]) -> Table:
    table = Table(title="regimen run", show_lines=False)
    for col in ("stage", "version", "cycle", "", "wall s", "key metrics"):
        table.add_column(col)
    for r in results:
        metrics = r.get("metrics") or {}
        shown = ", ".join(f"{k}={_fmt(metrics[k])}" for k in KEY_METRICS.get(r["stage"], []) if k in metrics)
        if r.get("resumed_from_step"):
            shown += f", resumed_from_step={r['resumed_from_step']}"
        if r.get("verdict"):
            shown += f", verdict={r['verdict']}"
        where = f"{r.get('cycle')}" + (f".{r['round']}" if r.get("round") else "")
        table.add_row(r["stage"], f"v{r['version']}", where, "reused" if r["reused"] else "ran", f"{r['wall_s']:.1f}", shown)
    return table


def _print_run(results: list[dict[str, Any]], started: float) -> None:
    if not results:
        return
    console.print(summary_table(results))
    for warning in dict.fromkeys(r["warning"] for r in results if r.get("warning")):
        console.print(f"[bold yellow]{warning}[/]")
    total = time.perf_counter() - started
    stages = sum(r["wall_s"] for r in results)
    reused = sum(1 for r in results if r["reused"])
    if stages:
        console.print(f"wall time {total:.1f}s; stages {stages:.1f}s; orchestration overhead x{total / stages:.3f} (wall / sum of stages)"
                      + (f"; {reused} of {len(results)} stages reused" if reused else ""))
    else:
        console.print(f"wall time {total:.1f}s; all {len(results)} stages reused (nothing changed)")
    last_eval = next((r for r in reversed(results) if r["stage"] == "eval"), None)
    if last_eval and last_eval.get("decision"):
        console.print(f"verdict: [bold]{last_eval['verdict']}[/] — {last_eval['decision']['reason']}")


def warm_up_prefect() -> threading.Thread:
    """Start Prefect's temporary server (when no PREFECT_API_URL is set) in a thread, so its boot
    overlaps the recipe's validation and the heavy imports instead of following them. Join it before
    the flow starts: the server object is shared, and its start() is not safe to race."""

    def start() -> None:
        from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

        if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
            return
        from prefect.server.api.server import SubprocessASGIServer

        server = SubprocessASGIServer()
        try:
            server.start()
        except Exception:  # leave nothing half-started; the flow's own start-up will report a real problem
            server.stop()

    thread = threading.Thread(target=start, name="prefect-warm-up", daemon=True)
    thread.start()
    return thread


@app.command()
def run(
    config: Annotated[str, typer.Argument(help="YAML recipe, e.g. configs/default.yaml")],
    set_: SetOpt = None,
    store: Annotated[Optional[str], typer.Option("--store", help="artifact store: a folder or an fsspec URL")] = None,
    experiment: Annotated[Optional[str], typer.Option("--experiment", help="experiment name in the store")] = None,
) -> None:
    """Run the flow `regimen-cycle` over the recipe's stages and print a summary."""
    started = time.perf_counter()
    from stages.config import parse_set, read_yaml

    overrides = parse_set(set_ or [])
    read_yaml(config)  # the cheap checks first: no server for a missing file or broken YAML
    server = warm_up_prefect()
    try:
        from flows.cycle import regimen_cycle, resolve_recipe

        recipe = resolve_recipe(config, experiment, overrides, store)  # validated before the flow starts: exit 2, nothing written
    finally:
        server.join()  # never leave a half-started server behind, whatever happened above
    console.print(f"experiment [bold]{recipe.experiment}[/] in store {recipe.store}")
    try:
        results = regimen_cycle(config=config, experiment=experiment, overrides=overrides, store=store)
    except RegimenError as exc:
        _print_run(getattr(exc, "results", []), started)
        raise
    _print_run(results, started)


@app.command()
def check(
    config: Annotated[str, typer.Argument(help="YAML recipe")],
    set_: SetOpt = None,
) -> None:
    """Validate a recipe and print it resolved (TRL defaults made explicit); runs nothing."""
    from stages.config import dump_recipe, load_recipe

    recipe = load_recipe(config, set_ or [])
    console.print(dump_recipe(recipe), markup=False, highlight=False)
    console.print(f"# {config}: OK", markup=False)


@app.command("reward-check")
def reward_check(
    samples: Annotated[str, typer.Option("--samples", help="JSONL: one object per line with `completion` (+ prompt, answer, tests, ...)")],
    config: Annotated[Optional[str], typer.Option("--config", help="take the rewards from this recipe")] = None,
    reward: Annotated[Optional[list[str]], typer.Option("--reward", help="reward name (repeatable)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON line per sample")] = False,
) -> None:
    """Score completions with rewards, no model: the dry run of a reward on sample text."""
    from stages.reward_check import main as reward_main

    code = reward_main(samples, config, list(reward or []), as_json)
    raise typer.Exit(code)


@app.command()
def status(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    store: Annotated[str, typer.Option("--store", help="artifact store")] = "artifacts",
) -> None:
    """Each stage's state: completed versions, failed attempts, running, checkpoints."""
    from stages.status import experiment_status

    rows = experiment_status(store, experiment)
    table = Table(title=f"{experiment} in {store}")
    for col in ("stage", "state", "latest", "cycle", "finished", "detail"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["stage"], r["state"], r["latest"], r["cycle"], r["finished"], r["detail"])
    console.print(table)


@app.command()
def sweep(
    config: Annotated[str, typer.Argument(help="YAML recipe")],
    set_: SetOpt = None,
    store: Annotated[Optional[str], typer.Option("--store", help="artifact store")] = None,
    experiment: Annotated[Optional[str], typer.Option("--experiment", help="experiment name in the store")] = None,
) -> None:
    """One GRPO+eval per value of one field (--set grpo.num_generations=2,8,16) from the same SFT, then a comparison."""
    from stages.config import parse_set
    from stages.sweep import parse_sweep, variant

    field, values, rest = parse_sweep(list(set_ or []))
    overrides = parse_set(rest)
    from flows.cycle import resolve_recipe

    recipe = resolve_recipe(config, experiment, overrides, store)
    for v in values:
        variant(recipe, field, v)
    from flows.sweep import regimen_sweep

    out = regimen_sweep(config=config, field=field, values=values, experiment=experiment, overrides=overrides, store=store)
    table = Table(title=f"sweep over {field}")
    cols = [field, "heldout_accuracy", "train_reward_mean", "frac_reward_zero_std_mean", "prompts_per_step", "grpo_wall_s"]
    for c in cols:
        table.add_column(c)
    for r in out["rows"]:
        table.add_row(*[_fmt(r[c]) for c in cols])
    console.print(table)
    console.print(out["note"])
    console.print(f"comparison: {out['files']['md']}\nplot: {out['files']['png']}")


@app.command()
def report(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    store: Annotated[str, typer.Option("--store", help="artifact store")] = "artifacts",
) -> None:
    """The experiment's history (cycles, rounds, verdicts, metrics) and freshly drawn plots."""
    from stages.report import history, make_plots
    from stages.store import Store

    st = Store(store)
    rows = history(st, experiment)
    if not rows:
        raise InputError(f"report: no completed stages for experiment {experiment!r} in {store}")
    table = Table(title=f"{experiment}: history")
    cols = ["label", "heldout_accuracy", "train_reward", "kl", "frac_reward_zero_std", "verdict"]
    for c in cols:
        table.add_column(c)
    for r in rows:
        table.add_row(*["" if r.get(c) is None else _fmt(r[c]) for c in cols])
    console.print(table)
    for png in make_plots(st, experiment):
        console.print(f"plot: {png}")


@app.command()
def serve(
    config: Annotated[str, typer.Argument(help="YAML recipe the deployments run by default")],
    store: Annotated[Optional[str], typer.Option("--store", help="artifact store for runs of these deployments")] = None,
    cron: Annotated[str, typer.Option("--cron", help="schedule of the nightly deployment")] = "0 2 * * *",
    timezone: Annotated[str, typer.Option("--timezone", help="time zone of the cron schedule")] = "UTC",
) -> None:
    """Register and serve the deployments `on-demand` and `nightly` of the flow regimen-cycle."""
    from flows.deploy import serve_deployments

    serve_deployments(config, store=store, cron=cron, timezone=timezone)


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        app(standalone_mode=False)
    except InputError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        sys.exit(2)
    except RegimenError as exc:
        err.print(f"stopped: {exc}", markup=False, highlight=False)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        sys.exit(130)
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(2)
        raise
    sys.exit(0)


if __name__ == "__main__":
    main()
