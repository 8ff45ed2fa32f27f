"""Local file writes that never follow a link the store did not make.

A shared store is writable by several people; a symbolic link planted inside it (`running.json ->
~/.bashrc`) must not turn one of our writes into an overwrite elsewhere. So, inside a store root:
- every path component below the root is checked with `lstat`: a link is refused (StoreError);
- files are written to a fresh temporary name opened with O_CREAT|O_EXCL|O_NOFOLLOW and renamed over the
  target (`rename` replaces a link itself, never what it points to);
- reads open with O_NOFOLLOW.
The root itself may be a link (an operator's choice, resolved once when the store opens).
Hand-written because no library we use offers "no links below this root" for writes; the pieces are
stdlib calls (`os.open` flags, `os.replace`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from regimen.stages.core.errors import StoreError

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def describe_os_error(exc: OSError, path: str | os.PathLike) -> str:
    if exc.errno == errno.ENOSPC:
        return f"no space left on the device holding {path}"
    if exc.errno in (errno.EROFS,):
        return f"{path} is on a read-only filesystem"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied writing {path}"
    if exc.errno == errno.ENAMETOOLONG:
        return f"a name is too long for the filesystem: {path}"
    return f"{exc.strerror or exc} ({path})"


def check_no_links(root: Path, path: Path) -> None:
    """Refuse `path` when it, or any folder between `root` and it, is a symbolic link."""
    root = Path(root)
    path = Path(path)
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise StoreError(f"{path} is outside the store {root}") from None
    current = root
    for part in rel.parts:
        current = current / part
        if current.is_symlink():
            raise StoreError(
                f"{current} is a symbolic link inside the store; the store never follows links it did not make (remove "
                f"it)"
            )


def check_tree_no_links(path: Path) -> None:
    """Refuse a folder holding a symbolic link anywhere below it (a link the store did not make: training
    would write or read through it)."""
    for dirpath, dirs, names in os.walk(path, followlinks=False):
        for name in (*dirs, *names):
            found = Path(dirpath) / name
            if found.is_symlink():
                raise StoreError(
                    f"{found} is a symbolic link inside the store; the store never writes or reads through links it "
                    f"did not make (remove it)"
                )


def ensure_dir(root: Path, path: Path) -> Path:
    """mkdir -p below `root`, refusing links on the way."""
    path = Path(path)
    check_no_links(root, path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {path}: {describe_os_error(exc, path)}") from None
    check_no_links(root, path)  # a link planted between the check and the mkdir
    return path


def write_bytes(root: Path, path: Path, data: bytes) -> None:
    """Write `path` atomically (temporary name, then rename), never through a link."""
    path = Path(path)
    ensure_dir(root, path.parent)
    check_no_links(root, path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StoreError(f"cannot write {path}: {describe_os_error(exc, path)}") from None


def write_text(root: Path, path: Path, text: str) -> None:
    write_bytes(root, path, text.encode("utf-8"))


def read_text(root: Path, path: Path) -> str:
    """Read a file of the store without following a link (FileNotFoundError when absent)."""
    path = Path(path)
    check_no_links(root, path.parent)
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"{path} is a symbolic link inside the store; refusing to read through it") from None
        raise
    with os.fdopen(fd, encoding="utf-8") as fh:
        return fh.read()


@contextlib.contextmanager
def removed_after(root: Path, path: Path) -> Iterator[None]:
    """Remove `path` when the block ends; when the block failed, a failure to remove it is logged, never
    raised: the block's own error is the one the user sees (a read-only store fails both)."""
    try:
        yield
    except BaseException:
        try:
            unlink(root, path)
        except OSError as exc:
            logging.getLogger("regimen.store").warning("could not remove %s: %s", path, describe_os_error(exc, path))
        raise
    unlink(root, path)


def unlink(root: Path, path: Path) -> None:
    """Remove a file (or the link itself, never its target)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
