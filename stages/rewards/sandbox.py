"""Run untrusted Python solutions against test snippets, isolated from the host.

Model-written code is hostile until proven otherwise. `run_batch` scores many solutions in parallel,
`run_tests` one; each returns a `SandboxResult(passed, total, error, ...)`.

How one solution runs (as root, which is how this project runs; see "Without root" below)::

    parent (any process, may be multi-threaded, e.g. a GRPO trainer)
      └─ server, one per worker slot: `python -I -S sandbox.py --serve`, stripped environment,
         single-threaded, dies with the parent (PDEATHSIG). It forks once per solution:
           └─ A (root, host namespaces): joins the slot's cgroup, unshare(mount, net, pid, ipc, uts),
              forks B, reports B's pid, waits for it.
                └─ B (root, pid 1 of a new pid namespace): mounts private, every mount read-only
                   (bind remounts: never a superblock remount, which would turn the host's disk
                   read-only), fresh size-limited tmpfs over /tmp, /var/tmp and /dev/shm, empty
                   tmpfs over /root and /home with the interpreter's prefix bound back read-only,
                   a new /proc; forks C and exits when C exits, which kills every process left in
                   the namespace.
                     └─ C: rlimits (CPU, address space, processes, file size, open files, no core),
                        drops to the slot's own unprivileged uid/gid (no supplementary groups,
                        no_new_privs), cwd WORKDIR (on the private tmpfs), minimal environment; runs the solution, then
                        each test snippet in the same namespace, and reports after each snippet.

Each sample therefore costs forks of an already started interpreter, not interpreter start-ups; the
network namespace has only a loopback interface, which is down. The wall-clock timeout kills B, and
with it the whole pid namespace (a process that `setsid`s or double-forks cannot escape it).

Result channel. Pass/fail is decided by the harness in C after each snippet actually ran to its end:
it writes `<nonce> pass <i>` (or `fail`) on a dedicated pipe, and `<nonce> done <n>` after the last
snippet, then leaves with `os._exit` (so `atexit` hooks never run). The nonce is a fresh 128-bit token
per solution that never appears in argv, the environment or a file. The server accepts exactly that
sequence and nothing else: anything printed is only captured output, the exit code is ignored, a
missing `done` (sys.exit, os._exit, a signal, the timeout) scores the whole sample 0, and a line that
is malformed, out of order or without the nonce (a blind forgery) scores it 0 as "tampered". Limit
that we accept: the harness shares an interpreter with the solution, so code that deliberately
walks the harness's stack frames could find the nonce; that is a deliberate exploit of the reward,
which the reward-hacking guard and trajectory reading exist to catch, not something done by accident.

Failure semantics: a solution that fails to load scores 0 (every test fails, `error` says why); a
test snippet that raises an `Exception` fails that test only; `SystemExit`, `KeyboardInterrupt` and
any other early end score the whole sample 0. A problem of the sandbox itself (a server that died,
a failed fork) gives `status="infra"` and a logged reason, never an exception for the whole batch.

Availability. Isolation needs root (CAP_SYS_ADMIN for namespaces and mounts, CAP_SETUID for the
uid drop). When a probe finds it unavailable, `run_batch` raises `SandboxUnavailable` naming the
reason, unless the caller passes `allow_unisolated=True`; then solutions run with rlimits, a
stripped environment, a temporary folder (removed afterwards), a process-group kill on timeout and,
as root, a uid drop, but with the network and the host's filesystem reachable. That is logged.

A memory cgroup (v1, or v2 where the controllers are already delegated) bounds a sample's total
memory and a pids cgroup its process count where the host has them: per-process address-space
limits alone do not bound a sample that forks. Without a memory cgroup, the worst case is
`nproc × memory_mb` per worker slot.

This module is stdlib only, never imports Prefect or the rest of `stages`, and is also the server's
script (`python -I -S stages/sandbox.py --serve CONFIG`).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import resource
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

log = logging.getLogger("regimen.sandbox")

__all__ = ["SandboxConfig", "SandboxResult", "SandboxUnavailable", "run_batch", "run_tests", "isolation_status"]


class SandboxUnavailable(RuntimeError):
    """Isolation is unavailable on this host and the caller did not allow unisolated execution."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one solution (all its tests together). Defaults suit MBPP/HumanEval-sized tasks."""

    timeout_s: float = 5.0
    """Wall-clock limit for the solution and all its tests; the pid namespace is killed after it.
    The CPU-time rlimit is this, rounded up, plus one second."""
    memory_mb: int = 512
    """Address-space limit per process, and the memory cgroup's limit for the whole sample."""
    nproc: int = 32
    """Processes (threads count) the sample's uid may have; one uid per worker slot."""
    file_size_mb: int = 16
    """Largest file a sample may write (RLIMIT_FSIZE)."""
    open_files: int = 64
    """RLIMIT_NOFILE, set after the result pipe is in place."""
    tmpfs_mb: int = 64
    """Size of the fresh tmpfs over /tmp (the working folder WORKDIR lives there); /var/tmp and
    /dev/shm get a quarter each."""
    output_limit: int = 16384
    """Bytes of stdout+stderr kept per sample; more is read and discarded (up to 8 MiB, after which
    the pipe is closed and further writes fail)."""
    allow_unisolated: bool = False
    """Run without namespaces where they are unavailable, instead of raising SandboxUnavailable."""
    isolation: bool = True
    """False skips the namespaces even where they work (trusted code, tests); it still needs
    `allow_unisolated=True`, else SandboxUnavailable is raised."""
    use_cgroups: bool = True
    """Use memory/pids cgroups for each worker slot where the host offers them."""
    uid_base: int | None = None
    """First unprivileged uid; slot k uses uid_base + k. Default: derived from the parent's pid so
    that two processes scoring at once do not share uids (RLIMIT_NPROC counts per uid)."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "nproc", "file_size_mb", "open_files", "tmpfs_mb", "output_limit"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxConfig.{name} must be positive, got {getattr(self, name)!r}")
        if self.open_files < 8:
            raise ValueError("SandboxConfig.open_files must be at least 8")


@dataclass
class SandboxResult:
    passed: int
    """Test snippets that ran to their end without raising (0 whenever the run ended abnormally)."""
    total: int
    error: str | None = None
    """None when every snippet ran; else why not (load failure, timeout, early exit, tampering, infra)."""
    status: str = "ok"
    """ok: the harness finished (tests may still have failed); aborted: the solution ended the run
    early, timed out, was killed or tampered with the result channel (scores 0); infra: the sandbox
    itself failed (not the solution's fault)."""
    tests: list[bool] = field(default_factory=list)
    """Per snippet: ran to its end without raising."""
    test_errors: list[str | None] = field(default_factory=list)
    """Per snippet: the exception it raised (`AssertionError`, `NameError: ...`), None when it passed
    or did not run."""
    output: str = ""
    """Captured stdout+stderr, at most `output_limit` bytes (decoded with replacement)."""
    duration_s: float = 0.0
    isolated: bool = True

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


# ------------------------------------------------------------------------------------------------
# Parent side
# ------------------------------------------------------------------------------------------------

# The solution's working folder, inside the sandbox's own mount namespace: a directory on the fresh
# tmpfs the sandbox mounts over its /tmp (never the host's /tmp).
WORKDIR = os.path.join(os.sep, "tmp", "work")
_SERVER_START_TIMEOUT_S = 30.0
_BACKSTOP_S = 15.0  # extra seconds the parent waits for a server before declaring it dead
_warned_unisolated = False
_status_lock = threading.Lock()
_status_cache: tuple[bool, str] | None = None


def _default_uid_base() -> int:
    return 1_000_000 + (os.getpid() % 100_000) * 256


def _interpreter() -> str:
    return sys.executable or "/usr/bin/python3"


class _Server:
    """One worker slot: a long-lived server process that forks a sandbox per solution."""

    def __init__(self, slot: int, cfg: SandboxConfig):
        self.slot = slot
        self.cfg = cfg
        base = cfg.uid_base if cfg.uid_base is not None else _default_uid_base()
        settings = asdict(cfg)
        settings.update(uid=base + slot, gid=base + slot, parent_pid=os.getpid(), slot=slot)
        self.proc = subprocess.Popen(
            [_interpreter(), "-I", "-S", os.path.abspath(__file__), "--serve", json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={},
            start_new_session=True,
            close_fds=True,
        )
        self._buf = b""
        hello = self._read(time.monotonic() + _SERVER_START_TIMEOUT_S)
        if hello is None:
            self.close()
            raise RuntimeError("sandbox: the sandbox server did not start (see stderr for its traceback)")
        self.isolated = bool(hello.get("isolated"))
        self.reason = str(hello.get("reason") or "")
        self.cgroups = list(hello.get("cgroups") or [])
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
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            return None

    def run(self, code: str, tests: list[str]) -> SandboxResult:
        job = {"code": code, "tests": tests, "nonce": secrets.token_hex(16)}
        try:
            self.proc.stdin.write(json.dumps(job).encode() + b"\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except OSError as exc:
            raise _ServerDied(f"sandbox server unreachable: {exc}") from None
        reply = self._read(time.monotonic() + self.cfg.timeout_s + _BACKSTOP_S)
        if reply is None:
            raise _ServerDied(f"sandbox server (slot {self.slot}) died or hung; exit code {self.proc.poll()}")
        return SandboxResult(**reply)

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
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


class _ServerDied(Exception):
    pass


def _unavailable_message(reason: str) -> str:
    return (
        f"sandbox: cannot isolate untrusted code on this host ({reason}). Refusing to run model-written "
        "code without network and filesystem isolation. To run it anyway, at your own risk, allow "
        "unisolated execution explicitly (allow_unisolated=True; in a recipe, the unit_tests reward's "
        "`allow_unisolated: true` option)."
    )


def _check_items(items: list[tuple[str, list[str]]]) -> None:
    for i, item in enumerate(items):
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(f"run_batch: item {i} must be a (code, tests) pair")
        code, tests = item
        if not isinstance(code, str):
            raise TypeError(f"run_batch: item {i}: code must be a str, got {type(code).__name__}")
        if not isinstance(tests, (list, tuple)) or not all(isinstance(t, str) for t in tests):
            raise TypeError(f"run_batch: item {i}: tests must be a list of str")


def run_batch(
    items: list[tuple[str, list[str]]],
    *,
    workers: int | None = None,
    config: SandboxConfig | None = None,
    **overrides: object,
) -> list[SandboxResult]:
    """Run each `(code, tests)` item in its own sandbox, `workers` at a time (default: one per CPU).

    `config` or keyword overrides of `SandboxConfig` fields (`timeout_s=2`, `allow_unisolated=True`)
    set the limits. Returns one result per item, in order. A sandbox failure gives that item
    `status="infra"`, never an exception; `SandboxUnavailable` is raised when isolation is missing
    and not explicitly waived.
    """
    cfg = config or SandboxConfig()
    if overrides:
        cfg = SandboxConfig(**{**asdict(cfg), **overrides})  # type: ignore[arg-type]
    _check_items(items)
    if not items:
        return []
    n_workers = max(1, min(workers or os.cpu_count() or 1, len(items), 256))
    results: list[SandboxResult | None] = [None] * len(items)
    next_index = [0]
    lock = threading.Lock()
    failures: list[BaseException] = []

    def take() -> int | None:
        with lock:
            if failures or next_index[0] >= len(items):
                return None
            i = next_index[0]
            next_index[0] += 1
            return i

    last_error = ["sandbox servers kept failing"]

    def worker(slot: int) -> None:
        server: _Server | None = None
        troubles = 0  # failed starts and deaths of this slot's server; past 3 the slot gives up
        try:
            while (i := take()) is not None:
                code, tests = items[i]
                while results[i] is None:
                    try:
                        if server is None:
                            server = _Server(slot, cfg)
                            if not server.isolated:
                                _warn_unisolated(server.reason)
                        results[i] = server.run(code, list(tests))
                    except SandboxUnavailable as exc:
                        with lock:
                            failures.append(exc)
                        return
                    except _ServerDied as exc:  # not retried: one solution never runs twice
                        results[i] = _infra(len(tests), str(exc))
                        server.close()  # type: ignore[union-attr]
                        server = None
                        troubles += 1
                    except (OSError, RuntimeError) as exc:  # the server did not start: retry
                        last_error[0] = f"could not start a sandbox server: {exc}"
                        troubles += 1
                    if troubles > 3:
                        if results[i] is None:
                            results[i] = _infra(len(tests), last_error[0])
                        return  # the other slots take the remaining items
        finally:
            if server is not None:
                server.close()

    threads = [threading.Thread(target=worker, args=(slot,), name=f"sandbox-{slot}", daemon=True) for slot in range(n_workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    out: list[SandboxResult] = []
    for i, r in enumerate(results):
        if r is None:  # every slot gave up (or a worker thread crashed)
            r = _infra(len(items[i][1]), last_error[0])
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
        log.warning("sandbox: running model-written code WITHOUT isolation (allowed by the caller): %s", reason)


def run_tests(
    code: str,
    tests: list[str],
    *,
    timeout_s: float = SandboxConfig.timeout_s,
    memory_mb: int = SandboxConfig.memory_mb,
    allow_unisolated: bool = False,
    config: SandboxConfig | None = None,
) -> SandboxResult:
    """Run one solution against its test snippets (see `run_batch`)."""
    cfg = config or SandboxConfig(timeout_s=timeout_s, memory_mb=memory_mb, allow_unisolated=allow_unisolated)
    return run_batch([(code, tests)], workers=1, config=cfg)[0]


def isolation_status() -> tuple[bool, str]:
    """(available, reason): whether this host can run the isolated sandbox. Probed once per process."""
    global _status_cache
    with _status_lock:
        if _status_cache is None:
            try:
                server = _Server(0, SandboxConfig(allow_unisolated=True))
            except (OSError, RuntimeError) as exc:
                _status_cache = (False, str(exc))
            else:
                _status_cache = (server.isolated, server.reason or "namespaces, uid drop and mounts work")
                server.close()
        return _status_cache


# ------------------------------------------------------------------------------------------------
# Server side (runs as `python -I -S sandbox.py --serve CONFIG`; single-threaded; forks per job)
# ------------------------------------------------------------------------------------------------

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

_OUTPUT_HARD_LIMIT = 8 << 20
_RESULT_LIMIT = 1 << 16
_EXIT_INFRA = 121  # A, B or C failed to set the sandbox up
_EXIT_ABORT = 122  # the harness itself was broken by the solution

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        _libc.unshare.argtypes = [ctypes.c_int]
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        _libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return _libc


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg: int) -> None:
    _check(_c().prctl(option, arg, 0, 0, 0), f"prctl({option})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    # Guard: a remount without MS_BIND changes the filesystem (superblock) for every namespace, i.e.
    # it would turn the host's disk read-only. Only per-mount (bind) remounts are ever done here.
    if flags & MS_REMOUNT and not flags & MS_BIND:
        raise AssertionError("refusing a non-bind remount")
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_c().mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _bind_remount_ro(target: str, extra: int = 0) -> None:
    try:
        keep = os.statvfs(target).f_flag & (MS_NODEV | MS_NOEXEC)  # ST_NODEV/ST_NOEXEC share the bits
    except OSError:
        keep = 0
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | keep | extra)


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            raw = line.split(b" ")[4]
            points.append(raw.decode("unicode_escape" if b"\\" in raw else "utf-8", "replace"))
    return points


def _first_closed_ancestor(path: str) -> str | None:
    """The highest ancestor of `path` (or `path` itself) that a user with no rights cannot traverse."""
    parts = os.path.realpath(path).split("/")
    for k in range(2, len(parts) + 1):
        p = "/".join(parts[:k]) or "/"
        try:
            if not os.stat(p).st_mode & 0o001:
                return p
        except OSError:
            return p
    return None


def _world_traversable(path: str) -> bool:
    """Whether a user with no special rights can reach `path` (every ancestor has o+x)."""
    return _first_closed_ancestor(path) is None


def _cover_dir(path: str) -> str:
    """The highest ancestor of `path` that a user with no rights cannot traverse."""
    return _first_closed_ancestor(path) or path


def _write(fd: int, data: bytes) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]


class _Slot:
    """Server state: limits from the parent, cgroups, the interpreter's paths to expose."""

    def __init__(self, settings: dict):
        self.s = settings
        self.uid = int(settings["uid"])
        self.gid = int(settings["gid"])
        self.cgroups: list[str] = []
        self.memory_bytes = int(settings["memory_mb"]) << 20
        prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
        self.hide = [p for p in ("/root", "/home") if os.path.isdir(p) and not os.path.islink(p)]
        covers = set(self.hide)
        self.binds: list[str] = []
        for p in sorted(prefixes):
            under_hidden = any(p == h or p.startswith(h + "/") for h in self.hide)
            if under_hidden or not _world_traversable(p):
                self.binds.append(p)
                if not under_hidden:
                    covers.add(_cover_dir(p))
        # cover only the outermost of nested candidates
        self.covers = sorted(c for c in covers if not any(c != o and c.startswith(o + "/") for o in covers))

    # cgroups ---------------------------------------------------------------------------------
    def setup_cgroups(self) -> None:
        if not self.s.get("use_cgroups", True) or os.geteuid() != 0:
            return
        try:
            own = {}
            with open("/proc/self/cgroup") as f:
                for line in f:
                    hid, ctrls, path = line.rstrip("\n").split(":", 2)
                    for c in ctrls.split(","):
                        own[c] = path
            mounts = {}
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    pre, _, post = line.partition(" - ")
                    fstype, _src, opts = (post.split(" ") + ["", "", ""])[:3]
                    point = pre.split(" ")[4]
                    if fstype == "cgroup":
                        for c in ("memory", "pids"):
                            if c in opts.strip().split(","):
                                mounts.setdefault(c, point)
                    elif fstype == "cgroup2":
                        mounts.setdefault("unified", point)
        except OSError:
            return
        name = f"regimen-sandbox-{os.getpid()}"
        limits = {
            "memory": [("memory.limit_in_bytes", self.memory_bytes), ("memory.memsw.limit_in_bytes", self.memory_bytes)],
            "pids": [("pids.max", int(self.s["nproc"]) + 8)],
        }
        for ctrl, files in limits.items():
            if ctrl in mounts and ctrl in own:
                self._make_cgroup(os.path.join(mounts[ctrl] + own[ctrl], name), files)
        if "unified" in mounts and "" in own and ("memory" not in mounts or "pids" not in mounts):
            parent = mounts["unified"] + own[""]
            try:
                with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                    enabled = f.read().split()
            except OSError:
                enabled = []
            files = []
            if "memory" in enabled and "memory" not in mounts:
                files += [("memory.max", self.memory_bytes), ("memory.swap.max", 0)]
            if "pids" in enabled and "pids" not in mounts:
                files += [("pids.max", int(self.s["nproc"]) + 8)]
            if files:
                self._make_cgroup(os.path.join(parent, name), files)

    def _make_cgroup(self, path: str, files: list[tuple[str, int]]) -> None:
        parent = os.path.dirname(path)
        try:  # empty cgroups left by servers that were killed (SIGKILL skips their clean-up)
            for entry in os.listdir(parent):
                pid = entry[len("regimen-sandbox-") :]
                if entry.startswith("regimen-sandbox-") and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                    try:
                        os.rmdir(os.path.join(parent, entry))
                    except OSError:
                        pass
        except OSError:
            pass
        try:
            os.mkdir(path)
        except OSError:
            return
        self.cgroups.append(path)
        for fname, value in files:
            try:
                with open(os.path.join(path, fname), "w") as f:
                    f.write(str(value))
            except OSError:
                pass

    def join_cgroups(self) -> None:
        for path in self.cgroups:
            try:
                with open(os.path.join(path, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
            except OSError:
                pass

    def kill_cgroups(self) -> None:
        for _ in range(50):
            pids = set()
            for path in self.cgroups:
                try:
                    with open(os.path.join(path, "cgroup.procs")) as f:
                        pids.update(int(x) for x in f.read().split())
                except OSError:
                    pass
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            _reap_all(0.1)

    def remove_cgroups(self) -> None:
        self.kill_cgroups()
        for path in self.cgroups:
            for _ in range(20):
                try:
                    os.rmdir(path)
                    break
                except OSError:
                    time.sleep(0.01)

    # the sandbox itself ----------------------------------------------------------------------
    def setup_mounts(self) -> None:
        """Runs in B: pid 1 of fresh mount/pid namespaces, as root."""
        _mount(None, "/", None, MS_REC | MS_PRIVATE)  # first: nothing below may propagate to the host
        bind_fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in self.binds}
        points = _mount_points()
        _bind_remount_ro("/")  # must succeed; the rest is best effort
        for p in points:
            if p != "/" and p != "/proc" and not p.startswith("/proc/"):
                try:
                    _bind_remount_ro(p)
                except OSError:
                    pass
        for c in self.covers:
            _mount("tmpfs", c, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        for p, fd in bind_fds.items():
            os.makedirs(p, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
            _bind_remount_ro(p)
            os.close(fd)
        for c in self.covers:
            _bind_remount_ro(c)
        tmp_mb = int(self.s["tmpfs_mb"])
        for path, size in (("/tmp", tmp_mb), ("/var/tmp", max(1, tmp_mb // 4)), ("/dev/shm", max(1, tmp_mb // 4))):
            if os.path.isdir(path) and not os.path.islink(path):
                _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size}m,mode=1777")
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
        except OSError:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        try:
            _c().sethostname(b"sandbox", 7)
        except Exception:
            pass
        os.makedirs(WORKDIR, mode=0o700)
        os.chown(WORKDIR, self.uid, self.gid)

    def drop_privileges(self) -> None:
        s = self.s
        cpu = int(float(s["timeout_s"])) + 2
        limits = [
            (resource.RLIMIT_CPU, cpu),
            (resource.RLIMIT_AS, self.memory_bytes),
            (resource.RLIMIT_FSIZE, int(s["file_size_mb"]) << 20),
            (resource.RLIMIT_NOFILE, int(s["open_files"])),
            (resource.RLIMIT_CORE, 0),
        ]
        root = os.geteuid() == 0
        if root:  # as another user, RLIMIT_NPROC would count (and starve) that user's own processes
            limits.append((resource.RLIMIT_NPROC, int(s["nproc"])))
        for which, value in limits:
            resource.setrlimit(which, (value, value))
        if root:
            os.setgroups([])
            os.setresgid(self.gid, self.gid, self.gid)
            os.setresuid(self.uid, self.uid, self.uid)
            if os.getuid() == 0 or os.geteuid() == 0:
                raise OSError("privilege drop failed")
        _prctl(PR_SET_NO_NEW_PRIVS, 1)


def _reap_all(timeout: float) -> bool:
    """Reap exited children until none are left (True) or `timeout` passes (False)."""
    end = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            if time.monotonic() >= end:
                return False
            time.sleep(0.002)


def _place_fds(mapping: dict[int, int]) -> None:
    """Make fd `k` a copy of `v` for each item, then close every other descriptor."""
    import fcntl

    high = {k: fcntl.fcntl(v, fcntl.F_DUPFD, 256) for k, v in mapping.items()}
    for k, v in high.items():
        os.dup2(v, k)
    os.closerange(max(mapping) + 1, 1 << 20)


def _harness(code: str, tests: list[str], nonce: str) -> None:
    """Runs in C, after the privilege drop. Reports on fd 3; never returns."""
    import builtins
    import io

    write, _exit, compile_, exec_ = os.write, os._exit, compile, exec

    def emit(kind: str, i: int, info: str = "") -> None:
        info = " ".join(info.split())[:300]
        line = f"{nonce} {kind} {i} {info}\n".encode("utf-8", "replace")
        while line:
            line = line[write(3, line) :]

    def describe(exc: BaseException) -> str:
        name = type(exc).__name__  # always an exact str
        try:
            text = str.__str__(str(exc))  # an exact str even if __str__ returned a subclass
        except BaseException:
            text = ""
        return name + ": " + text if text else name

    out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True)
    sys.stdout = sys.__stdout__ = out
    sys.stderr = sys.__stderr__ = out
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.argv = ["solution"]
    namespace = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec_(compile_(code, "<solution>", "exec"), namespace)
    except Exception as exc:  # the solution does not load: every test fails
        emit("loadfail", -1, describe(exc))
        emit("done", len(tests))
        _exit(0)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt: an early exit scores 0
        emit("abort", -1, describe(exc))
        _exit(0)
    for i, snippet in enumerate(tests):
        try:
            exec_(compile_(snippet, f"<test {i}>", "exec"), namespace)
        except Exception as exc:
            emit("fail", i, describe(exc))
        except BaseException as exc:
            emit("abort", i, describe(exc))
            _exit(0)
        else:
            emit("pass", i)
    emit("done", len(tests))
    _exit(0)


def _run_child(fn, nonce: str, *args) -> None:
    """Body of a forked child that sets the sandbox up: never returns. A set-up failure is reported
    on the result pipe (fd 3) as `infra`, which the server turns into a logged, unscored sample."""
    code = _EXIT_INFRA
    try:
        fn(*args)
        code = 0
    except BaseException as exc:
        try:
            os.write(3, f"{nonce} infra -1 {type(exc).__name__}: {exc}\n".encode("utf-8", "replace"))
        except OSError:
            pass
    finally:
        os._exit(code)


def _job_isolated(slot: _Slot, job: dict) -> None:
    """Body of A: host namespaces, root. fds: 0 /dev/null, 1-2 output pipe, 3 result pipe, 4 pid pipe."""
    os.setsid()
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    slot.join_cgroups()
    _check(_c().unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    b = os.fork()
    if b == 0:
        os.close(4)
        _run_child(_job_init, job["nonce"], slot, job)
    _write(4, f"{b}\n".encode())
    for fd in (0, 1, 2, 3, 4):
        os.close(fd)
    _, status = os.waitpid(b, 0)
    os._exit(_exit_code(status))


def _exit_code(status: int) -> int:
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _job_init(slot: _Slot, job: dict) -> None:
    """Body of B: pid 1 of the new namespaces, root. Exits when C does, which kills the namespace."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    slot.setup_mounts()
    c = os.fork()
    if c == 0:
        _job_solution(slot, job, WORKDIR)
    for fd in (0, 1, 2, 3):
        os.close(fd)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(_EXIT_INFRA)
        if pid == c:
            os._exit(_exit_code(status))


def _job_solution(slot: _Slot, job: dict, workdir: str) -> None:
    """Body of C: drop privileges, then run the harness. Never returns. Only a failure before the
    harness starts counts as the sandbox's fault; from then on everything is the solution's."""
    try:
        if os.getsid(0) != os.getpid():
            os.setsid()
        slot.drop_privileges()
        os.chdir(workdir)
        os.environ.clear()
        os.environ.update(PATH="/usr/local/bin:/usr/bin:/bin", HOME=workdir, TMPDIR=workdir, LANG="C.UTF-8")
    except BaseException as exc:
        try:
            os.write(3, f"{job['nonce']} infra -1 {type(exc).__name__}: {exc}\n".encode("utf-8", "replace"))
        finally:
            os._exit(_EXIT_INFRA)
    try:
        _harness(job["code"], job["tests"], job["nonce"])
    finally:
        os._exit(_EXIT_ABORT)


def _job_unisolated(slot: _Slot, job: dict, workdir: str) -> None:
    """Body of the only child when namespaces are unavailable and the caller allowed it."""
    os.setsid()
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    slot.join_cgroups()
    os.close(4)
    _job_solution(slot, job, workdir)


def _describe_status(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code == _EXIT_INFRA:
        return "sandbox set-up failed"
    if code > 128:
        sig = code - 128
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = {"SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)", "SIGKILL": " (killed: memory limit or timeout)", "SIGSEGV": " (crashed)"}
        return f"killed by {name}{hint.get(name, '')}"
    return f"exit status {code}"


def _run_job(slot: _Slot, job: dict, isolated: bool) -> dict:
    """Run one solution (server side) and turn what came back into a result dict."""
    n = len(job["tests"])
    started = time.monotonic()
    deadline = started + float(slot.s["timeout_s"])
    res_r, res_w = os.pipe()
    out_r, out_w = os.pipe()
    pid_r, pid_w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDWR)
    workdir = None
    if not isolated:
        import tempfile

        workdir = tempfile.mkdtemp(prefix="regimen-sandbox-")
        if os.geteuid() == 0:
            os.chown(workdir, slot.uid, slot.gid)
    sys.stdout.flush()
    a = os.fork()
    if a == 0:  # never returns into the server loop
        try:
            _place_fds({0: devnull, 1: out_w, 2: out_w, 3: res_w, 4: pid_w})
        except BaseException:
            os._exit(_EXIT_INFRA)
        if isolated:
            _run_child(_job_isolated, job["nonce"], slot, job)
        _run_child(_job_unisolated, job["nonce"], slot, job, workdir)
    for fd in (res_w, out_w, pid_w, devnull):
        os.close(fd)
    try:
        pidfd: int | None = os.pidfd_open(a)
    except (AttributeError, OSError):
        pidfd = None
    pipes = {res_r: bytearray(), out_r: bytearray(), pid_r: bytearray()}
    open_pipes = set(pipes)
    for fd in pipes:
        os.set_blocking(fd, False)
    out_total = 0
    timed_out = tampered = False
    a_status: int | None = None
    output_limit = int(slot.s["output_limit"])

    def drain(fd: int) -> None:
        """Read what is there; close the pipe at end of file or past its bound."""
        nonlocal out_total, tampered
        while fd in open_pipes:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if fd == out_r and chunk:
                pipes[fd] += chunk[: max(0, output_limit - len(pipes[fd]))]
                out_total += len(chunk)
                if out_total <= _OUTPUT_HARD_LIMIT:
                    continue  # past the hard limit the pipe is closed: further writes fail
            elif chunk:
                pipes[fd] += chunk
                if fd != res_r or len(pipes[fd]) <= _RESULT_LIMIT:
                    continue
                tampered = True
            open_pipes.discard(fd)
            os.close(fd)

    def kill_sandbox() -> None:
        drain(pid_r)
        b_pid = bytes(pipes[pid_r]).split(b"\n")[0]
        targets = ([int(b_pid)] if b_pid.isdigit() else []) + [a]  # B first: its death empties the namespace
        for pid in targets:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not isolated:
            try:
                os.killpg(a, signal.SIGKILL)
            except OSError:
                pass

    while a_status is None:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            kill_sandbox()
            break
        watch = list(open_pipes) + ([pidfd] if pidfd is not None else [])
        ready, _, _ = select.select(watch, [], [], left if pidfd is not None else min(left, 0.01))
        for fd in ready:
            if fd != pidfd:
                drain(fd)
        if pidfd is None or pidfd in ready:
            pid, status = os.waitpid(a, os.WNOHANG)
            if pid:
                a_status = status
    if a_status is None:
        a_status = os.waitpid(a, 0)[1]
    if not isolated:  # whatever the solution left behind in its process group or cgroup
        try:
            os.killpg(a, signal.SIGKILL)
        except OSError:
            pass
        slot.kill_cgroups()
    if not _reap_all(2.0):
        kill_sandbox()
        _reap_all(5.0)
    for fd in list(open_pipes):
        drain(fd)
        if fd in open_pipes:
            open_pipes.discard(fd)
            os.close(fd)
    if pidfd is not None:
        os.close(pidfd)
    if workdir is not None:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return _verdict(job, n, pipes[res_r], pipes[out_r], out_total, _exit_code(a_status), timed_out, tampered, isolated, slot, started)


def _verdict(job, n, res, out, out_total, exit_code, timed_out, tampered, isolated, slot, started) -> dict:
    """Accept exactly: [loadfail -1] | pass/fail 0..n-1 in order, then done n; all with the nonce."""
    verdicts: list[bool] = []
    errors: list[str | None] = []
    loadfail = abort = infra = None
    done = False
    lines = bytes(res).split(b"\n")
    if lines[-1]:  # a partial last line
        tampered = True
    for raw in lines[:-1]:
        parts = raw.decode("utf-8", "replace").split(" ", 3)
        if len(parts) < 3 or parts[0] != job["nonce"] or done:
            tampered = True
            break
        kind, idx, info = parts[1], parts[2], parts[3] if len(parts) > 3 else ""
        if kind == "infra" and not verdicts and loadfail is None:
            infra = info or "sandbox set-up failed"
        elif kind == "loadfail" and idx == "-1" and not verdicts and loadfail is None:
            loadfail = info
        elif kind in ("pass", "fail") and loadfail is None and idx == str(len(verdicts)) and len(verdicts) < n:
            verdicts.append(kind == "pass")
            errors.append(None if kind == "pass" else info or "failed")
        elif kind == "abort":
            abort = f"the solution ended the run early ({info or 'exit'})"
            break
        elif kind == "done" and idx == str(n) and (len(verdicts) == n or loadfail is not None):
            done = True
        else:
            tampered = True
            break
    output = bytes(out).decode("utf-8", "replace")
    if out_total > len(out):
        output += f"\n[... {out_total - len(out)} more bytes of output discarded]"
    result = {"total": n, "output": output, "duration_s": round(time.monotonic() - started, 4), "isolated": isolated}
    failed = {"passed": 0, "tests": [False] * n, "test_errors": [None] * n}
    if infra is not None and not tampered:
        return {**result, **failed, "status": "infra", "error": f"sandbox set-up failed: {infra}"}
    if tampered:
        error = "the result channel was tampered with (forged or malformed verdicts)"
    elif timed_out:
        error = f"timed out after {slot.s['timeout_s']} s"
    elif abort:
        error = abort
    elif not done:
        error = f"the run ended before the harness finished ({_describe_status(exit_code)})"
    elif loadfail is not None:
        return {**result, **failed, "status": "ok", "error": f"the solution failed to load: {loadfail}"}
    else:
        return {**result, "passed": sum(verdicts), "tests": verdicts, "test_errors": errors, "status": "ok", "error": None}
    return {**result, **failed, "status": "aborted", "error": error}


def _probe(slot: _Slot) -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "not running as root: namespaces, mounts and the uid drop need it"
    if not hasattr(os, "pidfd_open") and not sys.platform.startswith("linux"):
        return False, "not Linux"
    r = _run_job(slot, {"code": "", "tests": ["import os\nassert os.getuid() != 0"], "nonce": secrets.token_hex(16)}, True)
    if r["status"] == "ok" and r["passed"] == 1:
        return True, ""
    return False, r["error"] or "the isolation probe failed"


def _serve(settings: dict) -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(settings["parent_pid"]):
        return
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError:
        pass
    slot = _Slot(settings)
    slot.setup_cgroups()
    out = sys.stdout.buffer
    try:
        if settings.get("isolation", True):
            isolated, reason = _probe(slot)
        else:
            isolated, reason = False, "isolation is switched off (SandboxConfig.isolation=False)"
        ready = isolated or bool(settings.get("allow_unisolated"))
        out.write(json.dumps({"ready": ready, "isolated": isolated, "reason": reason, "cgroups": slot.cgroups}).encode() + b"\n")
        out.flush()
        if not ready:
            return
        for line in sys.stdin.buffer:
            job = json.loads(line)
            try:
                result = _run_job(slot, job, isolated)
            except Exception as exc:  # never let one job take the server (and the batch) down
                n = len(job.get("tests", []))
                result = {"passed": 0, "total": n, "tests": [False] * n, "status": "infra", "error": f"sandbox server error: {type(exc).__name__}: {exc}", "isolated": isolated}
            out.write(json.dumps(result).encode() + b"\n")
            out.flush()
    finally:
        slot.remove_cgroups()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--serve":
    _serve(json.loads(sys.argv[2]))
