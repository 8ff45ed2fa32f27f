"""The versioned artifact store: `<store>/<experiment>/<stage>/v<N>/` with files and `manifest.json`.

Versions are never overwritten. A stage writes into a staging folder that is renamed into place only
when complete, so a crash leaves no half-written version; a folder counts as a version only when its
manifest is well-formed and says `completed`. Failed attempts are kept beside the versions (`failed/`),
never as one. The cycle's verdicts are kept beside the evaluations (`<experiment>/decisions/`).

Reuse checks integrity: `find_intact` returns a version only when its files match the manifest (size and
mtime first; the full sha256 when either differs), and reports damaged ones. The store never follows a
link it did not make (`files.py`). The root is a local folder or any fsspec URL (`s3://bucket/regimen`,
`memory://x`); the experiment lock is then a lease in the store (`lock.py`).

A remote store (a bucket through s3fs; endpoint and credentials from the standard AWS_* environment):
- Commit cannot rename a folder (S3 has no rename: `mv` is copy+delete per object, so a reader could see
  half a version). Instead a writer claims `v<N>` by an exclusive create of `v<N>/.claim` (a conditional
  PUT: two writers never get one N; the claim is never removed, so a writer with an old listing cannot
  take the number later), uploads the files, and writes `manifest.json` last, with an exclusive create too. Readers
  count a version only when its manifest is there and well-formed (`scan`), so a version is visible whole or not at all.
  A claimed folder that never got its manifest (a killed writer) is removed when the next run takes the experiment's
  lease.
- Reads of a version come through the local cache (`$REGIMEN_CACHE/store-<hash>/...`): each file is
  checked against the manifest's sha256 as it arrives, and a cached copy whose size or mtime moved since
  it was checked is hashed again; a mismatch in the bucket makes the version damaged (not reused). The
  bucket itself is only compared by size (`check`): hashing there would mean downloading.
- Listings and small reads bypass s3fs's listing cache (`invalidate_cache`, `cat_file`): another host
  writes the same bucket, and a stale cached size would tear a read of champion.json.
- Before anything is written, `reachable` (on opening) and `probe` (before training: a conditional create
  twice on a probe key, the second must be refused) turn a missing bucket, refused credentials, an
  unreachable endpoint or a bucket that ignores conditional writes into one line naming the bucket and
  the endpoint. Hand-written mapping: s3fs passes botocore's errors through as OSError or BotoCoreError
  with the server's wording, which names neither.

The parts, by responsibility (each works through one `Backend`: the root, its paths, small reads, whole
writes, a remote store's errors in one line): `Catalog` (`catalog.py`, with `copies.py` for a remote
store's cached copies): versions; `Ledger` (`ledger.py`): records, verdicts, failed attempts;
`Workspace` (`workspace.py`): work folders, running markers, the experiment lock. A run of one stage
works through one `StageHandle` (`handle.py`: `store.stage(experiment, stage)`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from regimen.stages.store.backend import MANIFEST, Backend, check_name, now_iso, sha256_file, well_formed
from regimen.stages.store.catalog import Catalog
from regimen.stages.store.handle import StageHandle
from regimen.stages.store.ledger import Ledger, StaleRecord
from regimen.stages.store.lock import ExperimentBusy, lost_lease
from regimen.stages.store.workspace import Workspace

__all__ = [
    "Store",
    "StageHandle",
    "ExperimentBusy",
    "StaleRecord",
    "MANIFEST",
    "now_iso",
    "sha256_file",
    "check_name",
    "well_formed",
    "lost_lease",
]


class Store:
    """A store rooted at a local folder or an fsspec URL: its parts by responsibility, and the reads most
    callers need. `stage(experiment, stage)` is the handle a run of one stage works through."""

    def __init__(self, root: str | os.PathLike, cache_dir: str | os.PathLike | None = None):
        self.backend = Backend(root, cache_dir)  # where it lives: paths, small reads, a remote store's errors
        self.url, self.fs, self.root, self.local, self.cache = (
            self.backend.url,
            self.backend.fs,
            self.backend.root,
            self.backend.local,
            self.backend.cache,
        )
        self.catalog = Catalog(self.backend)  # the stages' versions: scan, find, check, verify, fetch, commit
        self.ledger = Ledger(self.backend)  # the experiment's records, the cycle's verdicts, failed attempts
        self.workspace = Workspace(self.backend)  # this machine's work folders, running markers, the experiment lock

    def stage(self, experiment: str, stage: str) -> StageHandle:
        """The handle on one stage of one experiment: everything a run of it asks of the store."""
        return StageHandle(self.catalog, self.ledger, self.workspace, check_name(experiment), stage)

    def join(self, *parts: str) -> str:
        """A path (or URL path) inside the store."""
        return self.backend.join(*parts)

    def probe(self) -> None:
        """A remote store refuses a second exclusive create of one key (once per process; `Backend.probe`)."""
        self.backend.probe()

    def versions(self, experiment: str, stage: str) -> list[dict[str, Any]]:
        """Completed versions, oldest first, as their index entries (the manifest without its file lists and bulky
        extras: `catalog.whole(entry)` reads one whole). One read, whatever the history's length."""
        return self.catalog.versions(experiment, stage)

    def manifests(self, experiment: str, stage: str) -> list[dict[str, Any]]:
        """Completed versions' whole manifests, oldest first: every manifest read (for a caller that asks for the
        history itself, such as a report; lookups use `versions`, which reads the stage's index only)."""
        return self.catalog.scan(experiment, stage)[0]

    def latest(self, experiment: str, stage: str) -> dict[str, Any] | None:
        return self.catalog.latest(experiment, stage)

    def check(self, manifest: dict[str, Any]) -> list[str]:
        """Problems with a version's files (empty: intact); `Catalog.check`."""
        return self.catalog.check(manifest)

    def verify(self, manifest: dict[str, Any]) -> list[str]:
        """Files whose sha256 no longer matches the manifest (empty: intact); always hashes."""
        return self.catalog.verify(manifest)

    def local_path(self, manifest: dict[str, Any]) -> Path:
        """A local folder holding this version's files (a remote store's: the checked copy in the cache)."""
        return self.catalog.local_path(manifest)

    def staging_dir(self, experiment: str, stage: str) -> Path:
        """A fresh local folder for a run's outputs; `commit` turns it into a version."""
        return self.workspace.staging_dir(experiment, stage)

    def commit(self, staging: Path, manifest: dict[str, Any], *, min_version: int = 1) -> dict[str, Any]:
        """The staged folder as the next version of the manifest's stage (`Catalog.commit`)."""
        return self.catalog.commit(staging, manifest, min_version=min_version)

    def experiment_dir(self, experiment: str, *sub: str) -> Path:
        """A local folder for the experiment's presentation files (`plots`, `sweeps/<tag>`), links refused."""
        return self.workspace.experiment_dir(experiment, *sub)

    @contextmanager
    def lock(self, experiment: str) -> Iterator[None]:
        """One run per experiment at a time, on this machine and across machines sharing the store. Once held: a
        bucket's claims left by killed writers are swept, and failed attempts this host could not record in the
        store (it was down) are recorded there now."""
        with self.workspace.lock(experiment, taken=lambda: self.catalog.sweep_claims(experiment)):
            self.ledger.recover_unrecorded(experiment)
            yield
