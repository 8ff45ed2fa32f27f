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

The job types are in `jobs.py`, one server process's handle in `worker.py`. Stdlib only, apart from
the optional `pyseccomp` (libseccomp) that `syscalls.py` uses to build the syscall filter; without it
isolation counts as unavailable.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from dataclasses import asdict
from typing import Any

from . import worker
from .jobs import Job, SandboxConfig, SandboxResult, SandboxUnavailable, _infra, as_job
from .worker import _Server, _ServerDied

log = logging.getLogger("regimen.sandbox")

_MAX_SLOTS = 128  # two uids per slot, 256 uids per parent process, shared by all its pools
_MAX_KEPT = 4  # idle pools kept warm between calls
_warned_unisolated = False
_status_lock = threading.Lock()
_status_cache: tuple[bool, str] | None = None


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
    global _pools_lock, _idle, _busy, _free_indices, _status_lock
    for pool in [*_idle, *_busy]:
        for server in pool.servers:
            if server is not None:
                server.forget()
                _forgotten.append(server)
    _pools_lock = threading.Lock()
    _status_lock = threading.Lock()
    _idle, _busy, _free_indices = [], set(), set(range(_MAX_SLOTS))
    worker.after_fork_in_child()


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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
    batch = _Batch(jobs, min(slots, len(jobs)), schedule)
    pool = _acquire(cfg, slots)
    keep = False
    try:
        batch.run(pool)
        keep = not batch.failures
    finally:
        _release(pool, keep)
    if batch.failures:
        raise batch.failures[0]
    return batch.results_in_order()


class _Batch:
    """The items of one `run_batch` call and the worker threads that take them, one per slot."""

    def __init__(self, jobs: list[Job], n_workers: int, schedule: str):
        self.jobs, self.n_workers, self.schedule = jobs, n_workers, schedule
        self.results: list[SandboxResult | None] = [None] * len(jobs)
        self.lock = threading.Lock()
        self.failures: list[BaseException] = []
        self.last_error = "sandbox servers kept failing"
        if schedule == "round_robin":
            self.queues = [list(range(slot, len(jobs), n_workers)) for slot in range(n_workers)]
        else:
            shared = list(range(len(jobs)))
            self.queues = [shared] * n_workers

    def run(self, pool: _Pool) -> None:
        threads = [
            threading.Thread(target=self.worker, args=(pool, slot), name=f"sandbox-{slot}", daemon=True)
            for slot in range(self.n_workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def take(self, slot: int) -> int | None:
        with self.lock:
            mine = self.queues[slot]
            if self.failures or not mine:
                return None
            return mine.pop(0)

    def worker(self, pool: _Pool, slot: int) -> None:
        """Run this slot's items; a slot whose server fails to start or dies more than 3 times gives up
        and leaves the remaining items to the other slots (round-robin: marks its own as infra)."""
        troubles = 0
        try:
            while (i := self.take(slot)) is not None:
                while self.results[i] is None:
                    outcome = self._attempt(pool, slot, i)
                    if outcome == "unavailable":
                        return
                    troubles += outcome == "trouble"
                    if troubles > 3:
                        self._give_up(slot, i)
                        return
        except BaseException:  # a bug here: the slot's server may be mid-job, so it is not kept
            pool.drop(slot)
            raise

    def _attempt(self, pool: _Pool, slot: int, i: int) -> str:
        job = self.jobs[i]
        try:
            self.results[i] = pool.server(slot).run(job)
            return "ok"
        except SandboxUnavailable as exc:
            with self.lock:
                self.failures.append(exc)
            return "unavailable"
        except _ServerDied as exc:  # not retried: one solution never runs twice
            self.results[i] = _infra(len(job.tests), str(exc))
            pool.drop(slot)
            return "trouble"
        except (OSError, RuntimeError) as exc:  # the server did not start: retry
            self.last_error = f"could not start a sandbox server: {exc}"
            return "trouble"

    def _give_up(self, slot: int, i: int) -> None:
        if self.results[i] is None:
            self.results[i] = _infra(len(self.jobs[i].tests), self.last_error)
        if self.schedule == "round_robin":  # nobody else takes this slot's items
            with self.lock:
                rest, self.queues[slot] = self.queues[slot], []
            for k in rest:
                self.results[k] = _infra(len(self.jobs[k].tests), self.last_error)

    def results_in_order(self) -> list[SandboxResult]:
        out: list[SandboxResult] = []
        for i, r in enumerate(self.results):
            if r is None:  # every slot gave up (or a worker thread crashed)
                r = _infra(len(self.jobs[i].tests), self.last_error)
            if r.status == "infra":
                log.warning("sandbox: item %d not scored: %s", i, r.error)
            out.append(r)
        return out


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
                _status_cache = (
                    server.isolated,
                    server.reason or "namespaces, minimal root, uid drop and syscall filter work",
                )
                server.close()
            finally:
                _release_indices(indices)
        return _status_cache
