"""How `regimen reward-check` shows what rewards paid (the command is `flows/cli/reward_check.py`): a table of the
first rows and a summary per reward (mean, std, min, max, how many None), the gameable rewards announced loudly."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from regimen.stages import rewards as rewards_module
from regimen.stages.rewards import completion_text, weighted_total

TABLE_ROWS = 20


def gameable_warning(names: list[str]) -> str:
    return rewards_module.GAMEABLE_WARNING.format(names=", ".join(names))


def _fmt(value: float | None) -> str:
    return "None" if value is None else f"{value:.3f}"


def _clip(value: Any, width: int = 60) -> str:
    text = (
        value
        if isinstance(value, str)
        else completion_text(value)
        if isinstance(value, list)
        else ""
        if value is None
        else str(value)
    )
    text = text.replace("\r", "").replace("\n", " ⏎ ")
    return text if len(text) <= width else text[: width - 1] + "…"


def json_value(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def print_report(console, path: Path, rows, fns, values, weights, gameable, elapsed: float) -> None:
    from rich.table import Table

    totals = weighted_total(values, weights) if weights else None
    table = Table(title=f"{path.name}: first {min(TABLE_ROWS, len(rows))} of {len(rows)} samples", show_lines=False)
    table.add_column("line", justify="right")
    table.add_column("prompt", overflow="fold")
    table.add_column("completion", overflow="fold")
    for name in fns:
        table.add_column(name + (" (!)" if name in gameable else ""), justify="right")
    if totals is not None:
        table.add_column("total", justify="right")
    for i, (line_no, row) in enumerate(rows[:TABLE_ROWS]):
        cells = [str(line_no), _clip(row.get("prompt"), 40), _clip(row["completion"])]
        cells += [_fmt(values[name][i]) for name in fns]
        if totals is not None:
            cells.append(_fmt(totals[i]) if math.isfinite(totals[i]) else "None")
        table.add_row(*cells)
    console.print(table)

    summary = Table(title="summary")
    for col in ("reward", "weight", "mean", "std", "min", "max", "scored", "None"):
        summary.add_column(col, justify="left" if col == "reward" else "right")
    for name in fns:
        scored = [v for v in values[name] if v is not None and math.isfinite(v)]
        nones = len(values[name]) - len(scored)
        stats = (
            [statistics.fmean(scored), statistics.pstdev(scored), min(scored), max(scored)] if scored else [None] * 4
        )
        summary.add_row(
            name + (" (GAMEABLE)" if name in gameable else ""),
            "-" if not weights else f"{weights[name]:g}",
            *(("-" if s is None else f"{s:.3f}") for s in stats),
            str(len(scored)),
            str(nones),
        )
    if totals is not None:
        finite = [t for t in totals if math.isfinite(t)]
        stats = (
            [statistics.fmean(finite), statistics.pstdev(finite), min(finite), max(finite)] if finite else [None] * 4
        )
        summary.add_row(
            "weighted total",
            "",
            *(("-" if s is None else f"{s:.3f}") for s in stats),
            str(len(finite)),
            str(len(totals) - len(finite)),
        )
    console.print(summary)
    if gameable:
        console.print(gameable_warning(gameable), style="bold red", soft_wrap=True)
    console.print(f"scored {len(rows)} samples with {len(fns)} reward(s) in {elapsed:.2f} s")
