"""This machine's side of a store: where a stage works (staging folders, resumable work folders, running
markers, presentation folders) and the experiment lock (one run per experiment, across machines).

In a local store these folders are inside it; in a remote one, in this machine's cache of it, with a
training stage's checkpoints mirrored to the bucket (`work.py`) and the lock a lease in the bucket
(`lock.py`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from regimen.stages.core.errors import StoreError
from regimen.stages.store import files, schemas, work
from regimen.stages.store.backend import Backend, check_name, now_iso
from regimen.stages.store.lock import file_lock, lease, lost_lease, process_started

log = logging.getLogger("regimen.store")


class Workspace:
    """Work folders, running markers and the experiment lock of one store on this machine."""

    def __init__(self, backend: Backend):
        self.b = backend

    # -- folders -------------------------------------------------------------------------------
    def has_experiment(self, experiment: str) -> bool:
        """Whether the store holds anything of `experiment` (versions, failed attempts, work folders)."""
        check_name(experiment)
        if self.b.local:
            return (Path(self.b.root) / experiment).is_dir() or (self.b.cache / experiment).is_dir()
        return bool(self.b.fs.exists(self.b.join(experiment))) or (self.b.cache / experiment).is_dir()

    def stage_dir(self, experiment: str, stage: str) -> Path:
        """Where work for this stage happens on this machine (the store itself when local)."""
        return files.ensure_dir(self.b.cache, self.b.cache / check_name(experiment) / stage)

    def experiment_dir(self, experiment: str, *sub: str) -> Path:
        """A local folder for the experiment's presentation files (`plots`, `sweeps/<tag>`), links refused."""
        return files.ensure_dir(self.b.cache, self.b.cache.joinpath(check_name(experiment), *sub))

    def staging_dir(self, experiment: str, stage: str) -> Path:
        """A fresh local folder for a run's outputs; `Catalog.commit` turns it into a version."""
        d = self.stage_dir(experiment, stage) / f".staging-{uuid.uuid4().hex[:12]}"
        try:
            d.mkdir()
        except OSError as exc:
            raise StoreError(f"cannot create {d}: {files.describe_os_error(exc, d)}") from None
        return d

    def work_dirs(self, experiment: str, stage: str) -> list[Path]:
        """The stage's resumable work folders on this machine (one per fingerprint; links left out)."""
        folder = self.b.cache / check_name(experiment) / stage / "work"
        if not folder.is_dir() or folder.is_symlink():
            return []
        return [d for d in sorted(folder.iterdir()) if d.is_dir() and not d.is_symlink()]

    def work_dir(self, experiment: str, stage: str, key: str) -> Path:
        """A resumable work folder (Trainer checkpoints) for one fingerprint of one stage; private to the
        user who runs it (0700), so in a shared store nobody else can plant files the stage would load."""
        d = files.ensure_dir(self.b.cache, self.stage_dir(experiment, stage) / "work" / key[:16])
        try:
            if d.stat().st_uid == os.geteuid():
                os.chmod(d, 0o700)
            else:
                raise StoreError(
                    f"{d} belongs to another user; refusing to resume from files someone else wrote (remove it)"
                )
        except OSError as exc:
            raise StoreError(f"cannot secure {d}: {files.describe_os_error(exc, d)}") from None
        files.check_tree_no_links(d)  # a planted `checkpoint-N` link would take the Trainer's writes elsewhere
        if not self.b.local:  # checkpoints go to the bucket too, so another host can resume (`work.py`)
            work.link(d, self.b.url, self.b.join(experiment, stage, "work", key[:16]), experiment)
        return d

    def drop_work(self, experiment: str, stage: str, key: str) -> None:
        """A committed stage's work folder is no longer needed: here, and in the bucket."""
        shutil.rmtree(self.stage_dir(experiment, stage) / "work" / key[:16], ignore_errors=True)
        if not self.b.local:
            work.drop(self.b.fs, self.b.join(check_name(experiment), stage, "work", key[:16]))

    # -- running markers -------------------------------------------------------------------------
    @contextmanager
    def running(self, experiment: str, stage: str, info: dict[str, Any]) -> Iterator[None]:
        """A marker saying this process runs the stage, there while the block runs."""
        marker = self.stage_dir(experiment, stage) / "running.json"
        files.write_text(
            self.b.cache,
            marker,
            json.dumps({**info, "pid": os.getpid(), "since": now_iso(), "pid_started": process_started(os.getpid())}),
        )
        with files.removed_after(self.b.cache, marker):
            yield

    def running_info(self, experiment: str, stage: str) -> dict[str, Any] | None:
        """The stage's running marker: None when there is none; `stale` when its process is gone (or the
        pid now belongs to another process), or the file is not a marker's shape (`malformed` says why)."""
        marker = self.b.cache / check_name(experiment) / stage / "running.json"
        try:
            info = json.loads(files.read_text(self.b.cache, marker))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (json.JSONDecodeError, StoreError, OSError, ValueError) as exc:
            return {"stale": True, "malformed": f"{marker}: unreadable ({str(exc)[:80]})"}
        if (why := schemas.problem(schemas.Running, info)) is not None:
            return {"stale": True, "malformed": f"{marker}: {why}"}
        started = process_started(info["pid"])
        if started is None or (
            started and info.get("pid_started") is not None and abs(started - info["pid_started"]) > 1.0
        ):
            return {**info, "stale": True}
        return info

    # -- the experiment lock ---------------------------------------------------------------------
    @contextmanager
    def lock(self, experiment: str, *, taken=None) -> Iterator[None]:
        """One run per experiment at a time, on this machine and across machines sharing the store. `taken()`
        runs once the lease is held in a remote store (the catalog sweeps killed writers' claims there)."""
        check_name(experiment)
        with file_lock(self.b.cache, self.b.cache / experiment / ".lock", experiment=experiment, url=self.b.url):
            if self.b.local:
                self._sweep_staging(experiment)
                yield
                return
            self.b.probe()
            with ExitStack() as held:
                with self.b.answers(f"taking the lease of {experiment}"):
                    held.enter_context(
                        lease(
                            self.b.fs,
                            self.b.join(experiment, ".lease.json"),
                            experiment=experiment,
                            url=self.b.url,
                            lost=lost_lease(self.b.url, experiment),
                        )
                    )
                self._sweep_staging(experiment)
                if taken is not None:
                    taken()
                yield

    def _sweep_staging(self, experiment: str) -> None:
        """Staging folders left by a killed run (only ever half-written: nobody else writes while we hold the lock)."""
        for stage_dir in (self.b.cache / experiment).glob("*"):
            if stage_dir.is_symlink() or not stage_dir.is_dir():
                continue
            for d in stage_dir.glob(".staging-*"):
                if not d.is_symlink():
                    shutil.rmtree(d, ignore_errors=True)
