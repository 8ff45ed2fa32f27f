"""An experiment's data over time: its frozen held-out set, and what each night's training data added.

Frozen held-out set (`heldout/v<N>`, a version like a stage's: `rows.jsonl` and a manifest with the rows'
digest as its fingerprint). The first run of an experiment writes the held-out prompts its data gives;
every later run evaluates on exactly that set, whatever the data has become, so accuracies of two nights
are comparable; training rows equal to a frozen prompt are dropped and counted (`tasks.with_frozen_heldout`).
`refresh` starts a new set (a person's decision, recorded with who and why); accuracies are only compared
within one set. Stages receive the set as an input reference (`inputs["heldout"]`), so it enters every
fingerprint by its content.

Training data versions (`data/v<N>`): written when the training rows differ from the last version's,
with how many rows there are, how many are new since the last version, how many left, and how many were
dropped as held-out prompts; `rows.json` keeps each row's short digest for the next comparison. A night
whose data did not change writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from typing import Any

from regimen.stages.store import Store, now_iso

HELDOUT = "heldout"
DATA = "data"
ROWS = "rows.jsonl"


def _rows_digest(rows: list[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, default=str).encode() + b"\n")
    return h.hexdigest()


def _ref(store: Store, manifest: dict[str, Any]) -> dict[str, Any]:
    return {"stage": HELDOUT, "version": manifest["version"], "fingerprint": manifest["fingerprint"],
            "path": str(store.local_path(manifest)), "rows": manifest.get("rows")}


def current(store: Store, experiment: str) -> dict[str, Any] | None:
    """A reference to the experiment's frozen held-out set (the newest intact version), or None."""
    for manifest in reversed(store.versions(experiment, HELDOUT)):
        if not store.check(manifest):
            return _ref(store, manifest)
    return None


def freeze(store: Store, experiment: str, rows: list[dict[str, Any]], *, by: str, reason: str) -> dict[str, Any]:
    """Write `rows` as the experiment's new frozen held-out set; returns its reference."""
    staging = store.staging_dir(experiment, HELDOUT)
    try:
        (staging / ROWS).write_text("".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows))
        manifest = store.commit(staging, {"experiment": experiment, "stage": HELDOUT, "fingerprint": _rows_digest(rows), "rows": len(rows),
                                          "by": by, "reason": reason, "inputs": {}, "metrics": {}, "finished_at": now_iso()})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _ref(store, manifest)


def resolve(store: Store, experiment: str, rows: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """(the frozen set's reference, whether it was frozen just now from `rows`: the experiment's first run)."""
    found = current(store, experiment)
    if found:
        return found, False
    return freeze(store, experiment, rows, by="flow", reason="the experiment's first run"), True


def row_key(row: dict[str, Any]) -> str:
    """A row's short identity (prompt and answer), for counting what is new."""
    return hashlib.sha256(json.dumps([row.get("prompt"), row.get("answer")], sort_keys=True, default=str).encode()).hexdigest()[:16]


def record_training_data(store: Store, experiment: str, train: list[dict[str, Any]], dropped_heldout: int) -> dict[str, Any]:
    """What tonight's training data is next to the last recorded version (rows, new, gone, dropped as
    held-out); a new `data/v<N>` when it changed. Returns the summary (with `version`, `changed`)."""
    keys = [row_key(r) for r in train]
    digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()
    versions = store.versions(experiment, DATA)
    last = versions[-1] if versions else None
    if last is not None and last["fingerprint"] == digest:
        return {"version": last["version"], "changed": False, "digest": digest, "rows": len(keys), "new": 0, "gone": 0, "dropped_heldout": dropped_heldout}
    before: set[str] = set()
    if last is not None:
        try:
            before = set(json.loads((store.local_path(last) / "rows.json").read_text()))
        except (OSError, ValueError):
            before = set()
    now = set(keys)
    summary = {"rows": len(keys), "new": len(now - before), "gone": len(before - now), "dropped_heldout": dropped_heldout}
    staging = store.staging_dir(experiment, DATA)
    try:
        (staging / "rows.json").write_text(json.dumps(sorted(now)))
        manifest = store.commit(staging, {"experiment": experiment, "stage": DATA, "fingerprint": digest, "inputs": {},
                                          "metrics": {k: float(v) for k, v in summary.items()}, **summary, "finished_at": now_iso()})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"version": manifest["version"], "changed": True, "digest": digest, **summary}
