"""The process tree of one sample, forked from the slot's zygote: Z, B (which becomes J, the judge) and S
(the solution).

    server (root, single-threaded; reads jobs on stdin, writes results on stdout; holds the tests)
      └─ Z, the zygote: forked at start-up, before the server read any job, so its memory never held a
         test, a solution or anything of an earlier sample. It joins the slot's cgroups, a UTS
         namespace of its own and builds the slot's read-only root template once. Per job it receives
         file descriptors only (memfds with the code and with the tests, the output and result pipes, a
         control socket), and forks B as pid 1 of a new pid namespace (unshare(CLONE_NEWPID) before the
         fork, setns back after it); it hands B's pidfd to the server, and reports how B ended
         (`judge-exit`) once it has reaped it.
           └─ B (root, pid 1 of the new pid namespace): unshares mount, network and IPC namespaces,
              makes the sample's root filesystem (the template, a fresh /tmp, /dev/shm and /proc),
              pivot_root's into it, forks S (connected by a socketpair), waits until S's set-up is
              done, then reads the tests and becomes J. When J ends, every process of the namespace is
              killed.
                └─ S, the solution (its own uid): reads the code from its memfd, keeps only the socket
                   and the output pipe, rlimits, oom_score_adj 1000, drops to the slot's solution uid,
                   no_new_privs, seccomp filter; then `callee.serve`.
              ( B as J, the judge (another uid, not dumpable, oom_score_adj -1000): keeps the socket,
                the output pipe and the result pipe, same confinement; then `judge.run`, which reports
                pass/fail on the result pipe. )

A job with no solution at all (a row's no-solution baseline, `alone`: see `sample._alone`) has no S: B
writes the greeting an empty solution sends (`("ready", [])`) into the socket, closes S's end and
becomes J, so the tests run against nothing, as against an empty solution, without its process.

S is forked before B reads the tests, and never holds the result pipe or anything of J's; only J and
the trusted set-up side (Z, B) write results, so nothing S does can forge a verdict or an `infra`.
(Earlier versions had a process A between Z and B only to enter the new pid namespace; Z does that
itself now, which saves a fork per sample.)

Also the file-descriptor helpers the server side shares (`sample.py`). Stdlib only: the server script
imports it by path (`python -I -S`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time

try:
    from . import callee, judge
    from .slot import (
        CLONE_NEWIPC,
        CLONE_NEWNET,
        CLONE_NEWNS,
        CLONE_NEWPID,
        CLONE_NEWUTS,
        PACKAGES_DIR,
        PR_SET_CHILD_SUBREAPER,
        PR_SET_PDEATHSIG,
        Slot,
        _c,
        _check,
        _prctl,
    )
except ImportError:  # imported by the server script as a top-level module
    import callee  # type: ignore[no-redef]
    import judge  # type: ignore[no-redef]
    from slot import (  # type: ignore[no-redef]
        CLONE_NEWIPC,
        CLONE_NEWNET,
        CLONE_NEWNS,
        CLONE_NEWPID,
        CLONE_NEWUTS,
        PACKAGES_DIR,
        PR_SET_CHILD_SUBREAPER,
        PR_SET_PDEATHSIG,
        Slot,
        _c,
        _check,
        _prctl,
    )

_EXIT_INFRA = 121
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _line(fd: int, text: str) -> None:
    """One result line (infra reports from the trusted side); short enough to be written atomically."""
    try:
        _write_all(fd, (" ".join(text.split())[:400] + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def _read_fd(fd: int) -> bytes:
    chunks = []
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _memfd(data: bytes) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("regimen-sandbox", 0)
    else:  # pragma: no cover - not Linux
        import tempfile

        fd = os.dup(tempfile.TemporaryFile().fileno())
    _write_all(fd, data)
    return fd


def _place_fds(mapping: dict[int, int]) -> None:
    """Make fd `k` a copy of `v` for each item (k = 0..n-1), then close every other descriptor."""
    import fcntl

    high = {k: fcntl.fcntl(v, fcntl.F_DUPFD, 256) for k, v in mapping.items()}
    for k, v in high.items():
        os.dup2(v, k, inheritable=True)
    os.closerange(max(mapping) + 1, 1 << 20)


def _exit_code(status: int) -> int:
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _zygote(slot: Slot, zsock: socket.socket) -> None:
    """Z: never returns. Its memory holds no job: it only ever receives file descriptors. Per job it
    forks B, in a new pid namespace when isolated (B is its pid 1), hands B's pidfd to the server, and
    when B has ended reports how on the job's result pipe (`judge-exit`). It is the subreaper of
    everything below it, and when the server goes (its stream closes, or the server dies: SIGTERM by
    PDEATHSIG) it kills and reaps what is left, so no zombie is handed to init."""
    children: dict[int, tuple[int, int | None]] = {}  # B's pid -> (its result pipe, its pidfd)

    def leave(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        slot.kill_cgroups(spare=os.getpid())
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    time.sleep(0.005)
            except ChildProcessError:
                break
        os._exit(0)

    signal.signal(signal.SIGTERM, leave)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the server died before the line above
        leave()
    own_pidns = _isolate_zygote(slot)
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans (daemons when unisolated) stay below Z
    except OSError:
        pass
    import gc

    gc.freeze()  # what Z holds is never collected in a sample's process: no copy-on-write faults for it
    woken, wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # any child's end wakes Z (set_wakeup_fd), so no zombie lingers
    signal.set_wakeup_fd(wake)
    while True:
        _reap(children)
        ready, _, _ = select.select([zsock.fileno(), woken], [], [], 1.0)
        if woken in ready:
            try:
                while os.read(woken, 256):
                    pass
            except BlockingIOError:
                pass
        if zsock.fileno() not in ready:
            continue
        try:
            msg, fds, _flags, _addr = socket.recv_fds(zsock, 16, 8)
        except OSError:
            leave()
        if not msg or len(fds) != 5:
            leave()
        _start_job(slot, zsock, msg in (b"i", b"I"), fds, own_pidns, children, alone=msg in (b"I", b"U"))


def _isolate_zygote(slot: Slot) -> int | None:
    """One UTS namespace per slot (hostname "sandbox"; nobody inside may change it) and the slot's
    read-only root template; returns Z's own pid namespace (kept to return to after each sample's new
    one). The network namespace is per sample, like mounts, pids and IPC: a unix socket can outlive
    every process of its sample (passed in flight inside a cycle of sockets until the kernel collects
    it), so a network namespace shared by a slot's samples could carry a bit from one to the next."""
    if not (slot.s.get("isolation", True) and slot.root):
        return None
    try:
        _check(_c().unshare(CLONE_NEWUTS), "unshare")
        _c().sethostname(b"sandbox", 7)
    except OSError:
        pass
    try:
        slot.build_template()
    except OSError:  # each sample then builds its whole root itself
        slot.template = None
    return os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)


def _start_job(
    slot: Slot,
    zsock: socket.socket,
    isolated: bool,
    fds: list[int],
    own_pidns: int | None,
    children: dict,
    alone: bool = False,
) -> None:
    code_fd, job_fd, out_w, res_w, ctl = fds
    try:
        if isolated:  # the next child is pid 1 of a new pid namespace; Z itself stays where it is
            _check(_c().unshare(CLONE_NEWPID), "unshare")
        pid = os.fork()
    except OSError as exc:
        _line(res_w, f"infra could not start the sample: {exc}")
        pid = -1
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        zsock.close()
        os.close(ctl)
        _job_b(slot, isolated, code_fd, job_fd, out_w, res_w, alone)
    if isolated and own_pidns is not None:
        _check(_c().setns(own_pidns, CLONE_NEWPID), "setns")  # back to Z's own, for the next unshare
    pidfd = None
    if pid > 0:
        pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
        try:
            with socket.socket(fileno=os.dup(ctl)) as sock:
                socket.send_fds(sock, [f"{pid} {pid}".encode()], [pidfd] if pidfd is not None else [])
        except OSError:
            pass
        children[pid] = (os.dup(res_w), pidfd)
    for fd in fds:
        os.close(fd)


def _reap(children: dict) -> None:
    """Report how each ended B ended (`judge-exit`: its namespace is empty by then); reap strays."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in children:
            res_w, pidfd = children.pop(pid)
            _line(res_w, f"judge-exit {_exit_code(status)}")
            os.close(res_w)
            if pidfd is not None:
                os.close(pidfd)


def _job_b(slot: Slot, isolated: bool, code_fd: int, job_fd: int, out_w: int, res_w: int, alone: bool = False) -> None:
    """B: never returns. Unshares the rest of its namespaces (mount, IPC, network: its pid namespace is
    new already, B is its pid 1), builds the root, forks S (unless `alone`: no solution), then becomes J
    (pid 1: when J ends, every process of the namespace is killed)."""
    try:
        os.setsid()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if isolated:  # the UTS namespace is the slot's, made once by Z
            _check(_c().unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET), "unshare")
            slot.build_root()
        s_sock, j_sock = (end.detach() for end in socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
        if alone:  # no solution (a row's baseline): no process for it; its greeting is that it defines nothing
            callee.wire.send(s_sock, ("ready", []))
            os.close(s_sock)
            os.close(code_fd)
            _role_j(slot, job_fd, j_sock, out_w, res_w)
        st_r, st_w = os.pipe()
        s = os.fork()  # before anything of the job's tests is read into this process
        if s == 0:
            _role_s(slot, code_fd, s_sock, out_w, st_w)
        os.close(st_w)
        os.close(code_fd)
        os.close(s_sock)
        status = b""
        while chunk := os.read(st_r, 4096):
            status += chunk
        os.close(st_r)
        if status != b"k":
            _line(res_w, "infra the solution's process could not be set up: " + status[1:].decode("utf-8", "replace"))
            os._exit(_EXIT_INFRA)
    except BaseException as exc:
        _line(res_w, f"infra {type(exc).__name__}: {exc}")
        os._exit(_EXIT_INFRA)
    _role_j(slot, job_fd, j_sock, out_w, res_w)


def _packages(slot: Slot, solution: bool) -> None:
    """The installed packages bound into the sample's root (`SandboxConfig.packages`, pytest for the
    tests) become importable; with packages allowed, numerical libraries use one thread in S (a thread
    pool per core would not fit its address-space limit), as `OPENBLAS_NUM_THREADS=1` asks."""
    if not slot.plan.get("packages") or not os.path.isdir(PACKAGES_DIR):
        return
    sys.path.append(PACKAGES_DIR)
    if solution and slot.s.get("packages"):
        os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def _role_s(slot: Slot, code_fd: int, sock: int, out_w: int, st_w: int) -> None:
    """S: never returns. Trusted set-up, then the untrusted code (callee.serve)."""
    try:
        spec = json.loads(_read_fd(code_fd))
        devnull = os.open(os.devnull, os.O_RDWR)
        _place_fds({0: devnull, 1: out_w, 2: out_w, 3: sock, 4: st_w})
        st_w = 4
        slot.confine("s")
        os.chdir(spec["workdir"])
        os.environ.clear()
        os.environ.update(_ENV, HOME=spec["workdir"], TMPDIR=spec["workdir"])
        _packages(slot, solution=True)
    except BaseException as exc:
        try:
            os.write(st_w, b"!" + f"{type(exc).__name__}: {exc}".encode("utf-8", "replace"))
        finally:
            os._exit(_EXIT_INFRA)
    os.write(st_w, b"k")
    os.close(st_w)
    code, mode = spec["code"], spec.get("mode") or "functions"
    del spec
    callee.serve(3, code, mode)
    os._exit(0)


def _role_j(slot: Slot, job_fd: int, sock: int, out_w: int, res_w: int) -> None:
    """J: never returns."""
    try:
        job = json.loads(_read_fd(job_fd))
        devnull = os.open(os.devnull, os.O_RDWR)
        _place_fds({0: devnull, 1: out_w, 2: out_w, 3: res_w, 4: sock})
        res_w = 3
        slot.confine("j")
        os.chdir(job["workdir"])
        os.environ.clear()
        os.environ.update(_ENV, HOME=job["workdir"], TMPDIR=job["workdir"])
        _packages(slot, solution=False)
    except BaseException as exc:
        _line(res_w, f"infra the judge's process could not be set up: {type(exc).__name__}: {exc}")
        os._exit(_EXIT_INFRA)
    judge.run(job, 4, 3)
    os._exit(0)
