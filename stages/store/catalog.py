"""A stage's versions in the store: scan, find (by fingerprint, intact only), check, verify, read, commit.

A folder counts as a version only when its manifest is well-formed and says `completed`. Reuse checks
integrity: `find_intact` returns a version only when its files match the manifest (size and mtime
first; the full sha256 when either differs), and reports damaged ones. A remote store's versions are read
through the local cache (`copies.py`); commit there claims `v<N>` by an exclusive create and writes the
manifest last (see the package's docstring).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from regimen.stages.core.errors import RegimenError, StoreError
from regimen.stages.store import files
from regimen.stages.store.backend import CLAIM, MANIFEST, VERSION, Backend, now_iso, sha256_file, well_formed
from regimen.stages.store.copies import RemoteCopies
from regimen.stages.store.index import StageIndex
from regimen.stages.store.lock import exclusive_create, lost_lease

log = logging.getLogger("regimen.store")


def _stats(root: Path) -> tuple[dict[str, str], dict[str, list[int]]]:
    """Relative path → sha256, and → [size, mtime_ns], for every file under `root` but the manifest."""
    digests, stats = {}, {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_symlink():
            raise StoreError(
                f"{p}: a stage wrote a symbolic link into its version folder; versions hold plain files only"
            )
        if p.is_file() and p.name != MANIFEST:
            rel = p.relative_to(root).as_posix()
            st = p.stat()
            digests[rel] = sha256_file(p)
            stats[rel] = [st.st_size, st.st_mtime_ns]
    return digests, stats


class Catalog:
    """The versions of every stage of every experiment in one store."""

    def __init__(self, backend: Backend):
        self.b = backend
        self.copies = RemoteCopies(backend)
        self.index = StageIndex(backend)

    # -- reading -----------------------------------------------------------------------------
    def scan(self, experiment: str, stage: str) -> tuple[list[dict[str, Any]], list[str]]:
        """Completed versions' manifests (oldest first) and folders whose manifest is malformed."""
        found, malformed = [], []
        for entry in self.b.entries(self.b.stage_path(experiment, stage)):
            m = VERSION.match(entry.rsplit("/", 1)[-1])
            if not m:
                continue
            if self.b.local and Path(entry).is_symlink():
                malformed.append(f"{entry} (a symbolic link)")
                continue
            manifest = self.b.read_json(f"{entry}/{MANIFEST}")
            if manifest is None and not self.b.fs.exists(f"{entry}/{MANIFEST}"):
                continue  # a version being moved into place
            if not well_formed(manifest) or manifest["version"] != int(m.group(1)) or manifest["stage"] != stage:
                malformed.append(f"{entry}/{MANIFEST}")
                continue
            if manifest["status"] == "completed":
                found.append(manifest)
        return sorted(found, key=lambda m: m["version"]), malformed

    def versions(self, experiment: str, stage: str) -> list[dict[str, Any]]:
        """Completed versions, oldest first, as their index entries (`index.summary`: the manifest without its
        file lists and bulky extras; `manifest()` reads one whole). One read of the stage's index."""
        entries = self.index.read(experiment, stage)["versions"]
        return [entries[k] for k in sorted(entries, key=int)]

    def malformed(self, experiment: str, stage: str) -> list[str]:
        return self.scan(experiment, stage)[1]

    def manifest(self, experiment: str, stage: str, version: int) -> dict[str, Any] | None:
        """Version `version`'s whole manifest, or None when it is not a well-formed completed one."""
        found = self.b.read_json(f"{self.b.version_path(experiment, stage, version)}/{MANIFEST}")
        ok = well_formed(found) and found["version"] == version and found["stage"] == stage
        return found if ok and found["status"] == "completed" else None

    def whole(self, entry: dict[str, Any]) -> dict[str, Any]:
        """A version's manifest for an index entry (the entry itself when it is one already); StoreError when the
        version is gone (its index is rebuilt from the manifests then)."""
        if "files" in entry:
            return entry
        found = self.manifest(entry["experiment"], entry["stage"], entry["version"])
        if found is None:
            self.index.rebuild(entry["experiment"], entry["stage"])
            raise StoreError(
                f"{entry['experiment']}/{entry['stage']} v{entry['version']}: listed in its index but its manifest is "
                "gone or damaged; the index was rebuilt from the manifests"
            )
        return found

    def latest(self, experiment: str, stage: str) -> dict[str, Any] | None:
        versions = self.versions(experiment, stage)
        return self.whole(versions[-1]) if versions else None

    def find_intact(self, experiment: str, stage: str, key: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The newest completed version with this fingerprint whose files match the manifest, and the
        damaged ones passed over on the way ({version, problems}). Found through the index; the chosen
        version's own manifest is read and its files checked against it."""
        damaged = []
        for entry in reversed(self.versions(experiment, stage)):
            if entry.get("fingerprint") != key:
                continue
            manifest = self.manifest(experiment, stage, entry["version"])
            if manifest is None:
                damaged.append({"version": entry["version"], "problems": ["manifest.json: missing or damaged"]})
                self.index.rebuild(experiment, stage)
                continue
            if manifest.get("fingerprint") != key:  # the index is stale (a manifest changed behind the store's back)
                self.index.rebuild(experiment, stage)
                return self.find_intact(experiment, stage, key)
            problems = self.check(manifest)
            if not problems and not self.b.local:
                # the files as they arrive, by sha256: reuse reads them next anyway
                problems = self.copies.fetch(manifest)[1]
            if not problems:
                return manifest, damaged
            damaged.append({"version": manifest["version"], "problems": problems})
        return None, damaged

    def find(self, experiment: str, stage: str, key: str) -> dict[str, Any] | None:
        return self.find_intact(experiment, stage, key)[0]

    def check(self, manifest: dict[str, Any]) -> list[str]:
        """Problems with a version's files (empty: intact). Fast path: size and mtime as recorded at
        commit; a file whose size differs is damaged; one whose mtime differs is hashed. In a remote
        store: sizes in the bucket, and the local cache's copy (when there is one) by its own fast path;
        the sha256 of what the bucket holds is checked as it comes into the cache (`local_path`)."""
        manifest = self.whole(manifest)
        if not self.b.local:
            return self.copies.check(manifest)
        base = self.b.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
        stats = manifest.get("file_stats") or {}
        problems = []
        for rel, digest in manifest["files"].items():
            p = Path(f"{base}/{rel}")
            try:
                if p.is_symlink():
                    problems.append(f"{rel}: replaced by a symbolic link")
                    continue
                st = p.stat()
            except (FileNotFoundError, NotADirectoryError):
                problems.append(f"{rel}: missing")
                continue
            expected = stats.get(rel)
            if expected and st.st_size != expected[0]:
                problems.append(f"{rel}: size {st.st_size} != {expected[0]} recorded")
                continue
            if expected and st.st_mtime_ns == expected[1]:
                continue
            if self._sha256(str(p)) != digest:
                problems.append(f"{rel}: sha256 differs from the manifest")
        return problems

    def _sha256(self, path: str) -> str:
        h = hashlib.sha256()
        with self.b.fs.open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
        return h.hexdigest()

    def verify(self, manifest: dict[str, Any]) -> list[str]:
        """Files whose sha256 no longer matches the manifest (empty list: intact); always hashes."""
        manifest = self.whole(manifest)
        base = self.b.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
        bad = []
        for rel, digest in manifest.get("files", {}).items():
            try:
                if self._sha256(f"{base}/{rel}") != digest:
                    bad.append(rel)
            except (FileNotFoundError, NotADirectoryError):
                bad.append(rel)
        return bad

    def local_path(self, manifest: dict[str, Any]) -> Path:
        """A local folder holding this version's files: the version itself in a local store; in a remote
        one, the local cache's copy, downloaded once and checked file by file against the manifest's
        sha256 (StoreError naming the files when the bucket's copy does not match: a damaged version)."""
        remote = self.b.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
        if self.b.local:
            return Path(remote)
        manifest = self.whole(manifest)
        target, problems = self.copies.fetch(manifest)
        if problems:
            raise StoreError(f"{remote} is damaged ({'; '.join(problems[:3])}); it is not used")
        return target

    # -- writing -----------------------------------------------------------------------------
    def next_version(self, experiment: str, stage: str) -> int:
        """The next number by the stage's index (a number another writer claimed meanwhile is stepped over by
        the commit: a local rename or a remote claim is refused, and the next one tried)."""
        return self.index.read(experiment, stage)["next"]

    def commit(self, staging: Path, manifest: dict[str, Any], *, min_version: int = 1) -> dict[str, Any]:
        """Digest the staged files, write the manifest last, and move the folder into place as v<N>
        (N at least `min_version`: a number records elsewhere still name is never given to new content)."""
        experiment, stage = manifest["experiment"], manifest["stage"]
        if lost_lease(self.b.url, experiment).is_set():
            raise StoreError(
                f"{experiment}/{stage}: this run lost the experiment's lease in {self.b.url} (another run may hold "
                f"it); nothing committed"
            )
        digests, stats = _stats(staging)
        manifest = {**manifest, "status": "completed", "files": digests, "file_stats": stats}
        try:
            tried = 0
            for _ in range(100):
                version = max(self.next_version(experiment, stage), min_version, tried + 1)
                tried = version
                manifest["version"] = version
                (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=False, default=str))
                target = self.b.version_path(experiment, stage, version)
                if self.b.local:
                    files.check_no_links(Path(self.b.root), Path(target).parent)
                    try:
                        os.rename(staging, target)  # atomic; fails if target exists (as a folder with content)
                        self.index.read(experiment, stage)  # rolls forward to the new version, written back
                        return manifest
                    except OSError:
                        if not os.path.lexists(target):
                            raise
                        continue
                if not self._claim(target):
                    continue  # another writer has this number: take the next
                self.b.upload(staging, target, [*digests, MANIFEST])
                shutil.rmtree(staging, ignore_errors=True)
                self.index.read(experiment, stage)  # rolls forward to the new version, written back
                return manifest
        except RegimenError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot commit {experiment}/{stage}: {files.describe_os_error(exc, staging)}") from None
        raise StoreError(f"could not allocate a version for {experiment}/{stage}")

    def _claim(self, target: str) -> bool:
        """Claim a remote version folder (exclusive create of `v<N>/.claim`): False when another writer has it."""
        with self.b.answers(f"claiming {target}"):
            return exclusive_create(
                self.b.fs, f"{target}/{CLAIM}", json.dumps({"by": f"pid {os.getpid()}", "at": now_iso()}).encode()
            )

    def left_behind(self, experiment: str, stage: str) -> str:
        """Claimed version folders past the index without a manifest, and their files, in words (for a stop's
        message); "nothing" when there are none or the store cannot be asked."""
        if self.b.local:
            return "nothing (a local commit is one rename)"
        try:
            n = self.index.read(experiment, stage)["next"]
            found = []
            while self.b.fs.exists(f"{self.b.version_path(experiment, stage, n)}/{CLAIM}"):
                files = self.b.fs.find(self.b.version_path(experiment, stage, n))
                found.append(f"v{n}: a claim and {len(files) - 1} file(s)")
                n += 1
        except Exception:  # noqa: BLE001 - the store is what failed: say we cannot tell
            return (
                "whatever the failed upload had written (the store cannot be asked now); the next run's lease sweeps it"
            )
        return (", ".join(found) + ", swept by the next run's lease") if found else "nothing"

    def sweep_claims(self, experiment: str) -> None:
        """Claimed version folders that never got their manifest (a writer killed mid-upload), removed under the
        experiment's lease (no other writer of this experiment runs). Only the numbers past each stage's index are
        looked at: a claim is always the newest number its writer saw, so the sweep reads no history."""
        with self.b.answers(f"sweeping {self.b.join(experiment)}"):
            for stage_dir in self.b.entries(self.b.join(experiment)):
                stage = stage_dir.rsplit("/", 1)[-1]
                if stage.startswith(".") or not self.b.fs.isdir(stage_dir):
                    continue
                index = self.index.read(experiment, stage)
                n, left = index["next"], list(index.get("claims", []))
                while self.b.fs.exists(f"{self.b.version_path(experiment, stage, n)}/{CLAIM}"):
                    left.append(n)
                    n += 1
                for number in left:
                    entry = self.b.version_path(experiment, stage, number)
                    if not self.b.fs.exists(f"{entry}/{MANIFEST}"):
                        log.warning("removing %s: a version claimed by a run that never finished uploading it", entry)
                        self.b.fs.rm(entry, recursive=True)
                if index.get("claims"):
                    index["claims"] = []
                    self.index.write(experiment, stage, index)
