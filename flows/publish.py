"""Prefect artifacts from stage outputs: a metrics table, a sample of trajectories, a link to the folder,
and for evaluations the cycle's verdict. Keys are `<experiment>-<stage>`, so versions accumulate in the UI."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from stages import trajectories
from stages.runner import StageResult


def artifact_key(*parts: str) -> str:
    """Prefect keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else round(v, 4)
    return v


def _cell(v: Any) -> str:
    text = json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v
    return text.replace("|", "\\|").replace("\n", "⏎")[:120]


def trajectories_markdown(path: Path, title: str, limit: int = 12) -> str:
    rows = trajectories.read(path, limit=limit) if (path / trajectories.FILE).exists() else []
    if not rows:
        return f"### {title}\n\n(no trajectories)"
    names = sorted({k for r in rows for k in (r.get("rewards") or {})})
    head = "| prompt | completion | " + " | ".join(names) + " |\n|" + "---|" * (2 + len(names))
    lines = [f"| {_cell(r.get('prompt'))} | {_cell(r.get('completion'))} | " + " | ".join(_cell(_fmt((r.get('rewards') or {}).get(n))) for n in names) + " |" for r in rows]
    return f"### {title}\n\n{head}\n" + "\n".join(lines)


def publish(result: StageResult) -> None:
    """Artifacts for one stage result (also for reused ones: the UI shows what this run used)."""
    m = result.manifest
    base = artifact_key(m["experiment"], m["stage"])
    state = "reused" if result.reused else "ran"
    table = [{"metric": k, "value": _fmt(v)} for k, v in sorted(m.get("metrics", {}).items())]
    table += [{"metric": "version", "value": m["version"]}, {"metric": "cycle", "value": m.get("cycle")}]
    if "verdict" in m:
        table.append({"metric": "verdict", "value": m["verdict"]})
    create_table_artifact(table=table, key=base, description=f"{m['stage']} v{m['version']} ({state}), cycle {m.get('cycle')}: metrics")
    create_markdown_artifact(
        markdown=trajectories_markdown(result.path, f"{m['stage']} v{m['version']}: sample trajectories"),
        key=artifact_key(base, "trajectories"),
        description=f"what the model wrote in {m['stage']} v{m['version']}",
    )
    create_link_artifact(link=result.path.resolve().as_uri() if result.path.is_absolute() else str(result.path),
                         link_text=f"{m['stage']}/v{m['version']}", key=artifact_key(base, "folder"),
                         description="the version folder (manifest.json, metrics.json, trajectories.jsonl)")
    if m.get("stage") == "eval" and m.get("decision"):
        d = m["decision"]
        md = f"### Verdict: `{d['verdict']}`\n\n{d['reason']}\n"
        if d.get("warning"):
            md += f"\n**Warning:** {d['warning']}\n"
        if d.get("evidence"):
            md += "\n| evidence | value |\n|---|---|\n" + "\n".join(f"| {k} | {_cell(_fmt(v))} |" for k, v in d["evidence"].items())
        if d["verdict"] == "reward-hacking-suspected":
            md += "\n\n" + hacked_trajectories_markdown(result.path)
        create_markdown_artifact(markdown=md, key=artifact_key(m["experiment"], "verdict"), description=f"cycle {m.get('cycle')} round {m.get('round')}")


def hacked_trajectories_markdown(path: Path, limit: int = 12) -> str:
    """Held-out samples the rewards scored high although they are wrong: what the policy learnt to game."""
    rows = [r for r in trajectories.read(path) if not r.get("correct") and max([v for v in (r.get("rewards") or {}).values() if v is not None], default=0) >= 0.5]
    if not rows:
        return "(no held-out sample scored high while wrong)"
    names = sorted({k for r in rows for k in r.get("rewards", {})})
    head = "| prompt | completion | reference | " + " | ".join(names) + " |\n|" + "---|" * (3 + len(names))
    lines = [f"| {_cell(r.get('prompt'))} | {_cell(r.get('completion'))} | {_cell(r.get('answer'))} | " + " | ".join(_cell(_fmt(r['rewards'].get(n))) for n in names) + " |" for r in rows[:limit]]
    return f"### High reward, wrong answer ({len(rows)} held-out samples)\n\n{head}\n" + "\n".join(lines)


def publish_report(store, recipe) -> None:
    """Regenerate the experiment's plots and link them (and the history table) from Prefect."""
    from stages.report import history, make_plots

    for png in make_plots(store, recipe.experiment, recipe.cycle.target):
        create_link_artifact(link=png.resolve().as_uri(), link_text=png.name, key=artifact_key(recipe.experiment, "plot", png.stem),
                             description=f"{recipe.experiment}: {png.stem.replace('_', ' ')}")
    rows = [{k: _fmt(v) for k, v in r.items() if k in ("label", "heldout_accuracy", "train_reward", "verdict", "kl", "frac_reward_zero_std")}
            for r in history(store, recipe.experiment)]
    if rows:
        create_table_artifact(table=rows, key=artifact_key(recipe.experiment, "history"), description=f"{recipe.experiment}: evaluations across cycles")
