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
        create_markdown_artifact(markdown=md, key=artifact_key(m["experiment"], "verdict"), description=f"cycle {m.get('cycle')} round {m.get('round')}")
