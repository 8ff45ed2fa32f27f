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
`Workspace` (`workspace.py`): work folders, running markers, the experiment lock.

One surface: callers outside this package use `Store` (versions, records, verdicts, failed attempts, work
folders, the lock), and a run of one stage works through the `StageHandle` that `store.stage(experiment,
stage)` hands out (staging, commit, work folder, running marker, failed attempt). The parts are private
(`_catalog`, `_ledger`, `_workspace`, `_backend`): `tests/test_layout.py` fails on a reach into them from
outside `stages/store/` (the store's own tests aside). Each of `Store`'s methods is one delegation to a
part, so the facade holds no rule of its own and the parts stay under 20 methods each.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from regimen.stages.store.backend import MANIFEST, Backend, StoreError, check_name, now_iso, sha256_file, well_formed
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
    "StoreError",
    "MANIFEST",
    "now_iso",
    "sha256_file",
    "check_name",
    "well_formed",
    "lost_lease",
]


class Store:
    """A store rooted at a local folder or an fsspec URL: the one surface callers use. `stage(experiment,
    stage)` is the handle a run of one stage works through; every other method is one delegation to the part
    that owns the rule (see the module doc)."""

    def __init__(self, root: str | os.PathLike, cache_dir: str | os.PathLike | None = None):
        self._backend = Backend(root, cache_dir)  # where it lives: paths, small reads, a remote store's errors
        self.url, self.fs, self.root, self.local, self.cache = (
            self._backend.url,
            self._backend.fs,
            self._backend.root,
            self._backend.local,
            self._backend.cache,
        )
        self._catalog = Catalog(self._backend)  # the stages' versions: scan, find, check, verify, fetch, commit
        self._ledger = Ledger(self._backend)  # the experiment's records, the cycle's verdicts, failed attempts
        self._workspace = Workspace(self._backend)  # this machine's work folders, running markers, the lock

    def stage(self, experiment: str, stage: str) -> StageHandle:
        """The handle on one stage of one experiment: everything a run of it asks of the store (staging,
        commit, work folder, running marker, failed attempt)."""
        return StageHandle(self._catalog, self._ledger, self._workspace, check_name(experiment), stage)

    # -- where things are ---------------------------------------------------------------------------------

    def join(self, *parts: str) -> str:
        """A path (or URL path) inside the store."""
        return self._backend.join(*parts)

    def stage_path(self, experiment: str, stage: str) -> str:
        """Where a stage's versions live (a path or URL path inside the store)."""
        return self._backend.stage_path(experiment, stage)

    def version_path(self, experiment: str, stage: str, version: int) -> str:
        """Where one version lives (a path or URL path inside the store)."""
        return self._backend.version_path(experiment, stage, version)

    def probe(self) -> None:
        """A remote store refuses a second exclusive create of one key (once per process; `Backend.probe`)."""
        self._backend.probe()

    def has_experiment(self, experiment: str) -> bool:
        """Whether the store holds anything of this experiment."""
        return self._workspace.has_experiment(experiment)

    def experiment_dir(self, experiment: str, *sub: str) -> Path:
        """A local folder for the experiment's presentation files (`plots`, `sweeps/<tag>`), links refused."""
        return self._workspace.experiment_dir(experiment, *sub)

    # -- versions (`Catalog`) -------------------------------------------------------------------------------

    def versions(self, experiment: str, stage: str) -> list[dict[str, Any]]:
        """Completed versions, oldest first, as their index entries (the manifest without its file lists and bulky
        extras: `whole(entry)` reads one whole). One read, whatever the history's length."""
        return self._catalog.versions(experiment, stage)

    def scan(self, experiment: str, stage: str) -> tuple[list[dict[str, Any]], list[str]]:
        """Completed versions' whole manifests, oldest first, and the folders whose manifest is malformed: every
        manifest read (for a caller that asks for the history itself, such as a report or `status`; lookups use
        `versions`, which reads the stage's index only)."""
        return self._catalog.scan(experiment, stage)

    def manifest(self, experiment: str, stage: str, version: int) -> dict[str, Any] | None:
        """One version's whole manifest (None when it is missing or not completed)."""
        return self._catalog.manifest(experiment, stage, version)

    def whole(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The whole manifest behind an index entry of `versions`."""
        return self._catalog.whole(entry)

    def latest(self, experiment: str, stage: str) -> dict[str, Any] | None:
        return self._catalog.latest(experiment, stage)

    def next_version(self, experiment: str, stage: str) -> int:
        """The number the stage's next commit would take (a number once claimed is never given again)."""
        return self._catalog.next_version(experiment, stage)

    def rebuild_index(self, experiment: str, stage: str) -> dict[str, Any]:
        """The stage's index written again from its manifests (`regimen store reindex`, `status --check`)."""
        return self._catalog.index.rebuild(experiment, stage)

    def check(self, manifest: dict[str, Any]) -> list[str]:
        """Problems with a version's files (empty: intact); `Catalog.check`."""
        return self._catalog.check(manifest)

    def verify(self, manifest: dict[str, Any]) -> list[str]:
        """Files whose sha256 no longer matches the manifest (empty: intact); always hashes."""
        return self._catalog.verify(manifest)

    def local_path(self, manifest: dict[str, Any]) -> Path:
        """A local folder holding this version's files (a remote store's: the checked copy in the cache)."""
        return self._catalog.local_path(manifest)

    # -- records, verdicts, failed attempts (`Ledger`) ----------------------------------------------------

    def read_record(self, experiment: str, name: str) -> Any:
        """An experiment's record (`champion.json`, the trackers' record), None when there is none."""
        return self._ledger.read(experiment, name)

    def has_record(self, experiment: str, name: str) -> bool:
        return self._ledger.has(experiment, name)

    def write_record(self, experiment: str, name: str, data: dict[str, Any]) -> str:
        return self._ledger.write(experiment, name, data)

    def update_record(self, experiment: str, name: str, change, *, expect: int | None = None) -> dict[str, Any]:
        """A record changed by `change(record) -> record`, as one revision (`Ledger.update`: `StaleRecord` when
        `expect` is given and another writer got there first)."""
        return self._ledger.update(experiment, name, change, expect=expect)

    def record_decision(self, experiment: str, record: dict[str, Any]) -> str:
        """The cycle's verdict on an evaluation, kept beside the evaluations."""
        return self._ledger.record_decision(experiment, record)

    def decisions(self, experiment: str) -> list[dict[str, Any]]:
        """The cycle's verdicts, oldest first."""
        return self._ledger.decisions(experiment)

    def verdicts_by_eval(self, experiment: str) -> dict[int, dict[str, Any]]:
        return self._ledger.verdicts_by_eval(experiment)

    def failures(self, experiment: str, stage: str) -> list[dict[str, Any]]:
        """The stage's failed attempts, oldest first."""
        return self._ledger.failures(experiment, stage)

    def last_failure(self, experiment: str, stage: str) -> tuple[int, dict[str, Any] | None]:
        """How many failed attempts the stage has, and the newest."""
        return self._ledger.last_failure(experiment, stage)

    def damaged(self, experiment: str, stage: str) -> dict[int, dict[str, Any]]:
        """The damaged versions a run found and passed over (`StageHandle.note_damaged`)."""
        return self._ledger.damaged(experiment, stage)

    # -- this machine's work folders and the lock (`Workspace`) --------------------------------------------

    def work_dirs(self, experiment: str, stage: str) -> list[Path]:
        return self._workspace.work_dirs(experiment, stage)

    def running_info(self, experiment: str, stage: str) -> dict[str, Any] | None:
        """What the stage's running marker says (None when no run of it is running here)."""
        return self._workspace.running_info(experiment, stage)

    @contextmanager
    def lock(self, experiment: str) -> Iterator[None]:
        """One run per experiment at a time, on this machine and across machines sharing the store. Once held: a
        bucket's claims left by killed writers are swept, and failed attempts this host could not record in the
        store (it was down) are recorded there now."""
        with self._workspace.lock(experiment, taken=lambda: self._catalog.sweep_claims(experiment)):
            self._ledger.recover_unrecorded(experiment)
            yield
