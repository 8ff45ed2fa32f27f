"""An experiment's records in the store: its named records (champion.json, the data versions), the cycle's
verdicts (`<experiment>/decisions/`) and the stages' failed attempts (`<experiment>/<stage>/failed/`).

Records change only under the experiment's record lock, or by compare-and-swap against what was read
(`update`); verdicts and failed attempts are only ever added.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from regimen.stages.core.errors import StoreError
from regimen.stages.store import files, schemas
from regimen.stages.store.backend import Backend, check_name, now_iso
from regimen.stages.store.lock import record_lock


class StaleRecord(StoreError):
    """A record changed since the caller read it (a person's move landed meanwhile): decide again."""


class Ledger:
    """The experiment-level records, the verdicts and the failed attempts of one store (`Store.ledger`)."""

    def __init__(self, backend: Backend):
        self.b = backend

    # -- named records -------------------------------------------------------------------------
    def write(self, experiment: str, name: str, data: dict[str, Any]) -> str:
        """Replace the experiment-level record `name` (e.g. champion.json) atomically."""
        return self.b.write_text(self.b.join(check_name(experiment), name), json.dumps(data, indent=1, default=str))

    def read(self, experiment: str, name: str) -> Any:
        """The experiment-level record `name`, or None when there is none (or it is unreadable)."""
        return self.b.read_json(self.b.join(check_name(experiment), name))

    def has(self, experiment: str, name: str) -> bool:
        """Whether the record's file exists (readable or not)."""
        path = self.b.join(check_name(experiment), name)
        return os.path.lexists(path) if self.b.local else bool(self.b.fs.exists(path))

    def update(self, experiment: str, name: str, change, *, expect: int | None = None) -> dict[str, Any]:
        """Read, decide and write the record `name` as one step, under the experiment's record lock:
        `change(current)` gets the record as it is now (None when there is none) and returns the new one,
        whose `revision` is set here (one more than the current). With `expect`, the write happens only
        if the record's revision is still the one the caller read; else StaleRecord (compare-and-swap:
        the caller decides again on what is there now). Returns the record written."""
        with record_lock(
            self.b.fs,
            self.b.join(check_name(experiment), ".records.lock"),
            local_root=Path(self.b.root) if self.b.local else None,
        ):
            current = self.read(experiment, name)
            if current is None and self.has(experiment, name):
                raise StoreError(
                    f"{self.b.join(experiment, name)}: unreadable (not the JSON the store wrote); restore it from a "
                    f"backup or move it aside (the experiment's history is in it)"
                )
            revision = current.get("revision", 0) if isinstance(current, dict) else 0
            if expect is not None and revision != expect:
                raise StaleRecord(f"{experiment}/{name} changed (revision {expect} -> {revision}) since it was read")
            new = change(current)
            new["revision"] = revision + 1
            self.write(experiment, name, new)
            return new

    # -- the cycle's verdicts --------------------------------------------------------------------
    def record_decision(self, experiment: str, record: dict[str, Any]) -> str:
        """Keep one verdict of the cycle (it names the evaluation it judged); never overwritten."""
        name = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%f')}-{uuid.uuid4().hex[:6]}.json"
        path = self.b.join(check_name(experiment), "decisions", name)
        return self.b.write_text(path, json.dumps({**record, "recorded_at": now_iso()}, indent=1, default=str))

    def decisions(self, experiment: str) -> list[dict[str, Any]]:
        """Every recorded verdict, oldest first."""
        entries = sorted(self.b.entries(self.b.join(check_name(experiment), "decisions")))
        return [
            r
            for e in entries
            if e.endswith(".json") and schemas.parse(schemas.Verdict, r := self.b.read_json(e)) is not None
        ]

    def verdicts_by_eval(self, experiment: str) -> dict[int, dict[str, Any]]:
        """The newest verdict recorded for each eval version."""
        out: dict[int, dict[str, Any]] = {}
        for d in self.decisions(experiment):
            if isinstance(d.get("eval_version"), int):
                out[d["eval_version"]] = d
        return out

    # -- failed attempts ---------------------------------------------------------------------------
    def record_failure(self, staging: Path | None, manifest: dict[str, Any], error: str) -> str:
        """Keep a failed attempt beside the versions (with whatever it wrote, e.g. trajectories)."""
        experiment, stage = manifest["experiment"], manifest["stage"]
        name = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        record = {**manifest, "status": "failed", "error": error, "failed_at": now_iso()}
        text = json.dumps(record, indent=1, default=str)
        if staging is not None and staging.exists():
            files.write_text(self.b.cache, staging / "error.json", text)
            if self.b.local:
                target = files.ensure_dir(self.b.cache, Path(self.b.stage_path(experiment, stage)) / "failed") / name
                os.rename(staging, target)
                return str(target)
            remote = self.b.join(experiment, stage, "failed", name)
            rels = sorted(
                p.relative_to(staging).as_posix()
                for p in staging.rglob("*")
                if p.is_file() and not p.is_symlink() and p.name != "error.json"
            )
            self.b.upload(staging, remote, [*rels, "error.json"])  # error.json last: `failures` counts an attempt by it
            shutil.rmtree(staging, ignore_errors=True)
            return remote
        return self.b.write_text(self.b.join(experiment, stage, "failed", name, "error.json"), text)

    def failures(self, experiment: str, stage: str) -> list[dict[str, Any]]:
        entries = sorted(self.b.entries(self.b.join(check_name(experiment), stage, "failed")))
        return [
            r for e in entries if schemas.parse(schemas.Failure, r := self.b.read_json(f"{e}/error.json")) is not None
        ]
