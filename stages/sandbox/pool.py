"""The parent side of the sandbox: jobs, limits, results, and pools of worker slots kept warm.

Each worker slot is a thread of the caller's process driving one long-lived server process
(`server.py`, started as `python -I -S server.py --serve SETTINGS` with an empty environment and its own
session; it dies with the parent). Jobs go to the server as JSON lines on its stdin and results come
back as JSON lines on its stdout. A server that dies or hangs costs the item it was running
(`status="infra"`, never retried: one solution never runs twice) and is restarted; a slot that keeps
failing gives up and leaves the remaining items to the other slots.

Servers outlive a call. GRPO calls the reward once per step, hundreds of times, and starting a slot's
server (an interpreter, the zygote, a probe sample) costs 0.1-0.3 s; so the servers of a call are kept
in a pool, per (SandboxConfig, slot count), and the next call with the same limits reuses them (a
server found dead is restarted; at most `_MAX_KEPT` idle pools are kept, the least recently used one
is closed first). Keeping a server changes nothing for isolation: every sample is still a fresh fork
of the server's zygote, which was forked before the server read any job. Two calls at once never
share a pool (the second gets its own), and every slot of every pool of this process has its own two
uids. Pools are closed at interpreter exit (atexit) or by `shutdown()`; a child made by `os.fork()`
drops its copies of the parent's pipes and starts its own pools.

Servers are started from one long-lived thread of this process (`_Spawner`): a server asks to be
killed when its parent goes (PR_SET_PDEATHSIG), and the kernel sends that when the *thread* that
started it ends, which for a batch's worker threads is at the end of every call.

Stdlib only, apart from the optional `pyseccomp` (libseccomp) that `syscalls.py` uses to build the
syscall filter; without it isolation counts as unavailable.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from . import server as _server_module
from . import syscalls

log = logging.getLogger("regimen.sandbox")

_SERVER_SCRIPT = os.path.abspath(_server_module.__file__)
_SERVER_START_TIMEOUT_S = 30.0
_BACKSTOP_S = 15.0  # extra seconds the parent waits for a server's answer before declaring it dead
_MAX_SLOTS = 128  # two uids per slot, 256 uids per parent process, shared by all its pools
_MAX_KEPT = 4  # idle pools kept warm between calls
_warned_unisolated = False
_status_lock = threading.Lock()
_status_cache: tuple[bool, str] | None = None


class SandboxUnavailable(RuntimeError):
    """Isolation is unavailable on this host and the caller did not allow unisolated execution."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one sample (the solution and all its tests together). Defaults suit MBPP/HumanEval."""

    timeout_s: float = 5.0
    """CPU seconds the sample may use (solution, judge and every process they start, counted by the
    slot's CPU cgroup; without one, RLIMIT_CPU per process, this rounded up plus two seconds)."""
    wall_timeout_s: float | None = None
    """Wall-clock backstop for samples that sleep or wait; default 3 × timeout_s + 2 s."""
    memory_mb: int = 512
    """Address-space limit of each of the solution's processes; the slot's memory cgroup allows this plus
    256 MiB for the judge, and within it the OOM killer takes the solution's processes first."""
    nproc: int = 32
    """Processes (threads count) the solution's uid may have."""
    cpus_per_slot: float = 1.0
    """CPU share of one worker slot (cgroup CPU quota), so a sample cannot starve its neighbours."""
    file_size_mb: int = 16
    """Largest file the solution may write (RLIMIT_FSIZE)."""
    open_files: int = 64
    """RLIMIT_NOFILE."""
    tmpfs_mb: int = 64
    """Size of the sample's fresh /tmp (the working folders live there); /dev/shm gets a quarter."""
    output_limit: int = 16384
    """Bytes of stdout+stderr kept per sample; more is discarded (the solution can go on printing)."""
    allow_unisolated: bool = False
    """Run without namespaces, mounts or the syscall filter where they are unavailable, instead of
    raising SandboxUnavailable. The solution and the judge stay separate processes."""
    isolation: bool = True
    """False skips the namespaces even where they work (tests); it still needs `allow_unisolated=True`."""
    use_cgroups: bool = True
    """Use cgroups (CPU share and accounting, memory, pids) for each worker slot where the host has them."""
    uid_base: int | None = None
    """First unprivileged uid; slot k uses uid_base + 2k (solution) and uid_base + 2k + 1 (judge).
    Default: derived from the parent's pid so that two processes scoring at once do not share uids."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "nproc", "file_size_mb", "open_files", "tmpfs_mb", "output_limit"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxConfig.{name} must be positive, got {getattr(self, name)!r}")
        if self.open_files < 8:
            raise ValueError("SandboxConfig.open_files must be at least 8")
        if self.wall_timeout_s is not None and not self.wall_timeout_s > 0:
            raise ValueError(f"SandboxConfig.wall_timeout_s must be positive, got {self.wall_timeout_s!r}")
        if not self.cpus_per_slot >= 0:
            raise ValueError(f"SandboxConfig.cpus_per_slot must be >= 0 (0: no quota), got {self.cpus_per_slot!r}")

    @property
    def wall_s(self) -> float:
        return self.wall_timeout_s if self.wall_timeout_s is not None else 3 * self.timeout_s + 2


@dataclass(frozen=True)
class Job:
    """One sample to judge."""

    code: str
    """The solution: Python source, run in its own process."""
    tests: list[str]
    """Test snippets, run in order by the judge; a snippet passes when it runs to its end without raising."""
    entry_point: str | None = None
    """The function under test: the one solution name that may shadow a builtin or a set-up name."""
    setup: str | None = None
    """Trusted code the judge runs before the tests (a HumanEval prompt's helpers, MBPP's
    test_setup_code/test_imports); its names are never shadowed by the solution's."""


@dataclass
class SandboxResult:
    passed: int
    """Test snippets that ran to their end without raising (0 whenever the run ended abnormally)."""
    total: int
    error: str | None = None
    """None when every snippet ran; else why not (load failure, timeout, early exit, infra)."""
    status: str = "ok"
    """ok: the judge finished (tests may still have failed); aborted: the sample timed out or the
    judge was killed (scores 0); infra: the sandbox itself or the row's set-up code failed (not the
    solution's fault; no score)."""
    tests: list[bool] = field(default_factory=list)
    """Per snippet: ran to its end without raising."""
    test_errors: list[str | None] = field(default_factory=list)
    """Per snippet: the exception it raised (`AssertionError`, `NameError: ...`), None when it passed
    or did not run."""
    output: str = ""
    """Captured stdout+stderr of the solution and the judge, at most `output_limit` bytes."""
    duration_s: float = 0.0
    isolated: bool = True
    cpu_s: float | None = None
    """CPU seconds the sample used, where the slot has a CPU cgroup."""
    slot: int | None = None
    """The worker slot that ran it."""

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def _default_uid_base() -> int:
    return 1_000_000 + (os.getpid() % 100_000) * 256


def _interpreter() -> str:
    return sys.executable or "/usr/bin/python3"


class _ServerDied(Exception):
    pass


def _unavailable_message(reason: str) -> str:
    return (
        f"sandbox: cannot isolate untrusted code on this host ({reason}). Refusing to run model-written "
        "code without namespaces, a minimal filesystem and a syscall filter. To run it anyway, at your own "
        "risk, allow unisolated execution explicitly (allow_unisolated=True; in a recipe, the unit_tests "
        "reward's `allow_unisolated: true` option)."
    )


class _Server:
    """One worker slot: a long-lived server process that runs one sample at a time."""

    def __init__(self, slot: int, cfg: SandboxConfig, uid_index: int | None = None):
        """`slot`: the position reported in results; `uid_index`: which pair of uids it runs samples
        as (default `slot`; a pool passes the indices it reserved)."""
        self.slot = slot
        self.cfg = cfg
        index = slot if uid_index is None else uid_index
        base = cfg.uid_base if cfg.uid_base is not None else _default_uid_base()
        program, why = syscalls.program()
        settings = asdict(cfg)
        settings.update(
            uid_s=base + 2 * index, uid_j=base + 2 * index + 1, parent_pid=os.getpid(), slot=slot, wall_timeout_s=cfg.wall_s,
            seccomp=program.hex() if program else None, seccomp_error=why,
        )
        self.proc = _spawner.popen(
            [_interpreter(), "-I", "-S", _SERVER_SCRIPT, "--serve", json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={},
            start_new_session=True,
            close_fds=True,
        )
        self._buf = b""
        self.cgroups: list[str] = []
        hello = self._read(time.monotonic() + _SERVER_START_TIMEOUT_S)
        if hello is None:
            self.close()
            raise RuntimeError("sandbox: the sandbox server did not start (see stderr for its traceback)")
        self.isolated = bool(hello.get("isolated"))
        self.reason = str(hello.get("reason") or "")
        self.cgroups = list(hello.get("cgroups") or [])
        self.cpu_accounting = bool(hello.get("cpu_accounting"))
        if not hello.get("ready"):
            self.close()
            raise SandboxUnavailable(_unavailable_message(self.reason))

    def _read(self, deadline: float) -> dict | None:
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            return None

    def run(self, job: Job) -> SandboxResult:
        try:
            self.proc.stdin.write(json.dumps(asdict(job)).encode() + b"\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except OSError as exc:
            raise _ServerDied(f"sandbox server unreachable: {exc}") from None
        reply = self._read(time.monotonic() + self.cfg.wall_s + _BACKSTOP_S)
        if reply is None:
            raise _ServerDied(f"sandbox server (slot {self.slot}) died or hung; exit code {self.proc.poll()}")
        known = SandboxResult.__dataclass_fields__
        return SandboxResult(**{k: v for k, v in reply.items() if k in known}, slot=self.slot)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def begin_close(self) -> None:
        """Close the job stream: the server finishes, cleans up and exits (see `close`)."""
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass

    def forget(self) -> None:
        """In a forked child: let go of this process's copies of the server's pipes without touching
        the server (it is the parent's). /dev/null is put in their place, so that closing the file
        objects later closes nothing of the child's."""
        try:
            null = os.open(os.devnull, os.O_RDWR)
        except OSError:
            return
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None and not stream.closed:
                    os.dup2(null, stream.fileno())
            except (OSError, ValueError):
                pass
        os.close(null)

    def close(self) -> None:
        self.begin_close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        for path in self.cgroups:  # the server removes them; this covers a server that was killed
            try:
                os.rmdir(path)
            except OSError:
                pass


class _Spawner:
    """Starts server processes from one long-lived daemon thread (see the module docstring: a server
    dies with the thread that started it, and a call's worker threads end with the call)."""

    def __init__(self) -> None:
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="sandbox-spawner", daemon=True)
                self.thread.start()
        box: dict[str, Any] = {}
        done = threading.Event()
        self.requests.put((args, kwargs, box, done))
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["proc"]

    def _loop(self) -> None:
        while True:
            args, kwargs, box, done = self.requests.get()
            try:
                box["proc"] = subprocess.Popen(*args, **kwargs)
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            finally:
                done.set()
                del args, kwargs, box, done


_spawner = _Spawner()


class _Pool:
    """Worker slots for one (config, slot count): a server per slot (None until started), kept between
    calls. Used by one call at a time."""

    def __init__(self, key: tuple, cfg: SandboxConfig, indices: list[int]):
        self.key = key
        self.cfg = cfg
        self.indices = indices  # the uid pairs reserved for its slots
        self.servers: list[_Server | None] = [None] * len(indices)

    def server(self, slot: int) -> _Server:
        """The slot's server, restarted when it is gone; may raise SandboxUnavailable, OSError or
        RuntimeError (could not start)."""
        server = self.servers[slot]
        if server is not None and not server.alive():
            self.servers[slot] = None
            server.close()
            server = None
        if server is None:
            server = self.servers[slot] = _Server(slot, self.cfg, self.indices[slot])
            if not server.isolated:
                _warn_unisolated(server.reason)
        return server

    def drop(self, slot: int) -> None:
        server, self.servers[slot] = self.servers[slot], None
        if server is not None:
            server.close()

    def close(self) -> None:
        servers = [s for s in self.servers if s is not None]
        self.servers = [None] * len(self.indices)
        for server in servers:  # all at once: each server cleans up as soon as its stream closes
            server.begin_close()
        for server in servers:
            server.close()
        _release_indices(self.indices)
        self.indices = []


_pools_lock = threading.Lock()
_idle: list[_Pool] = []  # least recently used first
_busy: set[_Pool] = set()
_free_indices: set[int] = set(range(_MAX_SLOTS))
_forgotten: list[_Server] = []  # a forked child's copies of its parent's servers, kept from the collector
_exiting = False


def _release_indices(indices: list[int]) -> None:
    with _pools_lock:
        _free_indices.update(indices)


def _reserve_indices(n: int) -> list[int]:
    """`n` uid pairs for a new pool, closing idle pools (least recently used first) to free some."""
    while True:
        with _pools_lock:
            if len(_free_indices) >= n:
                indices = sorted(_free_indices)[:n]
                _free_indices.difference_update(indices)
                return indices
            victim = _idle.pop(0) if _idle else None
        if victim is None:
            raise RuntimeError(f"sandbox: more than {_MAX_SLOTS} worker slots in use at once in this process")
        victim.close()


def _acquire(cfg: SandboxConfig, slots: int) -> _Pool:
    key = (cfg, slots)
    with _pools_lock:
        for k in range(len(_idle) - 1, -1, -1):
            if _idle[k].key == key:
                pool = _idle.pop(k)
                _busy.add(pool)
                return pool
    pool = _Pool(key, cfg, _reserve_indices(slots))
    with _pools_lock:
        _busy.add(pool)
    return pool


def _release(pool: _Pool, keep: bool) -> None:
    """Give a pool back after a call: kept for the next call when `keep`, else closed."""
    evict: list[_Pool] = []
    with _pools_lock:
        _busy.discard(pool)
        if keep and not _exiting:
            _idle.append(pool)
            while len(_idle) > _MAX_KEPT:
                evict.append(_idle.pop(0))
        else:
            evict.append(pool)
    for victim in evict:
        victim.close()


def shutdown() -> None:
    """Close every server kept between calls (they are restarted on the next call). Runs at exit."""
    with _pools_lock:
        pools, _idle[:] = list(_idle), []
    for pool in pools:
        pool.close()


def _at_exit() -> None:
    global _exiting
    _exiting = True
    shutdown()


def _after_fork_in_child() -> None:
    """A forked child owns none of its parent's servers: it lets go of its copies of their pipes and
    starts with no pools, fresh locks and no spawner thread."""
    global _pools_lock, _idle, _busy, _free_indices, _spawner, _status_lock
    for pool in [*_idle, *_busy]:
        for server in pool.servers:
            if server is not None:
                server.forget()
                _forgotten.append(server)
    _pools_lock = threading.Lock()
    _status_lock = threading.Lock()
    _idle, _busy, _free_indices = [], set(), set(range(_MAX_SLOTS))
    _spawner = _Spawner()


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def as_job(item: Any, index: int = 0) -> Job:
    """A Job from a Job, a `(code, tests)` pair, or a dict with `code`, `tests` and optionally
    `entry_point` and `setup`. Raises TypeError naming the item."""
    if isinstance(item, Job):
        job = item
    elif isinstance(item, dict):
        unknown = set(item) - {"code", "tests", "entry_point", "setup"}
        if unknown or not {"code", "tests"} <= set(item):
            raise TypeError(f"run_batch: item {index}: a dict needs `code` and `tests` (and optionally `entry_point`, `setup`), got {sorted(item)}")
        job = Job(item["code"], item["tests"], item.get("entry_point"), item.get("setup"))
    elif isinstance(item, (tuple, list)) and len(item) == 2:
        job = Job(item[0], item[1])
    else:
        raise TypeError(f"run_batch: item {index} must be a (code, tests) pair, a dict or a Job")
    if not isinstance(job.code, str):
        raise TypeError(f"run_batch: item {index}: code must be a str, got {type(job.code).__name__}")
    if not isinstance(job.tests, (list, tuple)) or not all(isinstance(t, str) for t in job.tests):
        raise TypeError(f"run_batch: item {index}: tests must be a list of str")
    if job.entry_point is not None and not (isinstance(job.entry_point, str) and job.entry_point.isidentifier()):
        raise TypeError(f"run_batch: item {index}: entry_point must be a Python identifier, got {job.entry_point!r}")
    if job.setup is not None and not isinstance(job.setup, str):
        raise TypeError(f"run_batch: item {index}: setup must be a str")
    return Job(job.code, list(job.tests), job.entry_point or None, job.setup or None)


def run_batch(
    items: list[Any],
    *,
    workers: int | None = None,
    config: SandboxConfig | None = None,
    schedule: str = "dynamic",
    **overrides: object,
) -> list[SandboxResult]:
    """Judge each item in its own sandbox, `workers` at a time (default: one per CPU), on servers kept
    from an earlier call with the same config and worker count where there are some.

    An item is a `(code, tests)` pair, a `Job`, or a dict with `code`, `tests` and optionally
    `entry_point` and `setup`. `config` or keyword overrides of `SandboxConfig` fields (`timeout_s=2`,
    `allow_unisolated=True`) set the limits. `schedule="dynamic"` hands the next item to whichever slot
    is free; `"round_robin"` runs item i in slot i % workers, in order (to know what ran where). Returns
    one result per item, in order. A sandbox failure gives that item `status="infra"`, never an
    exception; `SandboxUnavailable` is raised when isolation is missing and not explicitly waived.
    """
    cfg = config or SandboxConfig()
    if overrides:
        cfg = SandboxConfig(**{**asdict(cfg), **overrides})  # type: ignore[arg-type]
    if schedule not in ("dynamic", "round_robin"):
        raise ValueError(f"run_batch: schedule must be 'dynamic' or 'round_robin', got {schedule!r}")
    jobs = [as_job(item, i) for i, item in enumerate(items)]
    if not jobs:
        return []
    slots = max(1, min(workers or os.cpu_count() or 1, _MAX_SLOTS))
    n_workers = min(slots, len(jobs))
    results: list[SandboxResult | None] = [None] * len(jobs)
    lock = threading.Lock()
    failures: list[BaseException] = []
    last_error = ["sandbox servers kept failing"]
    if schedule == "round_robin":
        queues = [list(range(slot, len(jobs), n_workers)) for slot in range(n_workers)]
    else:
        shared = list(range(len(jobs)))
        queues = [shared] * n_workers

    def take(slot: int) -> int | None:
        with lock:
            mine = queues[slot]
            if failures or not mine:
                return None
            return mine.pop(0)

    def worker(slot: int) -> None:
        troubles = 0  # failed starts and deaths of this slot's server; past 3 the slot gives up
        try:
            while (i := take(slot)) is not None:
                job = jobs[i]
                while results[i] is None:
                    try:
                        results[i] = pool.server(slot).run(job)
                    except SandboxUnavailable as exc:
                        with lock:
                            failures.append(exc)
                        return
                    except _ServerDied as exc:  # not retried: one solution never runs twice
                        results[i] = _infra(len(job.tests), str(exc))
                        pool.drop(slot)
                        troubles += 1
                    except (OSError, RuntimeError) as exc:  # the server did not start: retry
                        last_error[0] = f"could not start a sandbox server: {exc}"
                        troubles += 1
                    if troubles > 3:
                        if results[i] is None:
                            results[i] = _infra(len(job.tests), last_error[0])
                        if schedule == "round_robin":  # nobody else takes this slot's items
                            with lock:
                                rest, queues[slot] = queues[slot], []
                            for k in rest:
                                results[k] = _infra(len(jobs[k].tests), last_error[0])
                        return  # the other slots take the remaining items
        except BaseException:  # a bug here: the slot's server may be mid-job, so it is not kept
            pool.drop(slot)
            raise

    pool = _acquire(cfg, slots)
    keep = False
    try:
        threads = [threading.Thread(target=worker, args=(slot,), name=f"sandbox-{slot}", daemon=True) for slot in range(n_workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        keep = not failures
    finally:
        _release(pool, keep)
    if failures:
        raise failures[0]
    out: list[SandboxResult] = []
    for i, r in enumerate(results):
        if r is None:  # every slot gave up (or a worker thread crashed)
            r = _infra(len(jobs[i].tests), last_error[0])
        if r.status == "infra":
            log.warning("sandbox: item %d not scored: %s", i, r.error)
        out.append(r)
    return out


def _infra(total: int, reason: str) -> SandboxResult:
    return SandboxResult(passed=0, total=total, error=reason, status="infra", tests=[False] * total, test_errors=[None] * total)


def _warn_unisolated(reason: str) -> None:
    global _warned_unisolated
    if not _warned_unisolated:
        _warned_unisolated = True
        log.warning("sandbox: running model-written code WITHOUT full isolation (allowed by the caller): %s", reason)


def run_tests(
    code: str,
    tests: list[str],
    *,
    timeout_s: float = SandboxConfig.timeout_s,
    memory_mb: int = SandboxConfig.memory_mb,
    allow_unisolated: bool = False,
    config: SandboxConfig | None = None,
    entry_point: str | None = None,
    setup: str | None = None,
) -> SandboxResult:
    """Judge one solution against its test snippets (see `run_batch`)."""
    cfg = config or SandboxConfig(timeout_s=timeout_s, memory_mb=memory_mb, allow_unisolated=allow_unisolated)
    return run_batch([Job(code, tests, entry_point, setup)], workers=1, config=cfg)[0]


def isolation_status() -> tuple[bool, str]:
    """(available, reason): whether this host can run the isolated sandbox. Probed once per process."""
    global _status_cache
    with _status_lock:
        if _status_cache is None:
            indices = _reserve_indices(1)
            try:
                server = _Server(0, SandboxConfig(allow_unisolated=True), indices[0])
            except (OSError, RuntimeError) as exc:
                _status_cache = (False, str(exc))
            else:
                _status_cache = (server.isolated, server.reason or "namespaces, minimal root, uid drop and syscall filter work")
                server.close()
            finally:
                _release_indices(indices)
        return _status_cache
