"""Where the store lives and how it answers: a local folder or an fsspec URL, its paths, small reads and
whole-object writes, and a remote store's errors as one line naming the bucket and the endpoint.

The store's parts (`catalog.py`: versions; `records.py`: records, verdicts, failed attempts;
`workspace.py`: this machine's work folders, running markers and the experiment lock) each hold one
`Backend` and work through it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fsspec.implementations.local import LocalFileSystem

from regimen.stages.core.errors import InputError, RegimenError, StoreError
from regimen.stages.core.urls import store_url_problem
from regimen.stages.store import files, schemas, work
from regimen.stages.store.lock import exclusive_create, probe_conditional_create

MANIFEST = "manifest.json"
DOOR = ("listing the bucket", "probing conditional writes")
"""What the store is doing when a refusal means the run has written nothing yet (checks at the door)."""
CLAIM = ".claim"  # made first in a remote v<N>/ (exclusive create) and kept: the number is taken for good
_PROBED: set[str] = set()  # remote stores whose conditional create was checked in this process
_REACHED: set[str] = set()  # remote stores answered once in this process
VERSION = re.compile(r"^v(\d+)$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def check_name(name: str, what: str = "experiment") -> str:
    """Experiment names become folder names: letters, digits, `_.-`, at most 100 characters."""
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        shown = name if len(str(name)) <= 60 else f"{str(name)[:57]}..."
        raise InputError(
            f"{what} {shown!r}: use 1-100 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return name


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def well_formed(manifest: Any) -> bool:
    """A manifest of the shape the store writes (`schemas.Manifest`): anything else is damaged."""
    return schemas.parse(schemas.Manifest, manifest) is not None


class Backend:
    """A store's root (a local folder or an fsspec URL) and this machine's cache of it."""

    def __init__(self, root: str | os.PathLike, cache_dir: str | os.PathLike | None = None):
        self.url = str(root)
        if problem := store_url_problem(self.url):
            raise InputError(f"store {self.url!r}: {problem}")
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
            raise StoreError(
                f"store {self.url}: cannot create {self.cache}: {files.describe_os_error(exc, self.cache)}"
            ) from None
        if not self.local:
            self.reachable()

    # -- a remote store answers as it must ---------------------------------------------------
    def _endpoint(self) -> str:
        return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "the default AWS endpoint"

    def _where(self) -> str:
        return f"store {self.url} (bucket {self.root.split('/', 1)[0]!r} at {self._endpoint()})"

    @contextmanager
    def answers(self, doing: str) -> Iterator[None]:
        """Turn s3fs/botocore errors while `doing` into one line naming the bucket and the endpoint."""
        try:
            yield
        except RegimenError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a one-line error below, or re-raised
            raise self.remote_error(exc, doing) from None

    def remote_error(self, exc: BaseException, doing: str) -> BaseException:
        where = self._where()
        names = {c.__name__ for c in type(exc).__mro__}
        cause = exc.__cause__ or exc.__context__
        response = getattr(cause, "response", None) or getattr(exc, "response", None)
        code = str(((response or {}).get("Error") or {}).get("Code", "")) if isinstance(response, dict) else ""
        text = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        # at the door (before the run writes anything) nothing was written; later, the caller says what was
        nothing = "; nothing was written" if doing in DOOR else ""
        if code in ("NoSuchBucket",) or (isinstance(exc, FileNotFoundError) and "bucket" in text.lower()):
            return InputError(f"{where}: the bucket does not exist (create it, or correct `store:`){nothing}")
        if (
            code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken")
            or isinstance(exc, PermissionError)
            or "NoCredentialsError" in names
        ):
            return InputError(
                f"{where}: the credentials were refused while {doing} ({text}); check AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY (the key {os.environ.get('AWS_ACCESS_KEY_ID', '(unset)')[:8]}... was refused)"
                f"{nothing}"
            )
        if names & {
            "EndpointConnectionError",
            "ConnectTimeoutError",
            "ConnectionClosedError",
            "ReadTimeoutError",
            "ClientConnectorError",
        } or isinstance(exc, (ConnectionError, TimeoutError)):
            return StoreError(
                f"{where}: the endpoint cannot be reached while {doing} ({type(exc).__name__}); check AWS_ENDPOINT_URL "
                f"and the network{nothing}"
            )
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
            with self.answers("listing the bucket"):
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
        with self.answers("probing conditional writes"):
            honoured = probe_conditional_create(self.fs, key)
        if not honoured:
            raise StoreError(
                f"{self._where()} does not honour conditional writes "
                "(a second create with If-None-Match: * was not refused): two runs could take one experiment's lease "
                "or one version number there; use a server that supports them (AWS S3, SeaweedFS, MinIO)"
            )
        _PROBED.add(self._asked())

    # -- paths -------------------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        """A path (or URL path) inside the store."""
        return "/".join([self.root.rstrip("/"), *parts])

    def stage_path(self, experiment: str, stage: str) -> str:
        return self.join(check_name(experiment), stage)

    def version_path(self, experiment: str, stage: str, version: int) -> str:
        return self.join(check_name(experiment), stage, f"v{version}")

    # -- small reads, whole writes -------------------------------------------------------------
    def read_json(self, path: str) -> Any:
        """The JSON at `path`, or None when it is missing or not JSON."""
        try:
            if self.local:
                return json.loads(files.read_text(Path(self.root), Path(path)))
            return json.loads(self.fs.cat_file(path))  # one GET of the whole object: no cached size to tear it
        except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError, StoreError):
            return None
        except OSError:
            return None

    def read_json_there(self, path: str) -> tuple[bool, Any]:
        """Whether something is at `path`, and its JSON (None when it is there but not JSON, or cannot be read),
        from one read. Why not `read_json` and then an existence check: another writer can create the object
        between the two, and a record being written would read as a damaged one."""
        try:
            if self.local:
                return True, json.loads(files.read_text(Path(self.root), Path(path)))
            return True, json.loads(self.fs.cat_file(path))
        except (FileNotFoundError, NotADirectoryError):
            return False, None
        except (json.JSONDecodeError, UnicodeDecodeError, StoreError, OSError):
            return True, None

    def entries(self, path: str) -> list[str]:
        try:
            if not self.local:
                self.fs.invalidate_cache(path)  # another host may have written since this process listed it
            return [e.rstrip("/") for e in self.fs.ls(path, detail=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {path}: {files.describe_os_error(exc, path)}") from None

    def write_text(self, path: str, text: str) -> str:
        """Write `path` whole: a local file by temporary name then rename; a remote object by one PUT when
        closed (readers see the old object or the new one)."""
        if self.local:
            files.write_text(Path(self.root), Path(path), text)
        else:
            with self.answers(f"writing {path}"):
                with self.fs.open(path, "wb") as fh:
                    fh.write(text.encode())
        return path

    def upload(self, staging: Path, target: str, rels: list[str]) -> None:
        """Upload a folder's files, the last of `rels` last (exclusive create: the file that makes the folder
        count, e.g. the manifest). A version's claim stays: removed, it would hand the number to a writer
        whose listing predates the version (measured: two writers in one v<N>)."""
        *body, last = rels
        with self.answers(f"uploading {target}"):
            if body:
                self.fs.put([str(staging / rel) for rel in body], [f"{target}/{rel}" for rel in body])
            if not exclusive_create(self.fs, f"{target}/{last}", (staging / last).read_bytes()):
                raise StoreError(
                    f"{target}/{last} appeared while this run uploaded it: two writers in one claimed folder; nothing "
                    f"more written"
                )
