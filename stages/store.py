"""The versioned artifact store: `<store>/<experiment>/<stage>/v<N>/` with files and `manifest.json`.

Versions are never overwritten. A stage writes into a staging folder that is renamed into place only
when complete, so a crash leaves no half-written version; a folder counts as a version only when its
manifest says `completed`. Failed attempts are kept beside the versions (`failed/`), never as one.
The root is a local folder or any fsspec URL (`s3://bucket/regimen`, `memory://x`); for remote roots,
stages work in a local cache and the finished folder is uploaded, then moved into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import fsspec
from filelock import FileLock, Timeout
from fsspec.implementations.local import LocalFileSystem

from stages.errors import RegimenError

MANIFEST = "manifest.json"
_VERSION = re.compile(r"^v(\d+)$")


class ExperimentBusy(RegimenError):
    """Another run holds this experiment's lock."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def digest_tree(root: Path) -> dict[str, str]:
    """Relative path → sha256 for every file under `root` (the manifest's `files`)."""
    root = Path(root)
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def fingerprint(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


class Store:
    """A store rooted at a local folder or an fsspec URL."""

    def __init__(self, root: str | os.PathLike, cache_dir: str | os.PathLike | None = None):
        self.url = str(root)
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.local = isinstance(self.fs, LocalFileSystem)
        if self.local:
            self.root = str(Path(self.root).resolve())
            self.cache = Path(self.root)
        else:
            key = hashlib.sha256(self.url.encode()).hexdigest()[:12]
            base = Path(cache_dir or os.environ.get("REGIMEN_CACHE", Path.home() / ".cache" / "regimen"))
            self.cache = base / f"store-{key}"
        self.cache.mkdir(parents=True, exist_ok=True)

    # -- paths -------------------------------------------------------------------------------
    def _join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def stage_path(self, experiment: str, stage: str) -> str:
        return self._join(experiment, stage)

    def version_path(self, experiment: str, stage: str, version: int) -> str:
        return self._join(experiment, stage, f"v{version}")

    def local_stage_dir(self, experiment: str, stage: str) -> Path:
        """Where work for this stage happens on this machine (the store itself when local)."""
        d = self.cache / experiment / stage
        d.mkdir(parents=True, exist_ok=True)
        return d

    def work_dir(self, experiment: str, stage: str, key: str) -> Path:
        """A resumable work folder (Trainer checkpoints) for one fingerprint of one stage."""
        d = self.local_stage_dir(experiment, stage) / "work" / key[:16]
        d.mkdir(parents=True, exist_ok=True)
        return d

    # -- reading -----------------------------------------------------------------------------
    def _read_json(self, path: str) -> dict[str, Any] | None:
        try:
            with self.fs.open(path, "r") as fh:
                return json.load(fh)
        except (FileNotFoundError, json.JSONDecodeError, OSError):
            return None

    def versions(self, experiment: str, stage: str) -> list[dict[str, Any]]:
        """Completed versions' manifests, oldest first."""
        base = self.stage_path(experiment, stage)
        try:
            entries = self.fs.ls(base, detail=False)
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            m = _VERSION.match(entry.rstrip("/").rsplit("/", 1)[-1])
            if not m:
                continue
            manifest = self._read_json(f"{entry.rstrip('/')}/{MANIFEST}")
            if manifest and manifest.get("status") == "completed":
                found.append(manifest)
        return sorted(found, key=lambda m: m["version"])

    def experiments(self) -> list[str]:
        try:
            return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in self.fs.ls(self.root, detail=False) if self.fs.isdir(e))
        except FileNotFoundError:
            return []

    def find(self, experiment: str, stage: str, key: str) -> dict[str, Any] | None:
        """The newest completed version with this fingerprint whose files are all present."""
        for manifest in reversed(self.versions(experiment, stage)):
            if manifest.get("fingerprint") == key and self._files_present(manifest):
                return manifest
        return None

    def latest(self, experiment: str, stage: str) -> dict[str, Any] | None:
        versions = self.versions(experiment, stage)
        return versions[-1] if versions else None

    def _files_present(self, manifest: dict[str, Any]) -> bool:
        base = self.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
        if self.local:
            return all(os.path.isfile(f"{base}/{rel}") for rel in manifest.get("files", {}))
        return all(self.fs.exists(f"{base}/{rel}") for rel in manifest.get("files", {}))

    def verify(self, manifest: dict[str, Any]) -> list[str]:
        """Files whose sha256 no longer matches the manifest (empty list: intact)."""
        base = self.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
        bad = []
        for rel, digest in manifest.get("files", {}).items():
            try:
                with self.fs.open(f"{base}/{rel}", "rb") as fh:
                    h = hashlib.sha256()
                    while block := fh.read(1 << 20):
                        h.update(block)
                if h.hexdigest() != digest:
                    bad.append(rel)
            except FileNotFoundError:
                bad.append(rel)
        return bad

    def local_path(self, manifest: dict[str, Any]) -> Path:
        """A local folder holding this version's files (downloaded once for remote stores)."""
        remote = self.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
        if self.local:
            return Path(remote)
        target = self.cache / manifest["experiment"] / manifest["stage"] / "versions" / f"v{manifest['version']}-{manifest['fingerprint'][:12]}"
        if not (target / MANIFEST).exists():
            tmp = target.with_name(target.name + f".{uuid.uuid4().hex[:6]}")
            self.fs.get(remote.rstrip("/") + "/", str(tmp), recursive=True)
            try:
                os.rename(tmp, target)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        return target

    # -- writing -----------------------------------------------------------------------------
    def staging_dir(self, experiment: str, stage: str) -> Path:
        """A fresh local folder for a run's outputs; `commit` turns it into a version."""
        d = self.local_stage_dir(experiment, stage) / f".staging-{uuid.uuid4().hex[:12]}"
        d.mkdir(parents=True)
        return d

    def next_version(self, experiment: str, stage: str) -> int:
        base = self.stage_path(experiment, stage)
        try:
            names = [e.rstrip("/").rsplit("/", 1)[-1] for e in self.fs.ls(base, detail=False)]
        except FileNotFoundError:
            names = []
        used = [int(m.group(1)) for n in names if (m := _VERSION.match(n))]
        return max(used, default=0) + 1

    def commit(self, staging: Path, manifest: dict[str, Any]) -> dict[str, Any]:
        """Digest the staged files, write the manifest last, and move the folder into place as v<N>."""
        experiment, stage = manifest["experiment"], manifest["stage"]
        manifest = {**manifest, "status": "completed", "files": digest_tree(staging)}
        for _ in range(100):
            version = self.next_version(experiment, stage)
            manifest["version"] = version
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=False))
            target = self.version_path(experiment, stage, version)
            if self.local:
                try:
                    os.rename(staging, target)  # atomic; fails if target exists
                    return manifest
                except OSError:
                    if not os.path.exists(target):
                        raise
                    continue
            remote_staging = self._join(experiment, stage, f".staging-{uuid.uuid4().hex[:12]}")
            self.fs.put(str(staging).rstrip("/") + "/", remote_staging, recursive=True)
            if self.fs.exists(target):
                self.fs.rm(remote_staging, recursive=True)
                continue
            self.fs.mv(remote_staging, target, recursive=True)
            shutil.rmtree(staging, ignore_errors=True)
            return manifest
        raise RuntimeError(f"could not allocate a version for {experiment}/{stage}")

    def record_failure(self, staging: Path | None, manifest: dict[str, Any], error: str) -> str:
        """Keep a failed attempt beside the versions (with whatever it wrote, e.g. trajectories)."""
        experiment, stage = manifest["experiment"], manifest["stage"]
        name = f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        record = {**manifest, "status": "failed", "error": error, "failed_at": now_iso()}
        if staging is not None and staging.exists():
            (staging / "error.json").write_text(json.dumps(record, indent=1))
            if self.local:
                target = Path(self.stage_path(experiment, stage)) / "failed" / name
                target.parent.mkdir(parents=True, exist_ok=True)
                os.rename(staging, target)
                return str(target)
            self.fs.put(str(staging).rstrip("/") + "/", self._join(experiment, stage, "failed", name), recursive=True)
            shutil.rmtree(staging, ignore_errors=True)
            return self._join(experiment, stage, "failed", name)
        path = self._join(experiment, stage, "failed", name, "error.json")
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(path, "w") as fh:
            json.dump(record, fh, indent=1)
        return path

    def failures(self, experiment: str, stage: str) -> list[dict[str, Any]]:
        base = self._join(experiment, stage, "failed")
        try:
            entries = sorted(self.fs.ls(base, detail=False))
        except FileNotFoundError:
            return []
        return [r for e in entries if (r := self._read_json(f"{e.rstrip('/')}/error.json"))]

    # -- running markers and locks -----------------------------------------------------------
    def _running_file(self, experiment: str, stage: str) -> Path:
        return self.local_stage_dir(experiment, stage) / "running.json"

    @contextmanager
    def running(self, experiment: str, stage: str, info: dict[str, Any]) -> Iterator[None]:
        marker = self._running_file(experiment, stage)
        marker.write_text(json.dumps({**info, "pid": os.getpid(), "since": now_iso()}))
        try:
            yield
        finally:
            marker.unlink(missing_ok=True)

    def running_info(self, experiment: str, stage: str) -> dict[str, Any] | None:
        marker = self.cache / experiment / stage / "running.json"
        try:
            info = json.loads(marker.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        try:
            os.kill(int(info["pid"]), 0)
        except (ProcessLookupError, ValueError, KeyError):
            return {**info, "stale": True}
        except PermissionError:
            pass
        return info

    def _sweep_staging(self, experiment: str) -> None:
        """Staging folders left by a killed run (only ever half-written: nobody else writes while we hold the lock)."""
        for d in (self.cache / experiment).glob("*/.staging-*"):
            shutil.rmtree(d, ignore_errors=True)

    @contextmanager
    def lock(self, experiment: str) -> Iterator[None]:
        """One run per experiment at a time: a second one is refused at once, with a clear message."""
        path = self.cache / experiment / ".lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            holder = ""
            info = path.with_suffix(".owner")
            if info.exists():
                holder = f" (held by {info.read_text().strip()})"
            raise ExperimentBusy(
                f"experiment {experiment!r} in store {self.url} is already being run by another process{holder}; "
                "wait for it to finish, or use --experiment NAME to run a separate experiment"
            ) from None
        try:
            path.with_suffix(".owner").write_text(f"pid {os.getpid()} since {now_iso()}")
            self._sweep_staging(experiment)
            yield
        finally:
            path.with_suffix(".owner").unlink(missing_ok=True)
            lock.release()
