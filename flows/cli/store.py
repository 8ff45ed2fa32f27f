"""`regimen gc` (retention: what an operator's policy removes, the bytes it frees) and `regimen reindex` (the stages'
indexes rebuilt from their manifests). The work is `stages/store/retention.py` and `stages/store/index.py`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from regimen.flows.cli.app import app, console
from regimen.stages.core.errors import InputError

StoreOpt = Annotated[str, typer.Option("--store", help="artifact store: a folder or an fsspec URL")]


def _gb(n: int) -> str:
    return f"{n / 1e9:.4g} GB" if n >= 1e7 else f"{n / 1e6:.3g} MB"


@app.command()
def gc(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    keep_last: Annotated[
        int | None, typer.Option("--keep-last", min=1, help="keep the last K versions of each stage")
    ] = None,
    keep_days: Annotated[
        float | None, typer.Option("--keep-days", min=0, help="keep versions finished within D days")
    ] = None,
    keep_champions: Annotated[
        int,
        typer.Option(
            "--keep-champions", min=0, help="earlier champions that stay restorable by rollback (store.keep.champions)"
        ),
    ] = 2,  # retention.DEFAULT_CHAMPIONS and store.keep.champions' default (a test holds them equal)
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="say what would be removed and the bytes; remove nothing")
    ] = False,
    store: StoreOpt = "artifacts",
) -> None:
    """Remove versions an operator's policy no longer keeps. Never removed: the champion's lineage, the last
    --keep-champions earlier champions (rollback targets), the records (held-out sets, data versions), anything a
    running stage holds. A gc stopped after planning is finished first (a dry run lists what it will remove)."""
    from regimen.stages.store import Store, check_name
    from regimen.stages.store.retention import collect

    check_name(experiment)
    if keep_last is None and keep_days is None:
        raise InputError("gc: say what to keep: --keep-last K, --keep-days D, or both")
    st = Store(store)
    if not st.has_experiment(experiment):
        raise InputError(f"gc: no experiment {experiment!r} in store {store}")
    if dry_run:
        report = collect(st, experiment, last=keep_last, days=keep_days, champions=keep_champions, dry_run=True)
    else:
        with st.lock(experiment):  # no run of it meanwhile: a run's commit and gc never race on an index
            report = collect(st, experiment, last=keep_last, days=keep_days, champions=keep_champions)
    table = Table(title=f"{experiment}: {'would remove' if dry_run else 'removed'} {len(report['remove'])} version(s)")
    for col in ("stage", "version", "size", "why"):
        table.add_column(col)
    for r in report["remove"]:
        why = "planned by a gc that was stopped" if r.get("pending") else "not kept by the policy"
        table.add_row(r["stage"], f"v{r['version']}", _gb(r["bytes"]), why)
    console.print(table)
    if report.get("pending"):
        console.print(
            f"{report['pending']} version(s) are in the plan of a gc that was stopped: the next gc removes them first",
            markup=False,
        )
    for reason, kept in report["kept"].items():
        shown = ", ".join(kept[:8]) + (f" and {len(kept) - 8} more" if len(kept) > 8 else "")
        console.print(f"kept ({reason}): {shown}", markup=False, highlight=False)
    if dry_run:
        console.print(f"would free {_gb(report['bytes'])}", markup=False)
    else:
        extra = f" (and {_gb(report['resumed'])} a gc stopped earlier had planned)" if report["resumed"] else ""
        console.print(f"freed {_gb(report['freed'])}{extra}", markup=False)


@app.command()
def reindex(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    store: StoreOpt = "artifacts",
) -> None:
    """Rebuild every stage's index of an experiment from its manifests (lookups read the index, not the history)."""
    from regimen.stages.store import Store, check_name
    from regimen.stages.store.retention import stages_of

    check_name(experiment)
    st = Store(store)
    if not st.has_experiment(experiment):
        raise InputError(f"reindex: no experiment {experiment!r} in store {store}")
    with st.lock(experiment):
        for stage in stages_of(st, experiment):
            index = st.rebuild_index(experiment, stage)
            if index["versions"] or index["next"] > 1:
                console.print(f"{stage}: {len(index['versions'])} version(s), next v{index['next']}", markup=False)
