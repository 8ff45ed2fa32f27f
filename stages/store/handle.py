"""One stage of one experiment in the store: everything a run of it asks (`Store.stage`).

The runner asks the store once for this handle and works through it: an intact version to reuse, a
staging folder, a resumable work folder, the running marker, the commit or the failed attempt.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regimen.stages.store.catalog import Catalog
from regimen.stages.store.ledger import Ledger
from regimen.stages.store.workspace import Workspace


@dataclass(frozen=True)
class StageHandle:
    _catalog: Catalog
    _ledger: Ledger
    _workspace: Workspace
    experiment: str
    stage: str

    def find_intact(self, key: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The newest intact version with fingerprint `key`, and the damaged ones passed over."""
        return self._catalog.find_intact(self.experiment, self.stage, key)

    def local_path(self, manifest: dict[str, Any]) -> Path:
        return self._catalog.local_path(manifest)

    def note_damaged(self, found: list[dict[str, Any]]) -> None:
        """Keep the damaged versions a run passed over, for `regimen status` (`Ledger.record_damaged`)."""
        self._ledger.record_damaged(self.experiment, self.stage, found)

    def staging_dir(self) -> Path:
        return self._workspace.staging_dir(self.experiment, self.stage)

    def work_dir(self, key: str) -> Path:
        """The resumable work folder (Trainer checkpoints) of fingerprint `key`."""
        return self._workspace.work_dir(self.experiment, self.stage, key)

    def running(self, info: dict[str, Any]) -> AbstractContextManager[None]:
        """The stage's running marker, there while the block runs."""
        return self._workspace.running(self.experiment, self.stage, info)

    def commit(self, staging: Path, manifest: dict[str, Any], *, min_version: int = 1) -> dict[str, Any]:
        """The staged folder as this stage's next version (N at least `min_version`: `Catalog.commit`)."""
        return self._catalog.commit(
            staging, {**manifest, "experiment": self.experiment, "stage": self.stage}, min_version=min_version
        )

    def left_behind(self, stage: str) -> str:
        """What a commit that failed midway left in the store: the claims and files past the stage's index (a
        remote store's claimed folder with some files; a local commit is one rename: nothing)."""
        return self._catalog.left_behind(self.experiment, stage)

    def cache_dir(self) -> Path:
        """This host's cache of the store (where a remote store's copies and the staging folders live)."""
        return self._workspace.b.cache

    def drop_work(self, key: str) -> None:
        """A committed fingerprint's work folder, here and in a remote store's bucket."""
        self._workspace.drop_work(self.experiment, self.stage, key)

    def record_failure(self, staging: Path | None, manifest: dict[str, Any], error: str) -> str:
        """A failed attempt kept beside the versions."""
        return self._ledger.record_failure(
            staging, {**manifest, "experiment": self.experiment, "stage": self.stage}, error
        )
