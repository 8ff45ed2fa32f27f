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
  take the number later), uploads the files, and writes `manifest.json` last, with an exclusive create too. Readers count a version only when its manifest is there and well-formed (`scan`),
  so a version is visible whole or not at all. A claimed folder that never got its manifest (a killed
  writer) is removed when the next run takes the experiment's lease.
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
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from regimen.stages.core.errors import InputError, RegimenError, StoreError
from regimen.stages.store import files, schemas, work
from regimen.stages.store.lock import (ExperimentBusy, exclusive_create, file_lock, lease, lost_lease, probe_conditional_create, process_started,
                                       record_lock)

log = logging.getLogger("regimen.store")

__all__ = ["Store", "ExperimentBusy", "StaleRecord", "MANIFEST", "now_iso", "sha256_file", "check_name"]

MANIFEST = "manifest.json"
CLAIM = ".claim"  # made first in a remote v<N>/ (exclusive create) and kept: the number is taken for good
_PROBED: set[str] = set()  # remote stores whose conditional create was checked in this process
_REACHED: set[str] = set()  # remote stores answered once in this process
_VERSION = re.compile(r"^v(\d+)$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class StaleRecord(StoreError):
    """A record changed since the caller read it (a person's move landed meanwhile): decide again."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def check_name(name: str, what: str = "experiment") -> str:
    """Experiment names become folder names: letters, digits, `_.-`, at most 100 characters."""
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        shown = name if len(str(name)) <= 60 else f"{str(name)[:57]}..."
        raise InputError(f"{what} {shown!r}: use 1-100 letters, digits, '_', '.' or '-', starting with a letter or digit")
    return name


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _stats(root: Path) -> tuple[dict[str, str], dict[str, list[int]]]:
    """Relative path → sha256, and → [size, mtime_ns], for every file under `root` but the manifest."""
    digests, stats = {}, {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_symlink():
            raise StoreError(f"{p}: a stage wrote a symbolic link into its version folder; versions hold plain files only")
        if p.is_file() and p.name != MANIFEST:
            rel = p.relative_to(root).as_posix()
            st = p.stat()
            digests[rel] = sha256_file(p)
            stats[rel] = [st.st_size, st.st_mtime_ns]
    return digests, stats


def well_formed(manifest: Any) -> bool:
    """A manifest of the shape the store writes (`schemas.Manifest`): anything else is damaged."""
    return schemas.parse(schemas.Manifest, manifest) is not None


class Store:
    """A store rooted at a local folder or an fsspec URL."""

    def __init__(self, root: str | os.PathLike, cache_dir: str | os.PathLike | None = None):
        self.url = str(root)
        self.fs, self.root = work.filesystem(self.url)
        self.local = isinstance(self.fs, LocalFileSystem)
        if self.local:
            self.root = str(Path(self.root).expanduser().resolve())
            self.cache = Path(self.root)
        else:
            key = hashlib.sha256(self.url.encode()).hexdigest()[:12]
            base = Path(cache_dir or os.environ.get("REGIMEN_CACHE", Path.home() / ".cache" / "regimen"))
            self.cache = base / f"store-{key}"
        try:
            self.cache.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"store {self.url}: cannot create {self.cache}: {files.describe_os_error(exc, self.cache)}") from None
        if not self.local:
            self.reachable()

    # -- a remote store answers as it must ---------------------------------------------------
    def _bucket(self) -> str:
        return self.root.split("/", 1)[0]

    def _endpoint(self) -> str:
        return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the default AWS endpoint"

    @contextmanager
    def _answers(self, doing: str) -> Iterator[None]:
        """Turn s3fs/botocore errors while `doing` into one line naming the bucket and the endpoint."""
        try:
            yield
        except RegimenError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a one-line error below, or re-raised
            raise self._remote_error(exc, doing) from None

    def _remote_error(self, exc: BaseException, doing: str) -> BaseException:
        where = f"store {self.url} (bucket {self._bucket()!r} at {self._endpoint()})"
        names = {c.__name__ for c in type(exc).__mro__}
        cause = exc.__cause__ or exc.__context__
        response = getattr(cause, "response", None) or getattr(exc, "response", None)
        code = str(((response or {}).get("Error") or {}).get("Code", "")) if isinstance(response, dict) else ""
        text = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        if code in ("NoSuchBucket",) or (isinstance(exc, FileNotFoundError) and "bucket" in text.lower()):
            return InputError(f"{where}: the bucket does not exist (create it, or correct `store:`); nothing was written")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken") or isinstance(exc, PermissionError) \
                or "NoCredentialsError" in names:
            return InputError(f"{where}: the credentials were refused while {doing} ({text}); check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
                              "nothing was written")
        if names & {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ReadTimeoutError", "ClientConnectorError"} \
                or isinstance(exc, (ConnectionError, TimeoutError)):
            return StoreError(f"{where}: the endpoint cannot be reached while {doing} ({type(exc).__name__}); check AWS_ENDPOINT_URL and the "
                              "network; nothing was written")
        return StoreError(f"{where}: {doing} failed: {type(exc).__name__}: {text}")

    def _asked(self) -> str:
        """What a check's answer holds for: this store, at this endpoint, with these credentials."""
        return f"{self.url} {self._endpoint()} {os.environ.get('AWS_ACCESS_KEY_ID', '')}"

    def reachable(self) -> None:
        """A remote store's bucket exists and takes our credentials (once per process): else a one-line
        InputError (missing bucket, refused credentials) or StoreError (endpoint unreachable). Reads only."""
        if self.local or self._asked() in _REACHED:
            return
        protocols = {self.fs.protocol} if isinstance(self.fs.protocol, str) else set(self.fs.protocol)
        if protocols & {"s3", "s3a"}:
            with self._answers("listing the bucket"):
                try:  # the store's own prefix, not the bucket's top: a policy may allow only the prefix
                    self.fs.ls(self.root, detail=False)
                except FileNotFoundError as exc:
                    if exc.__cause__ is not None or "bucket" in str(exc).lower():
                        raise  # NoSuchBucket; a prefix with nothing in it yet is a new store, not an error
        _REACHED.add(self._asked())

    def probe(self) -> None:
        """Before a run writes anything: the store refuses a second exclusive create of one key (the
        experiment's lease, the version claims and the record lock rely on it), once per process. A store
        that does not is named (StoreError); nothing is left behind."""
        if self.local or self._asked() in _PROBED:
            return
        self.reachable()
        key = self.join(".regimen-probe", f"{uuid.uuid4().hex}.json")
        with self._answers("probing conditional writes"):
            honoured = probe_conditional_create(self.fs, key)
        if not honoured:
            raise StoreError(f"store {self.url} (bucket {self._bucket()!r} at {self._endpoint()}) does not honour conditional writes "
                             "(a second create with If-None-Match: * was not refused): two runs could take one experiment's lease or one "
                             "version number there; use a server that supports them (AWS S3, SeaweedFS, MinIO)")
        _PROBED.add(self._asked())

    # -- paths -------------------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        """A path (or URL path) inside the store."""
        return "/".join([self.root.rstrip("/"), *parts])

    def has_experiment(self, experiment: str) -> bool:
        """Whether the store holds anything of `experiment` (versions, failed attempts, work folders)."""
        check_name(experiment)
        if self.local:
            return (Path(self.root) / experiment).is_dir() or (self.cache / experiment).is_dir()
        return bool(self.fs.exists(self.join(experiment))) or (self.cache / experiment).is_dir()

    def work_dirs(self, experiment: str, stage: str) -> list[Path]:
        """The stage's resumable work folders on this machine (one per fingerprint; links left out)."""
        work = self.cache / check_name(experiment) / stage / "work"
        if not work.is_dir() or work.is_symlink():
            return []
        return [d for d in sorted(work.iterdir()) if d.is_dir() and not d.is_symlink()]

    def stage_path(self, experiment: str, stage: str) -> str:
        return self.join(check_name(experiment), stage)

    def version_path(self, experiment: str, stage: str, version: int) -> str:
        return self.join(check_name(experiment), stage, f"v{version}")

    def local_stage_dir(self, experiment: str, stage: str) -> Path:
        """Where work for this stage happens on this machine (the store itself when local)."""
        return files.ensure_dir(self.cache, self.cache / check_name(experiment) / stage)

    def work_dir(self, experiment: str, stage: str, key: str) -> Path:
        """A resumable work folder (Trainer checkpoints) for one fingerprint of one stage; private to the
        user who runs it (0700), so in a shared store nobody else can plant files the stage would load."""
        d = files.ensure_dir(self.cache, self.local_stage_dir(experiment, stage) / "work" / key[:16])
        try:
            if d.stat().st_uid == os.geteuid():
                os.chmod(d, 0o700)
            else:
                raise StoreError(f"{d} belongs to another user; refusing to resume from files someone else wrote (remove it)")
        except OSError as exc:
            raise StoreError(f"cannot secure {d}: {files.describe_os_error(exc, d)}") from None
        files.check_tree_no_links(d)  # a planted `checkpoint-N` link would take the Trainer's writes elsewhere
        if not self.local:  # checkpoints go to the bucket too, so another host can resume (`work.py`)
            work.link(d, self.url, self.join(experiment, stage, "work", key[:16]), experiment)
        return d

    def drop_work(self, experiment: str, stage: str, key: str) -> None:
        """A committed stage's work folder is no longer needed: here, and in the bucket."""
        shutil.rmtree(self.local_stage_dir(experiment, stage) / "work" / key[:16], ignore_errors=True)
        if not self.local:
            work.drop(self.fs, self.join(check_name(experiment), stage, "work", key[:16]))

    def experiment_dir(self, experiment: str, *sub: str) -> Path:
        """A local folder for the experiment's presentation files (`plots`, `sweeps/<tag>`), links refused."""
        return files.ensure_dir(self.cache, self.cache.joinpath(check_name(experiment), *sub))

    # -- reading -----------------------------------------------------------------------------
    def _read_json(self, path: str) -> Any:
        try:
            if self.local:
                return json.loads(files.read_text(Path(self.root), Path(path)))
            return json.loads(self.fs.cat_file(path))  # one GET of the whole object: no cached size to tear it
        except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError, StoreError):
            return None
        except OSError:
            return None

    def _entries(self, path: str) -> list[str]:
        try:
            if not self.local:
                self.fs.invalidate_cache(path)  # another host may have written since this process listed it
            return [e.rstrip("/") for e in self.fs.ls(path, detail=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {path}: {files.describe_os_error(exc, path)}") from None

    def scan(self, experiment: str, stage: str) -> tuple[list[dict[str, Any]], list[str]]:
        """Completed versions' manifests (oldest first) and folders whose manifest is malformed."""
        found, malformed = [], []
        for entry in self._entries(self.stage_path(experiment, stage)):
            m = _VERSION.match(entry.rsplit("/", 1)[-1])
            if not m:
                continue
            if self.local and Path(entry).is_symlink():
                malformed.append(f"{entry} (a symbolic link)")
                continue
            manifest = self._read_json(f"{entry}/{MANIFEST}")
            if manifest is None and not self.fs.exists(f"{entry}/{MANIFEST}"):
                continue  # a version being moved into place
            if not well_formed(manifest) or manifest["version"] != int(m.group(1)) or manifest["stage"] != stage:
                malformed.append(f"{entry}/{MANIFEST}")
                continue
            if manifest["status"] == "completed":
                found.append(manifest)
        return sorted(found, key=lambda m: m["version"]), malformed

    def versions(self, experiment: str, stage: str) -> list[dict[str, Any]]:
        """Completed versions' manifests, oldest first (malformed ones are left out; see `malformed`)."""
        return self.scan(experiment, stage)[0]

    def malformed(self, experiment: str, stage: str) -> list[str]:
        return self.scan(experiment, stage)[1]

    def latest(self, experiment: str, stage: str) -> dict[str, Any] | None:
        versions = self.versions(experiment, stage)
        return versions[-1] if versions else None

    def find_intact(self, experiment: str, stage: str, key: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The newest completed version with this fingerprint whose files match the manifest, and the
        damaged ones passed over on the way ({version, problems})."""
        damaged = []
        for manifest in reversed(self.versions(experiment, stage)):
            if manifest.get("fingerprint") != key:
                continue
            problems = self.check(manifest)
            if not problems and not self.local:
                problems = self._fetch(manifest)[1]  # the files as they arrive, by sha256: reuse reads them next anyway
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
        if not self.local:
            problems = self._check_sizes(manifest)
            cached = self._cached(manifest)
            if not problems and (cached / MANIFEST).is_file() and self._cache_problems(manifest, cached):
                try:
                    self._fetch(manifest, again=True)  # the cache was damaged, not necessarily the bucket
                except StoreError as exc:
                    problems.append(str(exc))
            return problems
        base = self.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
        stats = manifest.get("file_stats") or {}
        problems = []
        for rel, digest in manifest["files"].items():
            path = f"{base}/{rel}"
            try:
                if self.local:
                    p = Path(path)
                    if p.is_symlink():
                        problems.append(f"{rel}: replaced by a symbolic link")
                        continue
                    st = p.stat()
                    size, mtime = st.st_size, st.st_mtime_ns
                else:
                    info = self.fs.info(path)
                    size, mtime = info.get("size"), None
            except (FileNotFoundError, NotADirectoryError):
                problems.append(f"{rel}: missing")
                continue
            expected = stats.get(rel)
            if expected and size != expected[0]:
                problems.append(f"{rel}: size {size} != {expected[0]} recorded")
                continue
            if expected and (mtime is None or mtime == expected[1]):
                continue
            if self._sha256(path) != digest:
                problems.append(f"{rel}: sha256 differs from the manifest")
        return problems

    def _sha256(self, path: str) -> str:
        h = hashlib.sha256()
        with self.fs.open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
        return h.hexdigest()

    def verify(self, manifest: dict[str, Any]) -> list[str]:
        """Files whose sha256 no longer matches the manifest (empty list: intact); always hashes."""
        base = self.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
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
        remote = self.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
        if self.local:
            return Path(remote)
        target, problems = self._fetch(manifest)
        if problems:
            raise StoreError(f"{remote} is damaged ({'; '.join(problems[:3])}); it is not used")
        return target

    def _cached(self, manifest: dict[str, Any]) -> Path:
        return self.cache / manifest["experiment"] / manifest["stage"] / "versions" / f"v{manifest['version']}-{manifest['fingerprint'][:12]}"

    def _check_sizes(self, manifest: dict[str, Any]) -> list[str]:
        base = self.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
        stats = manifest.get("file_stats") or {}
        problems = []
        self.fs.invalidate_cache(base)
        try:
            found = {p.rstrip("/"): info.get("size") for p, info in self.fs.find(base, detail=True).items()}
        except FileNotFoundError:
            found = {}
        except OSError as exc:
            raise self._remote_error(exc, f"listing {base}") from None
        prefix = base.rstrip("/") + "/"
        found = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in found.items()}
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

    def _fetch(self, manifest: dict[str, Any], *, again: bool = False) -> tuple[Path, list[str]]:
        """The cached copy of a remote version, downloaded when absent (or `again`, or found damaged), each
        file checked by sha256 as it lands. Returns (folder, problems of the bucket's copy)."""
        target = self._cached(manifest)
        if not again and (target / MANIFEST).is_file() and not self._cache_problems(manifest, target):
            return target, []
        remote = self.version_path(manifest["experiment"], manifest["stage"], manifest["version"])
        files.ensure_dir(self.cache, target.parent)
        tmp = target.with_name(target.name + f".partial-{uuid.uuid4().hex[:6]}")
        rels = [*manifest["files"], MANIFEST]
        try:
            for rel in rels:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            try:
                self.fs.get([f"{remote}/{rel}" for rel in rels], [str(tmp / rel) for rel in rels])
            except FileNotFoundError:
                raise
            except Exception as exc:  # noqa: BLE001 - one line naming the bucket and the endpoint
                raise self._remote_error(exc, f"downloading {remote}") from None
            problems = [f"{rel}: sha256 differs from the manifest" for rel, digest in manifest["files"].items()
                        if not (tmp / rel).is_file() or sha256_file(tmp / rel) != digest]
            if problems:
                return target, problems
            stamp = {rel: [(tmp / rel).stat().st_size, (tmp / rel).stat().st_mtime_ns] for rel in manifest["files"]}
            if target.exists():
                shutil.rmtree(target, ignore_errors=True)
            try:
                os.rename(tmp, target)
            except OSError:  # another process of this machine put it there first
                pass
            files.write_text(self.cache, self._stamp(target), json.dumps(stamp))
            return target, []
        except FileNotFoundError as exc:
            return target, [f"missing in the bucket ({str(exc)[:120]})"]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # -- writing -----------------------------------------------------------------------------
    def staging_dir(self, experiment: str, stage: str) -> Path:
        """A fresh local folder for a run's outputs; `commit` turns it into a version."""
        d = self.local_stage_dir(experiment, stage) / f".staging-{uuid.uuid4().hex[:12]}"
        try:
            d.mkdir()
        except OSError as exc:
            raise StoreError(f"cannot create {d}: {files.describe_os_error(exc, d)}") from None
        return d

    def next_version(self, experiment: str, stage: str) -> int:
        names = [e.rsplit("/", 1)[-1] for e in self._entries(self.stage_path(experiment, stage))]
        used = [int(m.group(1)) for n in names if (m := _VERSION.match(n))]
        return max(used, default=0) + 1

    def commit(self, staging: Path, manifest: dict[str, Any], *, min_version: int = 1) -> dict[str, Any]:
        """Digest the staged files, write the manifest last, and move the folder into place as v<N>
        (N at least `min_version`: a number records elsewhere still name is never given to new content)."""
        experiment, stage = manifest["experiment"], manifest["stage"]
        if lost_lease(self.url, experiment).is_set():
            raise StoreError(f"{experiment}/{stage}: this run lost the experiment's lease in {self.url} (another run may hold it); nothing committed")
        digests, stats = _stats(staging)
        manifest = {**manifest, "status": "completed", "files": digests, "file_stats": stats}
        try:
            for _ in range(100):
                version = max(self.next_version(experiment, stage), min_version)
                manifest["version"] = version
                (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=False, default=str))
                target = self.version_path(experiment, stage, version)
                if self.local:
                    files.check_no_links(Path(self.root), Path(target).parent)
                    try:
                        os.rename(staging, target)  # atomic; fails if target exists (as a folder with content)
                        return manifest
                    except OSError:
                        if not os.path.lexists(target):
                            raise
                        continue
                if not self._claim(target):
                    continue  # another writer has this number: take the next
                self._upload(staging, target, [*digests, MANIFEST])
                shutil.rmtree(staging, ignore_errors=True)
                return manifest
        except RegimenError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot commit {experiment}/{stage}: {files.describe_os_error(exc, staging)}") from None
        raise StoreError(f"could not allocate a version for {experiment}/{stage}")

    def _claim(self, target: str) -> bool:
        """Claim a remote version folder (exclusive create of `v<N>/.claim`): False when another writer has it."""
        with self._answers(f"claiming {target}"):
            return exclusive_create(self.fs, f"{target}/{CLAIM}", json.dumps({"by": f"pid {os.getpid()}", "at": now_iso()}).encode())

    def _upload(self, staging: Path, target: str, rels: list[str]) -> None:
        """Upload a folder's files, the last of `rels` last (exclusive create: the file that makes the folder
        count, e.g. the manifest). A version's claim stays: removed, it would hand the number to a writer
        whose listing predates the version (measured: two writers in one v<N>)."""
        *body, last = rels
        with self._answers(f"uploading {target}"):
            if body:
                self.fs.put([str(staging / rel) for rel in body], [f"{target}/{rel}" for rel in body])
            if not exclusive_create(self.fs, f"{target}/{last}", (staging / last).read_bytes()):
                raise StoreError(f"{target}/{last} appeared while this run uploaded it: two writers in one claimed folder; nothing more written")

    def _sweep_remote(self, experiment: str) -> None:
        """Claimed version folders that never got their manifest (a writer killed mid-upload), removed
        under the experiment's lease (no other writer of this experiment is running)."""
        with self._answers(f"sweeping {self.join(experiment)}"):
            for stage_dir in self._entries(self.join(experiment)):
                for entry in self._entries(stage_dir):
                    if _VERSION.match(entry.rsplit("/", 1)[-1]) and not self.fs.exists(f"{entry}/{MANIFEST}"):
                        log.warning("removing %s: a version claimed by a run that never finished uploading it", entry)
                        self.fs.rm(entry, recursive=True)

    def record_failure(self, staging: Path | None, manifest: dict[str, Any], error: str) -> str:
        """Keep a failed attempt beside the versions (with whatever it wrote, e.g. trajectories)."""
        experiment, stage = manifest["experiment"], manifest["stage"]
        name = f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
        record = {**manifest, "status": "failed", "error": error, "failed_at": now_iso()}
        text = json.dumps(record, indent=1, default=str)
        if staging is not None and staging.exists():
            files.write_text(self.cache, staging / "error.json", text)
            if self.local:
                target = files.ensure_dir(self.cache, Path(self.stage_path(experiment, stage)) / "failed") / name
                os.rename(staging, target)
                return str(target)
            remote = self.join(experiment, stage, "failed", name)
            rels = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file() and not p.is_symlink() and p.name != "error.json")
            self._upload(staging, remote, [*rels, "error.json"])  # error.json last: `failures` counts an attempt by it
            shutil.rmtree(staging, ignore_errors=True)
            return remote
        path = self.join(experiment, stage, "failed", name, "error.json")
        if self.local:
            files.write_text(Path(self.root), Path(path), text)
            return path
        with self._answers(f"writing {path}"):
            with self.fs.open(path, "wb") as fh:
                fh.write(text.encode())
        return path

    def failures(self, experiment: str, stage: str) -> list[dict[str, Any]]:
        entries = sorted(self._entries(self.join(check_name(experiment), stage, "failed")))
        return [r for e in entries if schemas.parse(schemas.Failure, r := self._read_json(f"{e}/error.json")) is not None]

    # -- the cycle's verdicts ----------------------------------------------------------------
    def record_decision(self, experiment: str, record: dict[str, Any]) -> str:
        """Keep one verdict of the cycle (it names the evaluation it judged); never overwritten."""
        name = f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S%f')}-{uuid.uuid4().hex[:6]}.json"
        path = self.join(check_name(experiment), "decisions", name)
        text = json.dumps({**record, "recorded_at": now_iso()}, indent=1, default=str)
        if self.local:
            files.write_text(Path(self.root), Path(path), text)
        else:
            with self._answers(f"writing {path}"):
                with self.fs.open(path, "wb") as fh:  # one PUT when closed: the object appears whole
                    fh.write(text.encode())
        return path

    def write_record(self, experiment: str, name: str, data: dict[str, Any]) -> str:
        """Replace the experiment-level record `name` (e.g. champion.json) atomically."""
        path = self.join(check_name(experiment), name)
        text = json.dumps(data, indent=1, default=str)
        if self.local:
            files.write_text(Path(self.root), Path(path), text)
        else:
            with self._answers(f"writing {path}"):
                with self.fs.open(path, "wb") as fh:  # one PUT when closed: readers see the old record or the new one
                    fh.write(text.encode())
        return path

    def read_record(self, experiment: str, name: str) -> Any:
        """The experiment-level record `name`, or None when there is none (or it is unreadable)."""
        return self._read_json(self.join(check_name(experiment), name))

    def has_record(self, experiment: str, name: str) -> bool:
        """Whether the record's file exists (readable or not)."""
        path = self.join(check_name(experiment), name)
        return os.path.lexists(path) if self.local else bool(self.fs.exists(path))

    def update_record(self, experiment: str, name: str, change, *, expect: int | None = None) -> dict[str, Any]:
        """Read, decide and write the record `name` as one step, under the experiment's record lock:
        `change(current)` gets the record as it is now (None when there is none) and returns the new one,
        whose `revision` is set here (one more than the current). With `expect`, the write happens only
        if the record's revision is still the one the caller read; else StaleRecord (compare-and-swap:
        the caller decides again on what is there now). Returns the record written."""
        with record_lock(self.fs, self.join(check_name(experiment), ".records.lock"), local_root=Path(self.root) if self.local else None):
            current = self.read_record(experiment, name)
            if current is None and self.has_record(experiment, name):
                raise StoreError(f"{self.join(experiment, name)}: unreadable (not the JSON the store wrote); restore it from a backup "
                                 "or move it aside (the experiment's history is in it)")
            revision = current.get("revision", 0) if isinstance(current, dict) else 0
            if expect is not None and revision != expect:
                raise StaleRecord(f"{experiment}/{name} changed (revision {expect} -> {revision}) since it was read")
            new = change(current)
            new["revision"] = revision + 1
            self.write_record(experiment, name, new)
            return new

    def decisions(self, experiment: str) -> list[dict[str, Any]]:
        """Every recorded verdict, oldest first."""
        entries = sorted(self._entries(self.join(check_name(experiment), "decisions")))
        return [r for e in entries if e.endswith(".json") and schemas.parse(schemas.Verdict, r := self._read_json(e)) is not None]

    def verdicts_by_eval(self, experiment: str) -> dict[int, dict[str, Any]]:
        """The newest verdict recorded for each eval version."""
        out: dict[int, dict[str, Any]] = {}
        for d in self.decisions(experiment):
            if isinstance(d.get("eval_version"), int):
                out[d["eval_version"]] = d
        return out

    # -- running markers and locks -----------------------------------------------------------
    def _running_file(self, experiment: str, stage: str) -> Path:
        return self.local_stage_dir(experiment, stage) / "running.json"

    @contextmanager
    def running(self, experiment: str, stage: str, info: dict[str, Any]) -> Iterator[None]:
        marker = self._running_file(experiment, stage)
        files.write_text(self.cache, marker, json.dumps({**info, "pid": os.getpid(), "since": now_iso(), "pid_started": process_started(os.getpid())}))
        with files.removed_after(self.cache, marker):
            yield

    def running_info(self, experiment: str, stage: str) -> dict[str, Any] | None:
        """The stage's running marker: None when there is none; `stale` when its process is gone (or the
        pid now belongs to another process), or the file is not a marker's shape (`malformed` says why)."""
        marker = self.cache / check_name(experiment) / stage / "running.json"
        try:
            info = json.loads(files.read_text(self.cache, marker))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (json.JSONDecodeError, StoreError, OSError, ValueError) as exc:
            return {"stale": True, "malformed": f"{marker}: unreadable ({str(exc)[:80]})"}
        if (why := schemas.problem(schemas.Running, info)) is not None:
            return {"stale": True, "malformed": f"{marker}: {why}"}
        started = process_started(info["pid"])
        if started is None or (started and info.get("pid_started") is not None and abs(started - info["pid_started"]) > 1.0):
            return {**info, "stale": True}
        return info

    def _sweep_staging(self, experiment: str) -> None:
        """Staging folders left by a killed run (only ever half-written: nobody else writes while we hold the lock)."""
        for stage_dir in (self.cache / experiment).glob("*"):
            if stage_dir.is_symlink() or not stage_dir.is_dir():
                continue
            for d in stage_dir.glob(".staging-*"):
                if not d.is_symlink():
                    shutil.rmtree(d, ignore_errors=True)

    @contextmanager
    def lock(self, experiment: str) -> Iterator[None]:
        """One run per experiment at a time, on this machine and across machines sharing the store."""
        check_name(experiment)
        with file_lock(self.cache, self.cache / experiment / ".lock", experiment=experiment, url=self.url):
            if self.local:
                self._sweep_staging(experiment)
                yield
                return
            self.probe()
            with ExitStack() as held:
                with self._answers(f"taking the lease of {experiment}"):
                    held.enter_context(lease(self.fs, self.join(experiment, ".lease.json"), experiment=experiment, url=self.url,
                                             lost=lost_lease(self.url, experiment)))
                self._sweep_staging(experiment)
                self._sweep_remote(experiment)
                yield
