"""A training stage's work folder mirrored in a remote store, so any host can resume the stage.

In a remote store (a bucket) the stage still trains in a local work folder (`Workspace.work_dir`), which then
holds a link file (`.regimen-remote.json`: the store's URL and the folder's key in it,
the stage's `work` folder under `<experiment>/<stage>`, named by `<fingerprint[:16]>`). Then:
- push (the Trainer's main process, after each save: `training/checkpoints.MarkComplete.on_save`): the
  checkpoint's files go up, then its marker, last, holding every file's sha256, so a checkpoint in the
  bucket counts only once all of it is there; older ones are pruned as the Trainer's `save_total_limit`
  says (marker first, so a half-pruned one never counts), as are torn uploads older than the newest.
- pull (`Workspace.work_dir`, before the stage runs): when the bucket has a complete checkpoint newer than the
  newest one here (a host that has never seen the run: none here), it is downloaded beside the work
  folder's checkpoints, checked file by file against its marker's digests, and renamed into place; a
  checkpoint that does not match is skipped for the one before it.
- drop (after the stage's version is committed): the folder in the bucket goes, as the local one does.
A run that lost the experiment's lease (`lock.lost_lease`, set in the process that holds the lease: with
`launcher: accelerate` the training runs in another process, which cannot see it) uploads nothing more.
Uploads are synchronous (training waits for each checkpoint to reach the bucket): a background upload
would race the Trainer's own rotation, which deletes older local checkpoints while they might still be
read. Written here because neither transformers nor fsspec mirror a folder with "complete only when its
last file is there" semantics; the pieces are fsspec's `put`/`get`/`ls`/`rm` and hashlib.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import fsspec

from regimen.stages.store.lock import lost_lease

log = logging.getLogger("regimen.store")

LINK = ".regimen-remote.json"
_CKPT = re.compile(r"^checkpoint-(\d+)$")


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, root path) for a store URL. For S3, s3fs's listing cache is off: other hosts
    write the same bucket, and a cached listing or size would be stale (a torn read of a record)."""
    if fsspec.core.split_protocol(url)[0] in ("s3", "s3a"):
        return fsspec.core.url_to_fs(url, use_listings_cache=False)
    return fsspec.core.url_to_fs(url)


def link(work: Path, url: str, key: str, experiment: str) -> None:
    """Mark a local work folder as mirrored at `key` of the store `url`."""
    (Path(work) / LINK).write_text(json.dumps({"url": url, "key": key, "experiment": experiment}))


def linked(work: Path) -> tuple[Any, str] | None:
    """(filesystem, key) of the bucket folder mirroring `work`, or None for a local store."""
    try:
        info = json.loads((Path(work) / LINK).read_text())
    except (OSError, ValueError):
        return None
    return filesystem(info["url"])[0], info["key"]


def _lost(work: Path) -> bool:
    """Whether this process's run lost the experiment's lease (another run may own the bucket folder now)."""
    try:
        info = json.loads((Path(work) / LINK).read_text())
    except (OSError, ValueError):
        return False
    return lost_lease(info["url"], info.get("experiment", "")).is_set()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def remote_checkpoints(fs, key: str, marker: str) -> tuple[list[int], list[int]]:
    """(complete, torn) checkpoint steps in the bucket folder, oldest first, from one listing. A folder
    holding no object at all is neither (some servers keep an emptied folder's entry for a while)."""
    fs.invalidate_cache(key)
    try:
        found = fs.find(key, detail=True)
    except FileNotFoundError:
        return [], []
    prefix = key.rstrip("/") + "/"
    held: dict[int, set[str]] = {}
    for path, info in found.items():
        if info.get("type") == "directory" or not path.startswith(prefix):
            continue
        top, _, rest = path[len(prefix) :].partition("/")
        if rest and (m := _CKPT.match(top)):
            held.setdefault(int(m.group(1)), set()).add(rest)
    complete = sorted(s for s, names in held.items() if marker in names)
    torn = sorted(s for s, names in held.items() if marker not in names)
    return complete, torn


def push(work: Path, ckpt: Path, marker: str, keep: int | None) -> bool:
    """Upload checkpoint folder `ckpt` of `work` (its marker last, with the files' digests), then prune.
    False when `work` is not mirrored."""
    target = linked(work)
    if target is None:
        return False
    fs, key = target
    if _lost(work):
        log.error("this run lost the experiment's lease: %s stays on this host, not uploaded", ckpt.name)
        return False
    step = int(_CKPT.match(ckpt.name).group(1))
    rels = sorted(
        p.relative_to(ckpt).as_posix()
        for p in ckpt.rglob("*")
        if p.is_file() and not p.is_symlink() and p.name != marker
    )
    body = {"step": step, "files": {rel: _sha256(ckpt / rel) for rel in rels}}
    dest = f"{key}/{ckpt.name}"
    fs.put([str(ckpt / rel) for rel in rels], [f"{dest}/{rel}" for rel in rels])
    fs.pipe_file(f"{dest}/{marker}", json.dumps(body).encode())
    complete, torn = remote_checkpoints(fs, key, marker)
    drop_steps = [s for s in torn if s < step]
    if keep is not None and keep > 0:
        drop_steps += complete[:-keep]
    for s in drop_steps:
        name = f"{key}/checkpoint-{s}"
        try:
            if fs.exists(f"{name}/{marker}"):
                fs.rm_file(f"{name}/{marker}")  # first: a half-removed checkpoint never counts as complete
            fs.rm(name, recursive=True)
        except FileNotFoundError:
            pass
    return True


def pull(work: Path, marker: str, have: int | None) -> int | None:
    """Download the bucket's newest complete checkpoint when it is newer than step `have` (None: no
    checkpoint here), checked against its marker's digests. Returns its step, or None when nothing came."""
    target = linked(work)
    if target is None:
        return None
    fs, key = target
    complete, _ = remote_checkpoints(fs, key, marker)
    for step in reversed(complete):
        if have is not None and step <= have:
            return None
        src = f"{key}/checkpoint-{step}"
        tmp = Path(work) / f".pull-{uuid.uuid4().hex[:8]}"
        try:
            body = json.loads(fs.cat_file(f"{src}/{marker}"))
            rels = list(body["files"])
            for rel in rels:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            fs.get([f"{src}/{rel}" for rel in rels], [str(tmp / rel) for rel in rels])
            bad = [rel for rel, digest in body["files"].items() if _sha256(tmp / rel) != digest]
            if bad:
                log.warning(
                    "checkpoint-%d in %s does not match its digests (%s): trying the one before",
                    step,
                    key,
                    ", ".join(bad[:3]),
                )
                continue
            (tmp / marker).write_text(json.dumps(body))
            final = Path(work) / f"checkpoint-{step}"
            if final.exists():
                shutil.rmtree(final)  # a torn local copy (no marker): the bucket's is complete
            tmp.rename(final)
            log.info("resuming from checkpoint-%d downloaded from %s", step, key)
            return step
        except (FileNotFoundError, ValueError, KeyError) as exc:
            log.warning("checkpoint-%d in %s is unreadable (%s): trying the one before", step, key, str(exc)[:120])
            continue
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return None


def drop(fs, key: str) -> None:
    """Remove the bucket folder of a finished stage's work (best effort: it only ever serves a resume)."""
    try:
        fs.rm(key, recursive=True)
    except FileNotFoundError:
        pass
    except Exception as exc:  # noqa: BLE001 - a leftover folder costs space, never correctness
        log.warning("could not remove %s from the store: %s", key, str(exc)[:200])
