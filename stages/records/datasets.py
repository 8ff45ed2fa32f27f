"""An experiment's data over time: its frozen held-out set, and what each night's training data added.

Frozen held-out set (`heldout/v<N>`, a version like a stage's: `rows.jsonl` and a manifest with the rows'
digest as its fingerprint). The first run of an experiment writes the held-out prompts its data gives;
every later run evaluates on exactly that set, whatever the data has become, so accuracies of two nights
are comparable; training rows equal to a frozen prompt are dropped and counted (`tasks.with_frozen_heldout`).
Frozen means frozen: at every run the set's files are checked against the digests its manifest recorded;
a set that was edited, deleted or whose manifest is damaged stops the run (`HeldoutDamaged`, exit 1, naming
the file and the one way out) instead of being rebuilt, and restoring an older version does not switch
back silently either (the newest version is the set). Only a person's `regimen heldout refresh ... --reason`
starts a new set (recorded with who and why); it leaves out every prompt the experiment has trained on
(the data versions' prompts: the champion's lineage trained on no others), counted in its manifest
(`excluded_trained`). Accuracies are only compared within one set. Every write here happens under the
experiment's lock (the run's, or refresh's), and a version is only ever added, never rewritten. Stages receive the set
as an input reference (`inputs["heldout"]`), so it enters every fingerprint by its content.

Training data versions (`data/v<N>`): written when the training rows differ from the last version's,
with how many rows there are, how many are new since the last version, how many left, and how many were
dropped as held-out prompts; `rows.json` keeps each row's short digest for the next comparison. A night
whose data did not change writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from typing import Any

from regimen.stages.core.errors import InputError, StoreError
from regimen.stages.store import Store, now_iso
from regimen.stages.tasks import normalized_prompt


class HeldoutDamaged(StoreError):
    """The experiment's frozen held-out set no longer matches its recorded digests (or is gone)."""


HELDOUT = "heldout"
DATA = "data"
ROWS = "rows.jsonl"


def _rows_digest(rows: list[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, default=str).encode() + b"\n")
    return h.hexdigest()


def _ref(store: Store, manifest: dict[str, Any]) -> dict[str, Any]:
    return {
        "stage": HELDOUT,
        "version": manifest["version"],
        "fingerprint": manifest["fingerprint"],
        "path": str(store.local_path(manifest)),
        "rows": manifest.get("rows"),
    }


WAY_OUT = (
    "restore it byte for byte, or start a new set (a person's decision; accuracies on the old and new sets are not "
    "compared): `regimen heldout refresh CONFIG --reason '...'`"
)


def _number(entry: str) -> int:
    """The version number a malformed entry names (its last `/v<N>` segment: the store's own path may hold others)."""
    found = re.findall(r"/v(\d+)(?=/|$| )", entry)
    return int(found[-1]) if found else 0


def problem(store: Store, experiment: str) -> str | None:
    """Why the experiment's frozen held-out set cannot be used (damaged, edited, missing), or None."""
    versions, malformed = store.scan(experiment, HELDOUT)
    newest = versions[-1]["version"] if versions else 0
    later = [m for m in malformed if _number(m) > newest]
    if later:  # a damaged manifest newer than the newest good set (an older one was replaced by a person's refresh)
        return f"its manifest is damaged: {', '.join(later)}"
    if versions:
        newest = versions[-1]
        bad = store.check(newest)
        if bad:
            where = store.version_path(experiment, HELDOUT, newest["version"])
            return f"set v{newest['version']} at {where} no longer matches its recorded digests ({'; '.join(bad)})"
        return None
    if store.versions(experiment, DATA) or store.has_record(experiment, "champion.json"):
        return f"the experiment has run before, but its set is gone from {store.stage_path(experiment, HELDOUT)}"
    return None


def current(store: Store, experiment: str) -> dict[str, Any] | None:
    """A reference to the experiment's frozen held-out set (its newest version), or None before its first
    run. Raises HeldoutDamaged when the set was edited, deleted or its manifest damaged (see the module doc)."""
    if (why := problem(store, experiment)) is not None:
        raise HeldoutDamaged(
            f"the frozen held-out set of {experiment!r} cannot be used: {why}. Runs stop until it is fixed: {WAY_OUT}"
        )
    versions = store.versions(experiment, HELDOUT)
    return _ref(store, versions[-1]) if versions else None


def freeze(
    store: Store,
    experiment: str,
    rows: list[dict[str, Any]],
    *,
    by: str,
    reason: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write `rows` as the experiment's new frozen held-out set; returns its reference."""
    handle = store.stage(experiment, HELDOUT)
    staging = handle.staging_dir()
    try:
        (staging / ROWS).write_text("".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows))
        manifest = handle.commit(
            staging,
            {
                "experiment": experiment,
                "stage": HELDOUT,
                "fingerprint": _rows_digest(rows),
                "rows": len(rows),
                "by": by,
                "reason": reason,
                "inputs": {},
                "metrics": {},
                "finished_at": now_iso(),
                **(extra or {}),
            },
            min_version=_named_sets(store, experiment) + 1,
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _ref(store, manifest)


def refresh(store: Store, experiment: str, rows: list[dict[str, Any]], *, reason: str) -> dict[str, Any]:
    """A person's new frozen set from `rows`, leaving out every prompt the experiment has trained on (every
    recorded data version's: the champion, whoever promoted it, descends from those nights); how many
    were left out is in the reference and the manifest (`excluded_trained`). The caller holds the lock."""
    if not str(reason).strip():
        raise InputError("--reason: say why a new held-out set is started (it is recorded)")
    prompts, row_keys = trained(store, experiment)
    kept = [r for r in rows if prompt_key(r.get("prompt")) not in prompts and row_key(r) not in row_keys]
    if not kept:
        raise InputError(
            f"heldout refresh: all {len(rows)} held-out prompts of the recipe's data were trained on by "
            f"{experiment!r}; add new rows to the data first"
        )
    ref = freeze(store, experiment, kept, by="person", reason=reason, extra={"excluded_trained": len(rows) - len(kept)})
    return {**ref, "excluded_trained": len(rows) - len(kept)}


def prompt_key(prompt: Any) -> str:
    """A prompt's short identity after normalisation (the one the train/held-out split compares)."""
    return hashlib.sha256(normalized_prompt(prompt).encode()).hexdigest()[:16]


def trained(store: Store, experiment: str) -> tuple[set[str], set[str]]:
    """The prompt keys and row keys of every training row any recorded data version held (older versions
    kept only row keys: prompt and answer)."""
    prompts: set[str] = set()
    rows: set[str] = set()
    for manifest in store.versions(experiment, DATA):
        folder = store.local_path(manifest)
        for name, into in (("prompts.json", prompts), ("rows.json", rows)):
            try:
                into.update(json.loads((folder / name).read_text()))
            except FileNotFoundError:
                pass
            except (OSError, ValueError) as exc:
                raise StoreError(
                    f"{folder / name}: unreadable ({str(exc)[:80]}); the trained prompts cannot be told"
                ) from None
    return prompts, rows


def _named_sets(store: Store, experiment: str) -> int:
    """The highest set number the champion's record names (a set deleted from the store keeps its number:
    a new set never takes it, so two sets are never compared as one)."""
    rec = store.read_record(experiment, "champion.json")
    lines = [*(rec.get("history") or []), rec.get("champion") or {}] if isinstance(rec, dict) else []
    return max(
        (int(h["heldout_set"]) for h in lines if isinstance(h, dict) and isinstance(h.get("heldout_set"), int)),
        default=0,
    )


def resolve(store: Store, experiment: str, rows: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """(the frozen set's reference, whether it was frozen just now from `rows`: the experiment's first run)."""
    found = current(store, experiment)
    if found:
        return found, False
    return freeze(store, experiment, rows, by="flow", reason="the experiment's first run"), True


def row_key(row: dict[str, Any]) -> str:
    """A row's short identity (prompt and answer), for counting what is new."""
    return hashlib.sha256(
        json.dumps([row.get("prompt"), row.get("answer")], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]


def record_training_data(
    store: Store, experiment: str, train: list[dict[str, Any]], dropped_heldout: int
) -> dict[str, Any]:
    """What tonight's training data is next to the last recorded version (rows, new, gone, dropped as
    held-out); a new `data/v<N>` when it changed. Returns the summary (with `version`, `changed`)."""
    keys = [row_key(r) for r in train]
    digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()
    versions = store.versions(experiment, DATA)
    last = versions[-1] if versions else None
    if last is not None and last["fingerprint"] == digest:
        return {
            "version": last["version"],
            "changed": False,
            "digest": digest,
            "rows": len(keys),
            "new": 0,
            "gone": 0,
            "dropped_heldout": dropped_heldout,
        }
    before: set[str] = set()
    if last is not None:
        try:
            before = set(json.loads((store.local_path(last) / "rows.json").read_text()))
        except (OSError, ValueError):
            before = set()
    now = set(keys)
    summary = {
        "rows": len(keys),
        "new": len(now - before),
        "gone": len(before - now),
        "dropped_heldout": dropped_heldout,
    }
    handle = store.stage(experiment, DATA)
    staging = handle.staging_dir()
    try:
        (staging / "rows.json").write_text(json.dumps(sorted(now)))
        (staging / "prompts.json").write_text(json.dumps(sorted({prompt_key(r.get("prompt")) for r in train})))
        manifest = handle.commit(
            staging,
            {
                "experiment": experiment,
                "stage": DATA,
                "fingerprint": digest,
                "inputs": {},
                "metrics": {k: float(v) for k, v in summary.items()},
                **summary,
                "finished_at": now_iso(),
            },
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"version": manifest["version"], "changed": True, "digest": digest, **summary}
