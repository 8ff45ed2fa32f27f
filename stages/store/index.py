"""A stage's index: the small object every lookup reads instead of the history (`<experiment>/<stage>/index.json`).

One object per stage of an experiment: the next version number and, per completed version, its summary (the
manifest without the file lists, the resolved configuration and bulky extras, plus its bytes). Whether an intact
version with a fingerprint exists, the latest version, the next number, what `status` shows and the champion's
lineage come from here: one read, whatever the history's length. Reuse still reads the chosen version's own
manifest and checks its files against it.

Written after the version's manifest (the manifest is what makes a version; the index follows it):
- a crash between the two leaves the index one version behind: every read rolls it forward, probing
  `v<next>/manifest.json` (and past claimed numbers whose writer never finished), so the version is found;
- a missing or damaged index (not the JSON this module writes) is rebuilt from the manifests, once, and written;
- an entry whose version has gone (a person's `rm`) is found when that version is read, and the index rebuilt;
- `regimen reindex EXPERIMENT` rebuilds every stage's index from the manifests; `regimen status --check` compares.
Versions removed by `regimen gc` leave a tombstone (`v<N>/removed.json`): the number stays taken.

Hand-written over a library: the index must live beside the versions in the same store (a bucket holds no
SQLite file safely shared by hosts), and its invariants are the store's own (manifest first, numbers never reused).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from regimen.stages.core.fingerprint import content_digest
from regimen.stages.store import files
from regimen.stages.store.backend import CLAIM, MANIFEST, VERSION, Backend, now_iso, well_formed

log = logging.getLogger("regimen.store")

INDEX = "index.json"
TOMBSTONE = "removed.json"
SCHEMA = 1
LEFT_OUT = ("files", "file_stats", "config", "heldout_probe", "curriculum", "reward_audit", "launch", "libraries_all")
"""Manifest keys a summary leaves out: the bulk a lookup never needs (reuse reads the manifest itself)."""
PAST_CLAIMS = 8
"""Claimed numbers without a manifest (a killed writer, or one still uploading) a roll-forward steps over."""


def summary(manifest: dict[str, Any]) -> dict[str, Any]:
    """A version's entry in its stage's index."""
    out = {k: v for k, v in manifest.items() if k not in LEFT_OUT}
    stats = manifest.get("file_stats") or {}
    out["bytes"] = int(sum(s[0] for s in stats.values() if isinstance(s, list) and s))
    out["n_files"] = len(manifest.get("files") or {})
    out["has_model"] = any(rel.startswith("model/") for rel in manifest.get("files") or {})
    out["content"] = content_digest(manifest)  # what its model is, byte for byte (None without one)
    return out


def _well_formed(index: Any) -> bool:
    return (
        isinstance(index, dict)
        and index.get("schema") == SCHEMA
        and isinstance(index.get("next"), int)
        and isinstance(index.get("versions"), dict)
        and all(isinstance(e, dict) and e.get("version") == int(k) for k, e in index["versions"].items())
    )


class StageIndex:
    """The index of every stage of every experiment in one store (`Catalog.index`)."""

    def __init__(self, backend: Backend):
        self.b = backend

    def path(self, experiment: str, stage: str) -> str:
        return self.b.join(experiment, stage, INDEX)

    def read(self, experiment: str, stage: str) -> dict[str, Any]:
        """The stage's index, rolled forward to the newest manifest (written back when it moved), rebuilt from
        the manifests when missing or damaged."""
        raw = self.b.read_json(self.path(experiment, stage))
        if not _well_formed(raw):
            if raw is not None or self._exists(self.path(experiment, stage)):
                log.warning(
                    "%s: damaged (not the index the store writes): rebuilt from the manifests",
                    self.path(experiment, stage),
                )
            return self.rebuild(experiment, stage)
        moved = self._roll_forward(experiment, stage, raw)
        if self._settle_claims(experiment, stage, raw) or moved:
            self.write(experiment, stage, raw)
        return raw

    def _settle_claims(self, experiment: str, stage: str, index: dict[str, Any]) -> bool:
        """Claims the index holds whose manifest has since been written: versions now. Two writers committing at
        once (no lease between them) can each roll forward past the other's number while it is still a claim; the
        claim is looked at again on every read until it is a version or swept (claims are rare: one read each)."""
        settled = False
        for n in list(index.get("claims", [])):
            manifest = self.b.read_json(f"{self.b.version_path(experiment, stage, n)}/{MANIFEST}")
            if well_formed(manifest) and manifest["version"] == n and manifest["stage"] == stage:
                if manifest["status"] == "completed":
                    index["versions"][str(n)] = summary(manifest)
                index["claims"] = [c for c in index["claims"] if c != n]
                settled = True
        return settled

    def _roll_forward(self, experiment: str, stage: str, index: dict[str, Any]) -> bool:
        moved, n, skipped, claims = False, index["next"], 0, []
        while skipped <= PAST_CLAIMS:
            base = self.b.version_path(experiment, stage, n)
            manifest = self.b.read_json(f"{base}/{MANIFEST}")
            if well_formed(manifest) and manifest["version"] == n and manifest["stage"] == stage:
                if manifest["status"] == "completed":
                    index["versions"][str(n)] = summary(manifest)
                index["next"], skipped, moved = n + 1, 0, True
                index["claims"] = sorted({*index.get("claims", []), *claims})  # killed writers' numbers, swept later
                claims = []
            elif self._exists(f"{base}/{CLAIM}"):
                skipped += 1
                claims.append(n)
            elif self._exists(f"{base}/{TOMBSTONE}"):
                skipped += 1
            else:
                break
            n += 1
        return moved

    def rebuild(self, experiment: str, stage: str) -> dict[str, Any]:
        """The index made from the manifests (every one read once) and written."""
        index: dict[str, Any] = {"schema": SCHEMA, "next": 1, "versions": {}, "rebuilt_at": now_iso()}
        pending = self.b.read_json(self.b.join(experiment, "gc-pending.json")) or {}
        removing = {
            r.get("version") for r in pending.get("remove", []) if isinstance(r, dict) and r.get("stage") == stage
        }
        for entry in self.b.entries(self.b.stage_path(experiment, stage)):
            m = VERSION.match(entry.rsplit("/", 1)[-1])
            if not m:
                continue
            number = int(m.group(1))
            manifest = self.b.read_json(f"{entry}/{MANIFEST}")
            if well_formed(manifest) and manifest["version"] == number and manifest["stage"] == stage:
                if manifest["status"] == "completed" and number not in removing:  # a killed gc's plan stands
                    index["versions"][str(number)] = summary(manifest)
                index["next"] = max(index["next"], number + 1)
            elif manifest is not None or self._exists(f"{entry}/{TOMBSTONE}") or self._exists(f"{entry}/{MANIFEST}"):
                index["next"] = max(index["next"], number + 1)  # a damaged version or a tombstone keeps its number
            elif not self.b.local and self._exists(f"{entry}/{CLAIM}"):
                index.setdefault("claims", []).append(number)  # a killed writer's: swept under the next lease
        index["claims"] = sorted(n for n in index.get("claims", []) if n < index["next"])
        self._roll_forward(experiment, stage, index)
        if index["versions"] or index["next"] > 1 or self._exists(self.path(experiment, stage)):
            self.write(experiment, stage, index)  # (a stage never run gets no folder from a lookup)
        return index

    def write(self, experiment: str, stage: str, index: dict[str, Any]) -> None:
        text = json.dumps(index, default=str, separators=(",", ":"))
        if self.b.local:
            files.ensure_dir(Path(self.b.root), Path(self.b.stage_path(experiment, stage)))
        self.b.write_text(self.path(experiment, stage), text)

    def drop(self, experiment: str, stage: str, versions: list[int]) -> None:
        """Take versions out of the index (gc, before their files go)."""
        index = self.read(experiment, stage)
        for v in versions:
            index["versions"].pop(str(v), None)
        self.write(experiment, stage, index)

    def _exists(self, path: str) -> bool:
        return os.path.lexists(path) if self.b.local else bool(self.b.fs.exists(path))
