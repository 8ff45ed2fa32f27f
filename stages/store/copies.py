"""A remote store's versions as this machine reads them: a local copy in the cache, checked file by file.

Reads of a version come through the local cache (`$REGIMEN_CACHE/store-<hash>/...`): each file is checked
against the manifest's sha256 as it arrives, and a cached copy whose size or mtime moved since it was
checked is hashed again; a mismatch in the bucket makes the version damaged (not reused). The bucket
itself is only compared by size (`check`): hashing there would mean downloading.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from regimen.stages.core.errors import StoreError
from regimen.stages.store import files
from regimen.stages.store.backend import MANIFEST, Backend, sha256_file


class RemoteCopies:
    """The local cache's copies of a remote store's versions."""

    def __init__(self, backend: Backend):
        self.b = backend

    def check(self, manifest: dict[str, Any]) -> list[str]:
        """Problems with a remote version: sizes in the bucket, and the local cache's copy (when there is
        one) by its own fast path, downloaded again when the cache rather than the bucket was damaged."""
        problems = self._check_sizes(manifest)
        cached = self.cached(manifest)
        if not problems and (cached / MANIFEST).is_file() and self._cache_problems(manifest, cached):
            try:
                self.fetch(manifest, again=True)  # the cache was damaged, not necessarily the bucket
            except StoreError as exc:
                problems.append(str(exc))
        return problems

    def cached(self, manifest: dict[str, Any]) -> Path:
        return (
            self.b.cache
            / manifest["experiment"]
            / manifest["stage"]
            / "versions"
            / f"v{manifest['version']}-{manifest['fingerprint'][:12]}"
        )

    def _check_sizes(self, manifest: dict[str, Any]) -> list[str]:
        base = self.b.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
        stats = manifest.get("file_stats") or {}
        problems = []
        self.b.fs.invalidate_cache(base)
        try:
            found = {p.rstrip("/"): info.get("size") for p, info in self.b.fs.find(base, detail=True).items()}
        except FileNotFoundError:
            found = {}
        except OSError as exc:
            raise self.b.remote_error(exc, f"listing {base}") from None
        prefix = base.rstrip("/") + "/"
        found = {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in found.items()}
        for rel in manifest["files"]:
            if rel not in found:
                problems.append(f"{rel}: missing")
            elif rel in stats and found[rel] != stats[rel][0]:
                problems.append(f"{rel}: size {found[rel]} != {stats[rel][0]} recorded")
        return problems

    @staticmethod
    def _stamp(target: Path) -> Path:
        return target.with_name(target.name + ".checked.json")

    def _cache_problems(self, manifest: dict[str, Any], target: Path) -> list[str]:
        """Files of the cached copy that differ from the manifest: size and mtime as when they were checked,
        hashed again when either moved."""
        try:
            seen = json.loads(self._stamp(target).read_text())
        except (OSError, ValueError):
            seen = {}
        problems = []
        for rel, digest in manifest["files"].items():
            p = target / rel
            if p.is_symlink() or not p.is_file():
                problems.append(f"{rel}: missing from the cache")
                continue
            st = p.stat()
            if seen.get(rel) == [st.st_size, st.st_mtime_ns]:
                continue
            if sha256_file(p) != digest:
                problems.append(f"{rel}: sha256 differs from the manifest")
        return problems

    def fetch(self, manifest: dict[str, Any], *, again: bool = False) -> tuple[Path, list[str]]:
        """The cached copy of a remote version, downloaded when absent (or `again`, or found damaged), each
        file checked by sha256 as it lands. Returns (folder, problems of the bucket's copy)."""
        target = self.cached(manifest)
        if not again and (target / MANIFEST).is_file() and not self._cache_problems(manifest, target):
            return target, []
        remote = self.b.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
        files.ensure_dir(self.b.cache, target.parent)
        tmp = target.with_name(target.name + f".partial-{uuid.uuid4().hex[:6]}")
        rels = [*manifest["files"], MANIFEST]
        try:
            for rel in rels:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            try:
                self.b.fs.get([f"{remote}/{rel}" for rel in rels], [str(tmp / rel) for rel in rels])
            except FileNotFoundError:
                raise
            except Exception as exc:  # noqa: BLE001 - one line naming the bucket and the endpoint
                raise self.b.remote_error(exc, f"downloading {remote}") from None
            problems = [
                f"{rel}: sha256 differs from the manifest"
                for rel, digest in manifest["files"].items()
                if not (tmp / rel).is_file() or sha256_file(tmp / rel) != digest
            ]
            if problems:
                return target, problems
            stamp = {rel: [(tmp / rel).stat().st_size, (tmp / rel).stat().st_mtime_ns] for rel in manifest["files"]}
            if target.exists():
                shutil.rmtree(target, ignore_errors=True)
            try:
                os.rename(tmp, target)
            except OSError:  # another process of this machine put it there first
                pass
            files.write_text(self.b.cache, self._stamp(target), json.dumps(stamp))
            return target, []
        except FileNotFoundError as exc:
            return target, [f"missing in the bucket ({str(exc)[:120]})"]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
