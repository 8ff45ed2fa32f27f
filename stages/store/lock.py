"""Locks: one run per experiment (on any store, across machines), and one computing stage per machine.

Experiment lock.
- Local store: `filelock` on `<store>/<experiment>/.lock` (an OS lock: a crashed holder's lock is
  released by the kernel).
- Any fsspec store (`s3://`, `gs://`, ...): a lease file `<experiment>/.lease.json` created with fsspec's
  exclusive mode (`"xb"`: a conditional create on S3 and GCS; O_EXCL locally), holding an owner, a token
  and an expiry that a heartbeat thread extends every `ttl/3` seconds. A second machine's create fails,
  and it is refused with the holder named. A crashed holder stops renewing; once its lease has expired
  the next run removes it and creates its own. A lease also names the machine (hostname, boot id and PID
  namespace) and the process (pid and its start time): a run on that same machine takes over at once a
  lease whose process is gone (a rerun after a crash does not wait for the expiry); any other machine
  waits for the expiry, since it cannot see the holder's processes. The local cache also takes the file lock, so two
  runs on one machine are refused the same way.

Record lock (`record_lock`): the experiment's records (champion.json) are changed by a run's decision and
by a person's `promote`/`rollback`, which must not wait for a night's training to end. Each change is a
short read-decide-write under this lock (a file lock locally; in a remote store a small lock object made
by exclusive create, with an expiry so a crashed holder cannot block it for long); the run's decision,
which evaluates the champion first, compares the record's `revision` with the one it read and decides
again when a person's move landed in between (`Store.update_record`).

Exclusive create (`exclusive_create`): fsspec's `"xb"` mode, with one addition. s3fs turns a refused
conditional PUT into FileExistsError only when the server names the condition in its error (AWS does);
S3-compatible servers that honour `If-None-Match: *` but answer a bare 412 PreconditionFailed (SeaweedFS,
measured with 4.48) surface as a generic OSError whose cause is botocore's ClientError. Both mean "it
exists"; a 409 ConditionalRequestConflict (two conditional writes racing) means "someone else got it".
`probe_conditional_create` checks once per store that a second create of the same key is refused, so a
bucket that ignores the condition is named before anything relies on it.

Machine slot (`machine_slot`): a file lock in the user's cache (`$REGIMEN_CACHE`, default
`~/.cache/regimen`) held while a stage computes (never while it is reused), so two `regimen run` on one
machine take turns instead of oversubscribing its cores: the second one waits and says for whom.
`REGIMEN_MACHINE_SLOTS=0` switches it off (e.g. on a GPU machine that runs several small jobs).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from filelock import FileLock, Timeout

from regimen.stages.core.errors import RegimenError, StoreError
from regimen.stages.store import files

log = logging.getLogger("regimen.store")


def _lease_ttl(default: float = 120.0) -> float:
    """The experiment lease's time to live: REGIMEN_LEASE_TTL_S (at least 10 s) or 120 s. A work pool's
    automation reschedules a lost host's run only after this long (flows/serving/pool.py), and the tests shorten it."""
    raw = os.environ.get("REGIMEN_LEASE_TTL_S", "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value >= 10:
        return value
    log.warning("REGIMEN_LEASE_TTL_S=%r is not a number of seconds >= 10: the lease lives %.0f s", raw, default)
    return default


LEASE_TTL_S = _lease_ttl()


class ExperimentBusy(RegimenError):
    """Another run holds this experiment's lock."""


def _now() -> float:
    return time.time()


def _owner() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()} since {datetime.now(UTC).isoformat(timespec='seconds')}"


def _machine() -> str:
    """This machine as a lease names it: hostname, kernel boot id and PID namespace (two containers on one
    host share the hostname, not the PID namespace: neither may judge the other's pids)."""
    parts = [socket.gethostname()]
    try:
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        return ""  # no way to tell this machine apart: never judge a holder by its pid
    return ":".join(parts)


def process_started(pid: int) -> float | None:
    """When process `pid` started (psutil), or None when there is no such process (0.0: not ours to see)."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, ValueError, OverflowError):
        return None
    except psutil.AccessDenied:
        return 0.0


def _holder_gone(record: dict) -> bool:
    """Whether a lease's holder was a process of this machine that no longer runs (or whose pid another
    process now has)."""
    machine = _machine()
    if not machine or record.get("machine") != machine or not isinstance(record.get("pid"), int):
        return False
    started = process_started(record["pid"])
    if started is None:
        return True
    recorded = record.get("pid_started")
    return bool(started) and isinstance(recorded, (int, float)) and abs(started - recorded) > 1.0


def _busy(experiment: str, url: str, holder: str) -> ExperimentBusy:
    return ExperimentBusy(
        f"experiment {experiment!r} in store {url} is already being run by another "
        f"process{f' ({holder})' if holder else ''}; "
        "wait for it to finish, or use --experiment NAME to run a separate experiment"
    )


@contextmanager
def file_lock(root: Path, path: Path, *, experiment: str, url: str) -> Iterator[None]:
    files.ensure_dir(root, path.parent)
    files.check_no_links(root, path)
    owner_file = path.with_suffix(".owner")
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        try:
            holder = files.read_text(root, owner_file).strip()
        except (OSError, StoreError):
            holder = ""
        raise _busy(experiment, url, holder) from None
    try:
        files.write_text(root, owner_file, _owner())
        with files.removed_after(root, owner_file):  # the run's own error wins over a failed clean-up
            yield
    finally:
        lock.release()


_LOST: dict[tuple[str, str], threading.Event] = {}


def lost_lease(url: str, experiment: str) -> threading.Event:
    """Set (for this process) when the experiment's lease in a remote store can no longer be vouched for:
    every Store object of that store then refuses to commit, and checkpoints stop going to the bucket."""
    return _LOST.setdefault((url, experiment), threading.Event())


def lease_lost_here(experiment: str) -> bool:
    """Whether this process lost the experiment's lease in any store (read without opening a store)."""
    return any(event.is_set() for (_, name), event in list(_LOST.items()) if name == experiment)


def _refused_by_condition(exc: BaseException) -> bool:
    """Whether `exc` is a server's answer that the key exists (412 PreconditionFailed, 409
    ConditionalRequestConflict)."""
    if isinstance(exc, FileExistsError):
        return True
    cause = exc.__cause__ or exc.__context__
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return False
    code = str((response.get("Error") or {}).get("Code", ""))
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)


def exclusive_create(fs, path: str, data: bytes) -> bool:
    """Create `path` holding `data` only if nothing is there: True when this call created it, False when
    it exists (or another writer's create won). Other errors propagate."""
    try:
        with fs.open(path, "xb") as fh:
            fh.write(data)
        return True
    except OSError as exc:
        if _refused_by_condition(exc):
            return False
        raise


def probe_conditional_create(fs, path: str) -> bool:
    """Whether the store refuses a second exclusive create of one key (the lease and the version claims rely
    on it). Leaves nothing behind."""
    first = exclusive_create(fs, path, b"probe 1")
    try:
        second = exclusive_create(fs, path, b"probe 2")
    finally:
        try:
            fs.rm_file(path)
        except FileNotFoundError:
            pass
    return first and not second


ATOMIC_CREATE = {"file", "local", "memory", "s3", "s3a", "gcs", "gs"}
"""fsspec protocols whose `"xb"` is a real conditional create (O_EXCL; S3's and GCS's if-none-match)."""


def _acquire(fs, path: str, create, *, experiment: str, url: str) -> None:
    """Create the lease, or take it over when its holder's lease expired or its process is gone from this
    machine; else ExperimentBusy naming the holder."""
    if create():
        return
    try:
        current = json.loads(fs.cat_file(path))
    except Exception:  # noqa: BLE001 - unreadable or vanished: treat as expired
        current = {"expires": 0, "owner": "unreadable lease"}
    gone = _holder_gone(current)
    if float(current.get("expires", 0)) > _now() and not gone:
        raise _busy(experiment, url, str(current.get("owner", "")))
    log.warning(
        "taking over the lease of %s (%s): %s",
        experiment,
        current.get("owner"),
        "its process is gone from this machine" if gone else "it expired",
    )
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        pass
    if not create():
        raise _busy(experiment, url, "another run took the expired lease first")


@contextmanager
def lease(
    fs, path: str, *, experiment: str, url: str, ttl_s: float = LEASE_TTL_S, lost: threading.Event | None = None
) -> Iterator[None]:
    """An expiring lease in any fsspec store (see the module doc). `lost` is set when the lease can no
    longer be vouched for (another run took it over, or renewing failed until it expired): the store
    then refuses to commit, so a run that lost its lease never writes a version."""
    token = uuid.uuid4().hex
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if not protocols & ATOMIC_CREATE:
        log.warning(
            "store %s (%s): fsspec's exclusive create may not be atomic on this backend; two machines starting the "
            "same experiment in the same instant could both proceed",
            url,
            "/".join(sorted(protocols)),
        )

    def create() -> bool:
        record = {
            "owner": _owner(),
            "token": token,
            "expires": _now() + ttl_s,
            "machine": _machine(),
            "pid": os.getpid(),
            "pid_started": process_started(os.getpid()),
        }
        return exclusive_create(fs, path, json.dumps(record).encode())

    _acquire(fs, path, create, experiment=experiment, url=url)
    stop = threading.Event()

    renewed = [_now()]

    def renew() -> None:
        while not stop.wait(ttl_s / 3):
            try:
                current = json.loads(fs.cat_file(path))
                if current.get("token") != token:
                    log.error(
                        "the lease of %s was taken over by %s: this run will not commit",
                        experiment,
                        current.get("owner"),
                    )
                    if lost is not None:
                        lost.set()
                    return
                current["expires"] = _now() + ttl_s
                with fs.open(path, "wb") as fh:
                    fh.write(json.dumps(current).encode())
                renewed[0] = _now()
            except Exception as exc:  # noqa: BLE001 - keep trying until the lease would have expired
                log.warning("could not renew the lease of %s: %s", experiment, exc)
                if _now() - renewed[0] > ttl_s * 0.9 and lost is not None:
                    log.error("the lease of %s expired while renewing failed: this run will not commit", experiment)
                    lost.set()
                    return

    thread = threading.Thread(target=renew, name=f"lease-{experiment}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        try:
            if json.loads(fs.cat_file(path)).get("token") == token:
                fs.rm_file(path)
        except Exception:  # noqa: BLE001 - an expired lease is harmless
            pass


RECORD_LOCK_TTL_S = 30.0
RECORD_LOCK_WAIT_S = 60.0


def _record_lock_ttl() -> float:
    """The record lock's time to live: REGIMEN_RECORD_LOCK_TTL_S (at least 1 s: the tests shorten it) or 30 s."""
    try:
        return max(1.0, float(os.environ.get("REGIMEN_RECORD_LOCK_TTL_S", "") or RECORD_LOCK_TTL_S))
    except ValueError:
        return RECORD_LOCK_TTL_S


@contextmanager
def record_lock(
    fs, path: str, *, local_root: Path | None, wait_s: float = RECORD_LOCK_WAIT_S, ttl_s: float | None = None
) -> Iterator[None]:
    """Hold the lock on an experiment's records for one read-decide-write (seconds, never a training).
    Waits up to `wait_s` for another holder; then StoreError naming it. `local_root`: the store's root when
    it is a local folder (filelock), else None (a lock object in the fsspec store, renewed while held).

    The lock gives turns, not safety: a holder paused past the lock's expiry (SIGSTOP, a frozen VM) loses it
    to the next one. What is written under it is fenced at the write itself (`Ledger.update`: each revision
    is claimed by an exclusive create, so a holder that lost the lock and resumes is refused there)."""
    if local_root is not None:
        with _local_record_lock(path, local_root, wait_s):
            yield
        return
    ttl_s = ttl_s if ttl_s is not None else _record_lock_ttl()
    token = uuid.uuid4().hex
    _take_record_lock(fs, path, token, wait_s, ttl_s)
    stop = threading.Event()
    thread = threading.Thread(target=_renew_record_lock, args=(fs, path, token, ttl_s, stop), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        try:
            if json.loads(fs.cat_file(path)).get("token") == token:
                fs.rm_file(path)
        except Exception:  # noqa: BLE001 - gone already, or expired and taken over
            pass


@contextmanager
def _local_record_lock(path: str, local_root: Path, wait_s: float) -> Iterator[None]:
    lock_path = Path(path)
    files.ensure_dir(local_root, lock_path.parent)
    files.check_no_links(local_root, lock_path)
    lock = FileLock(str(lock_path), timeout=wait_s)
    try:
        lock.acquire()
    except Timeout:
        raise StoreError(
            f"{lock_path}: the experiment's records stayed locked for {wait_s:.0f} s by another process; try again"
        ) from None
    except OSError as exc:  # a read-only or full store: the store's error, which a stopped run reports as a warning
        raise StoreError(f"cannot lock the experiment's records: {files.describe_os_error(exc, lock_path)}") from None
    try:
        yield
    finally:
        lock.release()


def _take_record_lock(fs, path: str, token: str, wait_s: float, ttl_s: float) -> None:
    deadline = _now() + wait_s
    while True:
        if exclusive_create(
            fs, path, json.dumps({"owner": _owner(), "token": token, "expires": _now() + ttl_s}).encode()
        ):
            return
        try:
            raw = fs.cat_file(path)
        except FileNotFoundError:
            continue
        try:
            current = json.loads(raw)
            if not math.isfinite(float(current.get("expires", 0))):
                raise ValueError("expires is not a finite time")
        except Exception:  # noqa: BLE001 - unreadable (empty, cut short, another tool's): it expires by its age
            current = {"expires": _modified(fs, path) + ttl_s, "owner": "an unreadable lock (aged by its write time)"}
        if float(current.get("expires", 0)) < _now():
            log.warning("taking over an expired record lock of %s (%s)", path, current.get("owner"))
            try:
                if fs.cat_file(path) == raw:  # still the lock judged expired (not a new holder's)
                    fs.rm_file(path)
            except FileNotFoundError:
                pass
            continue
        if _now() > deadline:
            raise StoreError(
                f"{path}: the experiment's records stayed locked for {wait_s:.0f} s by {current.get('owner')}; "
                "try again"
            )
        time.sleep(0.2)


def _modified(fs, path: str) -> float:
    """When `path` was last written, in seconds since the epoch, by the store's clock (S3's LastModified, a file's
    mtime; a datetime without a zone is UTC), compared by the caller with this host's clock: a host whose clock
    runs ahead takes an unreadable lock over that much sooner. Now when the store does not say."""
    with contextlib.suppress(Exception):
        fs.invalidate_cache(path)  # a listing cached earlier may not hold the lock, or hold an older one
    try:
        value = fs.modified(path)
    except Exception:  # noqa: BLE001 - not every fsspec backend implements it: read its info instead
        try:
            info = fs.info(path)
        except Exception:  # noqa: BLE001 - gone meanwhile, or the store cannot say
            return _now()
        value = next((info[k] for k in ("LastModified", "mtime", "last_modified", "created") if info.get(k)), None)
    if isinstance(value, datetime):
        value = value if value.tzinfo else value.replace(tzinfo=UTC)
        return value.timestamp()
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return _now()


def _renew_record_lock(fs, path: str, token: str, ttl_s: float, stop: threading.Event) -> None:
    """Extend the lock's expiry every third of its time to live while it is ours; stop once it is not (the
    write that follows is refused by its fence then, not by this thread)."""
    while not stop.wait(ttl_s / 3):
        try:
            try:
                current = json.loads(fs.cat_file(path))
            except FileNotFoundError:
                current = {"owner": "nobody: it expired and was released by the holder that took it over"}
            if current.get("token") != token:
                log.warning(
                    "the record lock %s was taken over (%s): this holder's write will be refused",
                    path,
                    current.get("owner"),
                )
                return
            current["expires"] = _now() + ttl_s
            with fs.open(path, "wb") as fh:
                fh.write(json.dumps(current).encode())
        except Exception as exc:  # noqa: BLE001 - keep trying; the fence keeps the write safe meanwhile
            log.warning("could not renew the record lock %s: %s", path, exc)


def machine_lock_path() -> Path:
    base = Path(os.environ.get("REGIMEN_CACHE", Path.home() / ".cache" / "regimen"))
    base.mkdir(parents=True, exist_ok=True)
    return base / "machine-slot.lock"


@contextmanager
def machine_slot(label: str, *, say=None) -> Iterator[None]:
    """Hold this machine's compute slot while `label` runs; wait (and say so) while another run holds it."""
    if os.environ.get("REGIMEN_MACHINE_SLOTS", "1") == "0":
        yield
        return
    path = machine_lock_path()
    lock = FileLock(str(path))
    owner = path.with_suffix(".owner")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        try:
            holder = owner.read_text().strip()
        except OSError:
            holder = "another run"
        message = (
            f"waiting for this machine's compute slot: {holder} is running (REGIMEN_MACHINE_SLOTS=0 runs both at once)"
        )
        (say or log.warning)(message)
        lock.acquire()
    try:
        try:
            owner.write_text(f"{label} (pid {os.getpid()})")
        except OSError:
            pass
        yield
    finally:
        lock.release()
