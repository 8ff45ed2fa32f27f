"""An experiment's records in the store: its named records (champion.json, the data versions), the cycle's
verdicts (`<experiment>/decisions/`) and the stages' failed attempts (`<experiment>/<stage>/failed/`).

Records change only by `update`: a read-decide-write under the experiment's record lock, fenced at the write.
Each revision of a record is claimed by an exclusive create of `<experiment>/revisions/<name>/r<revision>.json`
(a conditional PUT in a bucket, O_EXCL on disk) holding what that revision changed; only then is the record
itself rewritten. Two writers that read the same revision can never both write the next one: the second
claim is refused at the write itself, whatever paused whom (a holder stopped past the lock's expiry resumes
and is refused; a run deciding on a stale read is refused). Reads roll the record forward through any claims
newer than it (a writer stopped between its claim and its rewrite), so a claimed revision is never lost and
no revision number is ever written twice. Verdicts and failed attempts are only ever added.
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
from regimen.stages.store.lock import exclusive_create, record_lock

REVISIONS = "revisions"


def _delta(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """What revision `new` changed of `old`: the keys it set (a `history` list as the lines it appended, when
    it kept the old ones as they were), the keys it removed, and when and by whom."""
    set_, history = {}, None
    for key, value in new.items():
        if key == "history" and isinstance(value, list) and isinstance(old.get("history"), list):
            kept = len(old["history"])
            if value[:kept] == old["history"]:
                history = value[kept:]
                continue
        if old.get(key) != value:
            set_[key] = value
    out: dict[str, Any] = {"revision": new["revision"], "set": set_, "removed": sorted(set(old) - set(new))}
    if history is not None:
        out["history_added"] = history
    out["claimed"] = {"at": now_iso(), "pid": os.getpid()}
    return out


def _apply(record: dict[str, Any], delta: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in record.items() if k not in delta.get("removed", [])}
    out.update(delta.get("set") or {})
    if "history_added" in delta:
        out["history"] = [*(record.get("history") or []), *delta["history_added"]]
    out["revision"] = delta["revision"]
    return out


def _by(claim: dict[str, Any]) -> str:
    lines = claim.get("history_added") or []
    what = lines[-1] if lines and isinstance(lines[-1], dict) else {}
    parts = [
        f"{what.get('event')} by {what.get('by')}" if what.get("event") else "",
        (claim.get("claimed") or {}).get("at"),
    ]
    shown = ", ".join(p for p in parts if p)
    return f" ({shown})" if shown else ""


DAMAGED = "damaged.json"
"""In a stage's folder: the versions runs found damaged (`Ledger.record_damaged`)."""


class StaleRecord(StoreError):
    """A record changed since the caller read it (a person's move landed meanwhile): decide again."""


class Ledger:
    """The experiment-level records, the verdicts and the failed attempts of one store (behind `Store`)."""

    def __init__(self, backend: Backend):
        self.b = backend

    # -- named records -------------------------------------------------------------------------
    def write(self, experiment: str, name: str, data: dict[str, Any]) -> str:
        """Replace the experiment-level record `name` (e.g. champion.json) atomically."""
        return self.b.write_text(self.b.join(check_name(experiment), name), json.dumps(data, indent=1, default=str))

    def read(self, experiment: str, name: str) -> Any:
        """The experiment-level record `name` at its newest claimed revision, or None when there is none (or it
        is unreadable)."""
        there, found = self.b.read_json_there(self.b.join(check_name(experiment), name))
        if there and found is None:
            return None  # unreadable: its readers stop (rolling forward from nothing would start a new history)
        return self._rolled_forward(experiment, name, found)

    def has(self, experiment: str, name: str) -> bool:
        """Whether the record's file exists (readable or not)."""
        path = self.b.join(check_name(experiment), name)
        return os.path.lexists(path) if self.b.local else bool(self.b.fs.exists(path))

    def revision_path(self, experiment: str, name: str, revision: int) -> str:
        """Where revision `revision` of record `name` is claimed."""
        return self.b.join(check_name(experiment), REVISIONS, name, f"r{revision:08d}.json")

    def _rolled_forward(self, experiment: str, name: str, record: Any) -> Any:
        """`record` with every revision claimed after it applied, in order (one missing read when none is)."""
        if record is not None and not isinstance(record, dict):
            return record
        revision = (record or {}).get("revision", 0)
        while True:
            path = self.revision_path(experiment, name, revision + 1)
            there, delta = self.b.read_json_there(path)
            if not there:
                return record
            if delta is None:
                raise StoreError(f"{path}: unreadable (not the JSON the store wrote); restore it or move it aside")
            record, revision = _apply(record or {}, delta), revision + 1

    def update(self, experiment: str, name: str, change, *, expect: int | None = None) -> dict[str, Any]:
        """Read, decide and write the record `name` as one step, under the experiment's record lock:
        `change(current)` gets the record as it is now (None when there is none) and returns the new one,
        whose `revision` is set here (one more than the current). With `expect`, the write happens only
        if the record's revision is still the one the caller read; else StaleRecord (compare-and-swap:
        the caller decides again on what is there now). The new revision is claimed by an exclusive create
        before the record is rewritten: a claim refused (another writer wrote that revision while this one
        was paused) is StaleRecord too, and nothing is written. Returns the record written."""
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
            self._claim(experiment, name, revision + 1, _delta(current or {}, new))
            self.write(experiment, name, new)
            return new

    def _claim(self, experiment: str, name: str, revision: int, delta: dict[str, Any]) -> None:
        """The fence: revision `revision` of `name` is this writer's, or StaleRecord naming who has it."""
        path = self.revision_path(experiment, name, revision)
        if self.b.local:
            files.ensure_dir(Path(self.b.root), Path(path).parent)
            files.check_no_links(Path(self.b.root), Path(path))
        with self.b.answers(f"claiming {path}"):
            made = exclusive_create(self.b.fs, path, json.dumps(delta, default=str).encode())
        if not made:
            other = self.b.read_json(path) or {}
            raise StaleRecord(
                f"{experiment}/{name}: revision {revision} was written meanwhile by another process"
                f"{_by(other)}; this write is refused and nothing of it was written"
            )

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

    def last_failure(self, experiment: str, stage: str) -> tuple[int, dict[str, Any] | None]:
        """How many failed attempts a stage has, and the newest one's record: one listing and one read."""
        entries = sorted(self.b.entries(self.b.join(check_name(experiment), stage, "failed")))
        for e in reversed(entries):
            if (r := schemas.parse(schemas.Failure, self.b.read_json(f"{e}/error.json"))) is not None:
                return len(entries), r
        return len(entries), None

    def recover_unrecorded(self, experiment: str) -> int:
        """Failed attempts of `experiment` this host kept in `$REGIMEN_CACHE/unrecorded` because the store refused
        them (down, full, its key revoked), recorded in the store now that it answers; how many. Best effort: a
        store still refusing leaves them where they are."""
        base = Path(os.environ.get("REGIMEN_CACHE", Path.home() / ".cache" / "regimen")) / "unrecorded"
        moved = 0
        for path in sorted(base.glob(f"{check_name(experiment)}-*.json")):
            try:
                record = json.loads(path.read_text())
                if record.get("experiment") != experiment or not isinstance(record.get("stage"), str):
                    continue
                self.record_failure(None, {**record, "recorded_late": True}, str(record.get("error", "")))
                path.unlink()
                moved += 1
            except (OSError, ValueError, StoreError):
                break
        return moved

    # -- versions a run found damaged ----------------------------------------------------------------
    def record_damaged(self, experiment: str, stage: str, found: list[dict[str, Any]]) -> None:
        """Versions a run found damaged and did not reuse (`found`: `{"version", "problems"}` each), kept in the
        stage's `damaged.json` so `regimen status` names them without hashing every version's files."""
        path = self.b.join(check_name(experiment), stage, DAMAGED)
        current = self.b.read_json(path)
        current = current if isinstance(current, dict) else {}
        for d in found:
            problems = [str(p) for p in d.get("problems", [])][:5]
            current[str(d["version"])] = {"problems": problems, "found_at": now_iso()}
        self.b.write_text(path, json.dumps(current, indent=1))

    def damaged(self, experiment: str, stage: str) -> dict[int, dict[str, Any]]:
        """What `record_damaged` kept: {version: {"problems", "found_at"}} (empty when none, or unreadable)."""
        found = self.b.read_json(self.b.join(check_name(experiment), stage, DAMAGED))
        if not isinstance(found, dict):
            return {}
        return {int(k): v for k, v in found.items() if str(k).isdigit() and isinstance(v, dict)}

    def failures(self, experiment: str, stage: str) -> list[dict[str, Any]]:
        entries = sorted(self.b.entries(self.b.join(check_name(experiment), stage, "failed")))
        return [
            r for e in entries if schemas.parse(schemas.Failure, r := self.b.read_json(f"{e}/error.json")) is not None
        ]
