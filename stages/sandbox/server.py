"""The sandbox server: one per worker slot, `python -I -S server.py --serve SETTINGS`, stdlib only.

Process tree of one sample (isolated mode, as root)::

    server (root, single-threaded; reads jobs on stdin, writes results on stdout; holds the tests)
      └─ Z, the zygote: forked at start-up, before the server read any job, so its memory never held a
         test, a solution or anything of an earlier sample. It joins the slot's cgroups and a UTS
         namespace of its own once. Per job it receives file descriptors only (memfds with the code
         and with the tests, the output and result pipes, a control socket) and forks:
           └─ A (root): unshare(mount, pid, network, IPC); forks B; hands B's pidfd to the server;
              waits for B and reports how it ended (`judge-exit`).
                └─ B (root, pid 1 of the new pid namespace): builds the sample's root filesystem from
                   an allow-list (below), pivot_root's into it, forks S (connected by a socketpair),
                   waits until S's set-up is done, then reads the tests and becomes J. When J ends,
                   every process of the namespace is killed.
                     └─ S, the solution (its own uid): reads the code from its memfd, keeps only the
                        socket and the output pipe, rlimits, oom_score_adj 1000, drops to the slot's
                        solution uid, no_new_privs, seccomp filter; then `callee.serve`.
                ( B as J, the judge (another uid, not dumpable, oom_score_adj -1000): keeps the socket,
                  the output pipe and the result pipe, same confinement; then `judge.run`, which
                  reports pass/fail on the result pipe. )

S is forked before B reads the tests, and never holds the result pipe or anything of J's; only J and
the trusted set-up side (A, B) write results, so nothing S does can forge a verdict or an `infra`.

The sample's filesystem (`slot.py`, like the cgroups and the confinement): a fresh tmpfs root holding only, read-only, the interpreter's standard
library (its site-packages masked by an empty tmpfs) and the multiarch shared-library folders its
extension modules load from (with the /lib, /lib64 symlinks recreated) plus /etc/ld.so.cache; a minimal
/dev (null, zero, full, random, urandom, a fresh /dev/shm); a new /proc (`hidepid=invisible,subset=pid`
where the kernel has it); a fresh size-limited tmpfs as the sandbox's own temp folder, holding S's
work folder and J's (`slot.WORKDIR_S`, `slot.WORKDIR_J`; paths inside the new root, never the host's). The old root is detached after pivot_root, so the host's files, its pathname unix
sockets, the project and its data are simply not there. Abstract unix sockets and the network are
per sample (a new network namespace has only a loopback interface, which is down); so is SysV IPC.

Limits. Per slot: cgroups (v1, or v2 where delegated) with one CPU's worth of CPU time per period
(`cpus_per_slot`), a memory limit (the solution's `memory_mb` plus 256 MiB for the judge; within it
the kernel's OOM killer takes the solution's processes first and never the judge) and a pids limit;
Z joins them once, every process of every sample inherits them (a cgroup migration per sample would
cost milliseconds: it waits for an RCU grace period). The time limit
counts CPU: the server polls the slot's CPU usage (cpuacct.usage, or cpu.stat) and kills the sample
once it has used `timeout_s` seconds; a wall-clock backstop (`wall_timeout_s`) covers sleepers. Without
a CPU cgroup, RLIMIT_CPU per process is the fallback. rlimits (address space, file size, open files,
processes, no core) apply to S and J. The seccomp filter is built by the parent with libseccomp
(`syscalls.py`) and installed here by prctl (no libseccomp needed in here).

Why hand-written rather than bubblewrap or nsjail per sample: a warm server forks an interpreter that
is already started (and has the common standard-library modules imported): about 12 ms of CPU per
HumanEval sample for both processes together. Exec'ing `bwrap` and a fresh `python -I -S` per sample
took 23 ms for the solution's process alone, with nothing imported (bench/README.md, "Sandbox
throughput"). What is hand-written is the namespace and mount set-up (about 30 system calls, no
parsing of untrusted input, all before any untrusted code runs); the syscall filter comes from
libseccomp.

Without namespaces (not root, not Linux, no seccomp) the server refuses unless the caller allowed
unisolated execution; then S and J are still separate processes talking plain data, with rlimits, a
temporary folder each, the uid drop and cgroups where root, and the filter where libseccomp exists.
"""

from __future__ import annotations

import json
import os
import platform
import select
import signal
import socket
import sys
import time

if __name__ == "__main__":  # run as a script with -I -S: import the siblings by path
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, _HERE)
    import callee  # type: ignore[no-redef]
    import judge  # type: ignore[no-redef]
    from slot import (  # type: ignore[no-redef]
        _PIVOT_ROOT, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUTS, PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG,
        WORKDIR_J, WORKDIR_S, Slot, _c, _check, _oom_score_adj, _prctl,
    )

    sys.path.remove(_HERE)
else:
    from . import callee, judge
    from .slot import (
        _PIVOT_ROOT, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUTS, PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG,
        WORKDIR_J, WORKDIR_S, Slot, _c, _check, _oom_score_adj, _prctl,
    )

_RESULT_LIMIT = 1 << 20
_EXIT_INFRA = 121
_PRELOAD = ("math", "cmath", "re", "collections", "itertools", "functools", "typing", "string", "heapq", "bisect", "operator",
            "random", "statistics", "fractions", "decimal", "json", "copy", "dataclasses", "hashlib", "datetime", "textwrap", "enum")
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
        hint = {"SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)", "SIGKILL": " (memory limit, or killed)", "SIGSEGV": " (crashed)", "SIGSYS": " (forbidden system call)"}
        return f"killed by {name}{hint.get(name, '')}"
    return f"exit status {code}"


# ------------------------------------------------------------------------------------------------
# The per-sample processes: Z (zygote), A, B, S, J
# ------------------------------------------------------------------------------------------------


def _zygote(slot: Slot, zsock: socket.socket) -> None:
    """Z: never returns. Its memory holds no job: it only ever receives file descriptors. It is the
    subreaper of everything below it, and when the server goes (its stream closes, or the server dies:
    SIGTERM by PDEATHSIG) it kills and reaps what is left, so no zombie is handed to init."""
    children: set[int] = set()

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
    if slot.s.get("isolation", True) and slot.root:
        # One UTS namespace per slot (hostname "sandbox"; nobody inside may change it). The network
        # namespace is per sample, like mounts, pids and IPC: a unix socket can outlive every process
        # of its sample (passed in flight inside a cycle of sockets until the kernel collects it), so
        # a network namespace shared by a slot's samples could carry a bit from one to the next.
        try:
            _check(_c().unshare(CLONE_NEWUTS), "unshare")
            _c().sethostname(b"sandbox", 7)
        except OSError:
            pass
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans (B when A dies, daemons when unisolated) stay below Z
    except OSError:
        pass
    while True:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
        try:
            msg, fds, _flags, _addr = socket.recv_fds(zsock, 16, 8)
        except OSError:
            leave()
        if not msg or len(fds) != 5:
            leave()
        try:
            pid = os.fork()
        except OSError as exc:
            _line(fds[3], f"infra could not fork: {exc}")
            pid = -1
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            zsock.close()
            _job_a(slot, msg == b"i", *fds)
        if pid > 0:
            children.add(pid)
        for fd in fds:
            os.close(fd)


def _job_a(slot: Slot, isolated: bool, code_fd: int, job_fd: int, out_w: int, res_w: int, ctl: int) -> None:
    """A: never returns. Unshares, forks B, hands B's pidfd to the server, reports how B (J) ended."""
    try:
        os.setsid()
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if isolated:  # the UTS namespace is the slot's, made once by Z (see _zygote)
            _check(_c().unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET), "unshare")
        b = os.fork()
        if b == 0:
            os.close(ctl)
            _job_b(slot, isolated, code_fd, job_fd, out_w, res_w)
        for fd in (code_fd, job_fd, out_w):
            os.close(fd)
        pidfd = os.pidfd_open(b) if hasattr(os, "pidfd_open") else None
        with socket.socket(fileno=ctl) as sock:
            socket.send_fds(sock, [f"{b} {os.getpid()}".encode()], [pidfd] if pidfd is not None else [])
        if pidfd is not None:
            os.close(pidfd)
        _, status = os.waitpid(b, 0)
        _line(res_w, f"judge-exit {_exit_code(status)}")  # B has been reaped: its namespace is empty
        os._exit(0)
    except BaseException as exc:
        _line(res_w, f"infra {type(exc).__name__}: {exc}")
        os._exit(_EXIT_INFRA)


def _job_b(slot: Slot, isolated: bool, code_fd: int, job_fd: int, out_w: int, res_w: int) -> None:
    """B: never returns. Builds the root, forks S, then becomes J (pid 1: when J ends, every process
    of the namespace is killed)."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if isolated:
            slot.build_root()
        s_sock, j_sock = (end.detach() for end in socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
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
    except BaseException as exc:
        try:
            os.write(st_w, b"!" + f"{type(exc).__name__}: {exc}".encode("utf-8", "replace"))
        finally:
            os._exit(_EXIT_INFRA)
    os.write(st_w, b"k")
    os.close(st_w)
    code = spec["code"]
    del spec
    callee.serve(3, code)
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
    except BaseException as exc:
        _line(res_w, f"infra the judge's process could not be set up: {type(exc).__name__}: {exc}")
        os._exit(_EXIT_INFRA)
    judge.run(job, 4, 3)
    os._exit(0)


# ------------------------------------------------------------------------------------------------
# The server: one job at a time
# ------------------------------------------------------------------------------------------------


class Server:
    def __init__(self, settings: dict):
        self.slot = Slot(settings)
        self.s = settings
        self.timeout_s = float(settings["timeout_s"])
        self.wall_s = float(settings["wall_timeout_s"])
        self.output_limit = int(settings["output_limit"])
        self.zsock: socket.socket | None = None
        self.zpid: int | None = None
        self.broken = False
        self._null: int | None = None

    def _discard(self) -> int | None:
        """A descriptor of /dev/null to splice unwanted output into (None where splice is missing);
        opened after the zygote was forked, so no sample inherits it."""
        if self._null is None and hasattr(os, "splice"):
            try:
                self._null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            except OSError:
                pass
        return self._null

    def start(self) -> None:
        self.slot.setup_cgroups()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):  # the job stream and the result stream are the server's alone
                    os.dup2(devnull, fd)
                os.close(devnull)
                self.slot.join_cgroups()
                _oom_score_adj(-1000)  # the trusted side (Z, A, B, J) is never the OOM killer's choice
                _zygote(self.slot, theirs)
            finally:
                os._exit(0)
        theirs.close()
        self.zsock, self.zpid = ours, pid

    def stop(self) -> None:
        if self._null is not None:
            os.close(self._null)
            self._null = None
        if self.zsock is not None:
            self.zsock.close()  # Z kills and reaps what is left below it, then exits
        if self.zpid is not None:
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None:
                    try:
                        os.kill(self.zpid, sig)
                    except OSError:
                        pass
                end = time.monotonic() + 3.0
                while time.monotonic() < end:
                    try:
                        if os.waitpid(self.zpid, os.WNOHANG)[0]:
                            break
                    except ChildProcessError:
                        break
                    time.sleep(0.005)
                else:
                    continue
                break
        self.slot.remove_cgroups()

    def run_job(self, job: dict, isolated: bool) -> dict:
        n = len(job["tests"])
        started = time.monotonic()
        workdirs = (WORKDIR_S, WORKDIR_J)
        if not isolated:
            import tempfile

            workdirs = (tempfile.mkdtemp(prefix="regimen-sandbox-s-"), tempfile.mkdtemp(prefix="regimen-sandbox-j-"))
            if self.slot.root:
                for role, path in zip("sj", workdirs):
                    os.chown(path, self.slot.uids[role], self.slot.uids[role])
        code_fd = _memfd(json.dumps({"code": job["code"], "workdir": workdirs[0]}).encode())
        job_fd = _memfd(json.dumps({"tests": job["tests"], "setup": job.get("setup"), "entry_point": job.get("entry_point"), "workdir": workdirs[1]}).encode())
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        ctl, ctl_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self.zsock, [b"i" if isolated else b"u"], [code_fd, job_fd, out_w, res_w, ctl_child.fileno()])  # type: ignore[arg-type]
            sent = True
        except OSError as exc:
            sent = False
            _line(res_w, f"infra the slot's zygote is gone: {exc}")
            self.broken = True
        finally:
            for fd in (code_fd, job_fd, out_w, res_w):
                os.close(fd)
            ctl_child.close()
        del job["code"]

        bufs = {res_r: bytearray(), out_r: bytearray()}
        open_fds = {res_r, out_r}
        for fd in bufs:
            os.set_blocking(fd, False)
        out_total = 0
        result_overflow = False
        b_pidfd: int | None = None
        pids: tuple[int, int] | None = None
        timed_out: str | None = None
        kill_sent = False
        cpu0 = self.slot.cpu_usage()
        cpu_used = 0.0
        wall_deadline = started + self.wall_s
        give_up = None  # after a kill: how long to wait for the result pipe to close
        finished = False

        def drain(fd: int) -> None:
            nonlocal out_total, result_overflow
            while fd in open_fds:
                if fd == out_r and len(bufs[fd]) >= self.output_limit and self._discard():
                    # Past the limit, output is thrown away by the kernel (splice to /dev/null, no
                    # copy), so a solution that prints a lot keeps working and a flood costs the
                    # server next to nothing; the flood's own CPU counts against the sample.
                    try:
                        n = os.splice(fd, self._discard(), 1 << 20, flags=os.SPLICE_F_NONBLOCK)  # type: ignore[attr-defined]
                    except BlockingIOError:
                        return
                    except OSError:
                        n = 0
                    if n:
                        out_total += n
                        continue
                    chunk = b""
                else:
                    try:
                        chunk = os.read(fd, 65536)
                    except BlockingIOError:
                        return
                    except OSError:
                        chunk = b""
                if chunk and fd == out_r:
                    bufs[fd] += chunk[: max(0, self.output_limit - len(bufs[fd]))]
                    out_total += len(chunk)
                    continue
                elif chunk:
                    bufs[fd] += chunk
                    if len(bufs[fd]) <= _RESULT_LIMIT:
                        continue
                    result_overflow = True
                open_fds.discard(fd)
                os.close(fd)

        def kill() -> None:
            nonlocal kill_sent
            if b_pidfd is not None:
                try:
                    signal.pidfd_send_signal(b_pidfd, signal.SIGKILL)
                except OSError:
                    pass
                kill_sent = True
            elif pids is not None:
                try:
                    os.kill(pids[0], signal.SIGKILL)
                except OSError:
                    pass
                kill_sent = True
            if not isolated:
                if pids is not None:
                    try:
                        os.killpg(pids[1], signal.SIGKILL)
                    except OSError:
                        pass
                self.slot.kill_cgroups(spare=self.zpid)

        while sent and res_r in open_fds:
            now = time.monotonic()
            if timed_out is None:
                if now >= wall_deadline:
                    timed_out = f"timed out after {self.wall_s:g} s of wall-clock time"
                elif cpu0 is not None:
                    used = self.slot.cpu_usage()
                    if used is not None:
                        cpu_used = used - cpu0
                        if cpu_used >= self.timeout_s:
                            timed_out = f"timed out after {self.timeout_s:g} s of CPU time"
                if timed_out is not None:
                    give_up = now + 5.0
                    kill()
            elif not kill_sent:
                kill()
            if give_up is not None and now >= give_up:
                break
            limit = (give_up if give_up is not None else wall_deadline) - now
            watch = list(open_fds) + ([ctl.fileno()] if pids is None else [])
            ready, _, _ = select.select(watch, [], [], max(0.0, min(limit, 0.05 if cpu0 is not None else limit)))
            for fd in ready:
                if fd == ctl.fileno():
                    try:
                        msg, fds, _, _ = socket.recv_fds(ctl, 64, 1)
                        b, a = (int(x) for x in msg.split())
                        pids = (b, a)
                        b_pidfd = fds[0] if fds else None
                    except (OSError, ValueError):
                        pids = (0, 0)
                else:
                    drain(fd)
                    if fd == res_r and b"judge-exit " in bufs[res_r]:
                        finished = True
            if finished:
                break
        # A reported J's end (or the result pipe closed): B, which became J, has been reaped, and its
        # exit emptied the pid namespace. Unisolated, kill whatever is left in the slot's cgroups.
        if b_pidfd is not None:
            ready, _, _ = select.select([b_pidfd], [], [], 2.0)
            if not ready:
                kill()
                select.select([b_pidfd], [], [], 5.0)
            os.close(b_pidfd)
        if not isolated:
            if pids is not None and pids[1] > 0:
                try:
                    os.killpg(pids[1], signal.SIGKILL)
                except OSError:
                    pass
            self.slot.kill_cgroups(spare=self.zpid)
        end = time.monotonic() + 0.2
        while out_r in open_fds and time.monotonic() < end:
            if select.select([out_r], [], [], max(0.0, end - time.monotonic()))[0]:
                drain(out_r)
        for fd in list(open_fds):
            drain(fd)
            if fd in open_fds:
                open_fds.discard(fd)
                os.close(fd)
        ctl.close()
        if not isolated:
            import shutil

            for path in workdirs:
                shutil.rmtree(path, ignore_errors=True)
        if cpu0 is not None:
            used = self.slot.cpu_usage()
            if used is not None:
                cpu_used = used - cpu0
        output = bytes(bufs[out_r]).decode("utf-8", "replace")
        if out_total > len(bufs[out_r]):
            output += f"\n[... {out_total - len(bufs[out_r])} more bytes of output discarded]"
        result = verdict(bytes(bufs[res_r]), n, timed_out=timed_out, overflow=result_overflow)
        result.update(output=output, duration_s=round(time.monotonic() - started, 4), isolated=isolated,
                      cpu_s=round(cpu_used, 4) if cpu0 is not None else None)
        return result


def verdict(res: bytes, n: int, timed_out: str | None = None, overflow: bool = False) -> dict:
    """Turn the result pipe's lines (written by J, and by A/B for infra) into a result dict.

    J writes: `loaded` | `loadfail <why>`; `pass <i>` / `fail <i> <why>` for i = 0..n-1 in order (none
    after a loadfail); `gone <why>` at most once; `done <n>`. A, B or J write `infra <why>` when the
    sandbox (or the row's trusted set-up code) failed; B writes `judge-exit <code>` when J ended."""
    tests: list[bool] = []
    errors: list[str | None] = []
    infra = loadfail = gone = None
    loaded: bool | None = None
    judge_exit: int | None = None
    done = False
    malformed = overflow
    lines = res.split(b"\n")
    if lines[-1]:
        malformed = True
    for raw in lines[:-1]:
        kind, _, rest = raw.decode("utf-8", "replace").partition(" ")
        if kind == "infra":
            infra = infra or rest or "sandbox set-up failed"
        elif kind == "judge-exit" and rest.isdigit():
            judge_exit = int(rest)
        elif kind == "loaded" and loaded is None:
            loaded = True
        elif kind == "loadfail" and loaded is None:
            loaded, loadfail = False, rest or "unknown error"
        elif kind in ("pass", "fail") and loaded and not done:
            idx, _, info = rest.partition(" ")
            if idx != str(len(tests)) or len(tests) >= n:
                malformed = True
                continue
            tests.append(kind == "pass")
            errors.append(None if kind == "pass" else info or "failed")
        elif kind == "gone" and loaded and gone is None:
            gone = rest
        elif kind == "done" and rest == str(n) and loaded is not None and (len(tests) == n or loaded is False) and not done:
            done = True
        else:
            malformed = True
    failed = {"passed": 0, "total": n, "tests": [False] * n, "test_errors": [None] * n}
    if infra is not None:
        return {**failed, "status": "infra", "error": f"sandbox set-up failed: {infra}"}
    if timed_out:
        return {**failed, "status": "aborted", "error": timed_out}
    if malformed:  # only the trusted side writes here, so this is a bug, not the solution's doing
        return {**failed, "status": "infra", "error": "the judge's report was malformed"}
    if not done:
        return {**failed, "status": "aborted", "error": f"the judge did not finish ({_describe_status(judge_exit)})"}
    if loaded is False:
        return {**failed, "status": "ok", "error": f"the solution failed to load: {loadfail}"}
    error = f"the solution's process ended early: {gone}" if gone else None
    return {"passed": sum(tests), "total": n, "tests": tests, "test_errors": errors, "status": "ok", "error": error}


def _probe(server: Server) -> tuple[bool, str]:
    s = server.s
    if not sys.platform.startswith("linux"):
        return False, "not Linux"
    if not server.slot.root:
        return False, "not running as root: namespaces, mounts and the uid drop need it"
    if platform.machine() not in _PIVOT_ROOT:
        return False, f"no pivot_root syscall number known for {platform.machine()}"
    if not server.slot.seccomp:
        return False, f"no syscall filter: {s.get('seccomp_error') or 'libseccomp unavailable'}"
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import os\nuid = os.getuid()\nsees_host = os.path.exists({here!r})\ndef f(x):\n    return [x, {{'k': (1.5, None, b'b', frozenset({{1}}))}}]\n"
    tests = [
        "import os\nassert uid != 0 and os.getuid() != 0 and uid != os.getuid()",
        f"import os\nassert not sees_host and not os.path.exists({here!r})",
        "assert f(2) == [2, {'k': (1.5, None, b'b', frozenset({1}))}]",
    ]
    r = server.run_job({"code": code, "tests": tests}, True)
    if r["status"] == "ok" and r["passed"] == len(tests):
        return True, ""
    return False, f"the isolation probe failed: {r['error'] or r['test_errors']} {r['output'][-300:]}".strip()


def serve(settings: dict) -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(settings["parent_pid"]):
        return
    for name in _PRELOAD:  # imported once here, shared by every fork of S and J
        try:
            __import__(name)
        except ImportError:
            pass
    server = Server(settings)
    server.start()
    out = sys.stdout.buffer
    try:
        if settings.get("isolation", True):
            isolated, reason = _probe(server)
        else:
            isolated, reason = False, "isolation is switched off (SandboxConfig.isolation=False)"
        ready = isolated or bool(settings.get("allow_unisolated"))
        hello = {"ready": ready, "isolated": isolated, "reason": reason, "cgroups": server.slot.cgroup_dirs,
                 "cpu_accounting": server.slot.cpu_file is not None, "seccomp": server.slot.seccomp is not None}
        out.write(json.dumps(hello).encode() + b"\n")
        out.flush()
        if not ready:
            return
        for line in sys.stdin.buffer:
            job = json.loads(line)
            n = len(job.get("tests", []))
            try:
                result = server.run_job(job, isolated)
            except Exception as exc:  # never let one job take the server (and the batch) down
                result = {"passed": 0, "total": n, "tests": [False] * n, "test_errors": [None] * n, "status": "infra",
                          "error": f"sandbox server error: {type(exc).__name__}: {exc}", "isolated": isolated}
            del job, line
            out.write(json.dumps(result).encode() + b"\n")
            out.flush()
            if server.broken:
                return
    finally:
        server.stop()


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--serve":
    serve(json.loads(sys.argv[2]))
