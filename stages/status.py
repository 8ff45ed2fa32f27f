"""What `regimen status` shows: per stage, its completed versions, failed attempts, a run in
progress and the last good Trainer checkpoint in its work folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stages.checkpoints import last_checkpoint
from stages.config import STAGES
from stages.store import Store


def experiment_status(store_url: str, experiment: str) -> list[dict[str, Any]]:
    store = Store(store_url)
    rows = []
    for stage in STAGES:
        versions = store.versions(experiment, stage)
        failures = store.failures(experiment, stage)
        running = store.running_info(experiment, stage)
        work = Path(store.cache) / experiment / stage / "work"
        ckpts = [(c, d) for d in sorted(work.glob("*")) if (c := last_checkpoint(d))] if work.is_dir() else []
        latest = versions[-1] if versions else None
        last_fail = failures[-1] if failures else None
        if running and not running.get("stale"):
            state = "running"
        elif running:
            state = "interrupted"
        elif last_fail and (not latest or last_fail.get("failed_at", "") > latest.get("finished_at", "")):
            state = "failed"
        elif latest:
            state = "completed"
        else:
            state = "not run"
        detail = []
        if state == "failed":
            detail.append(str(last_fail.get("error", ""))[:160])
        if running and running.get("stale"):
            detail.append(f"interrupted run (pid {running.get('pid')} gone)")
        for (step, _ckpt), _work in ckpts:
            detail.append(f"has checkpoint at step {step}")
        if latest and latest.get("verdict"):
            detail.append(f"verdict {latest['verdict']}")
        rows.append({
            "stage": stage,
            "state": state,
            "latest": f"v{latest['version']}" if latest else "-",
            "cycle": str(latest.get("cycle", "")) if latest else "-",
            "finished": (latest or {}).get("finished_at", "-")[:19],
            "detail": ("; ".join(detail) + (f" ({len(versions)} versions, {len(failures)} failed attempts)" if versions or failures else "")).strip(),
        })
    return rows
