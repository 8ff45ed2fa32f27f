"""`regimen trajectories`: what a version's completions look like beside the version it is compared with, the prompts
that flipped and what looks like a hack, in the terminal and as one self-contained HTML page
(`flows/present/trajectories.py`; the rules are `stages/decide/reading.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from regimen.flows.cli.app import app, console


@app.command()
def trajectories(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    stage: Annotated[
        str | None, typer.Option("--stage", help="the stage whose trajectories to read (default: the evaluation)")
    ] = None,
    version: Annotated[int | None, typer.Option("--version", min=1, help="its version (default: the newest)")] = None,
    against: Annotated[
        int | None, typer.Option("--against", min=1, help="the version to compare with (default: the one before)")
    ] = None,
    show: Annotated[
        str,
        typer.Option(
            "--show",
            help="rows to list: flips, flagged, paid_but_wrong, wrong, right, all, fixed, broke, still_wrong, "
            "still_right",
        ),
    ] = "flips",
    limit: Annotated[int, typer.Option("--limit", min=0, help="rows listed in the terminal")] = 10,
    html: Annotated[
        Path | None, typer.Option("--html", help="where to write the page (default: the experiment's pages folder)")
    ] = None,
    store: Annotated[str, typer.Option("--store", help="artifact store: a folder or an fsspec URL")] = "artifacts",
) -> None:
    """Read what a round changed: the flips between two versions on the frozen held-out prompts, each completion
    beside its counterpart, and the flags (paid but wrong, length, the same completion for many prompts, the prompt
    echoed, repeated lines). Writes one HTML page that opens from the file system, with filters."""
    from regimen.flows.present import trajectories as present
    from regimen.stages.store import Store, check_name

    check_name(experiment)
    st = Store(store)
    v = present.view(st, experiment, stage, version, against)
    present.select(v, show)  # a bad --show is refused before anything is written
    for line in present.lines(v, show, limit):
        console.print(line, markup=False, highlight=False)
    path = html or st.experiment_dir(experiment, "pages") / f"{v['stage']}_v{v['version']}.html"
    present.write_page(v, path)
    console.print(f"page: {Path(path).resolve()}", markup=False, highlight=False)
