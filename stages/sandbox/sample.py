"""One sample on the server's side: hand the job to the slot's zygote, watch it, end it, read its verdict.

`Sample(server, job, isolated).run()` sends the zygote file descriptors only (memfds with the code and
with the tests, the output and result pipes, a control socket over which Z hands back B's pidfd), then
watches: the result pipe (J's lines, Z's `judge-exit`), the output pipe (kept up to `output_limit`
bytes, the rest spliced to /dev/null so a flood costs next to nothing), the slot's CPU usage (a sample
that has used `timeout_s` CPU seconds is killed) and a wall-clock backstop. Killing B (through its
pidfd, so a recycled pid is never signalled) kills its whole pid namespace; unisolated, the slot's
cgroups are emptied instead. `verdict` turns the result pipe's lines into the result.

Stdlib only: the server script imports it by path (`python -I -S`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import time

try:
    from .slot import WORKDIR_J, WORKDIR_S
    from .tree import _EXIT_INFRA, _line, _memfd
except ImportError:  # imported by the server script as a top-level module
    from slot import WORKDIR_J, WORKDIR_S  # type: ignore[no-redef]
    from tree import _EXIT_INFRA, _line, _memfd  # type: ignore[no-redef]

_RESULT_LIMIT = 1 << 20
_POLL_S = 0.05  # how often the CPU usage is read while a sample runs


def _alone(job: dict) -> bool:
    """Whether a job is judged without a solution's process (tree.py, `alone`): no code at all (a row's
    no-solution baseline) in the functions mode, and tests that never evaluate a string (which an empty
    solution's process would evaluate). Such a process would define nothing and be asked nothing, so the
    judge gets its greeting ("ready", no names) and the verdicts are those of an empty solution; it saves
    the process, its set-up and its start (about 8 of a sample's 18 ms of CPU)."""
    texts = [t for t in [*(job.get("tests") or []), job.get("setup") or ""] if isinstance(t, str)]
    return (
        job.get("code") == ""
        and (job.get("mode") or "functions") == "functions"
        and not any("eval" in t or "exec" in t for t in texts)
    )


class Sample:
    """One job through the zygote (see the module docstring)."""

    def __init__(self, server, job: dict, isolated: bool):
        self.server, self.slot, self.job, self.isolated = server, server.slot, job, isolated
        self.n = len(job["cases"] or []) if job.get("mode") == "programs" else len(job["tests"])
        self.started = time.monotonic()
        self.bufs: dict[int, bytearray] = {}
        self.open_fds: set[int] = set()
        self.out_total = 0
        self.result_overflow = False
        self.b_pidfd: int | None = None
        self.pids: tuple[int, int] | None = None
        self.timed_out: str | None = None
        self.kill_sent = False
        self.cpu0 = self.slot.cpu_usage()
        self.cpu_used = 0.0
        self.workdirs = (WORKDIR_S, WORKDIR_J)

    def run(self) -> dict:
        sent = self.send()
        if sent:
            self.watch()
        self.reap()
        return self.result()

    # -- hand the job over ---------------------------------------------------------------------
    def send(self) -> bool:
        job = self.job
        if not self.isolated:  # one shared working folder, as in the sandbox's own root
            import tempfile

            shared = tempfile.mkdtemp(prefix="regimen-sandbox-")
            os.chmod(shared, 0o1777)
            self.workdirs = (shared, shared)
        code_fd = _memfd(
            json.dumps(
                {"code": job["code"], "mode": job.get("mode") or "functions", "workdir": self.workdirs[0]}
            ).encode()
        )
        cpu = float(job.get("case_timeout_s") or 2.0)
        job_fd = _memfd(
            json.dumps(
                {
                    "tests": job["tests"],
                    "setup": job.get("setup"),
                    "entry_point": job.get("entry_point"),
                    "mode": job.get("mode") or "functions",
                    "cases": job.get("cases"),
                    "case_limits": [cpu, 3 * cpu + 1],
                    "float_tolerance": job.get("float_tolerance"),
                    "float_rule": job.get("float_rule"),
                    "output_limit": self.server.output_limit * 64,
                    "workdir": self.workdirs[1],
                }
            ).encode()
        )
        self.res_r, res_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.ctl, ctl_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            kind = (b"I" if self.isolated else b"U") if _alone(job) else (b"i" if self.isolated else b"u")
            socket.send_fds(self.server.zsock, [kind], [code_fd, job_fd, out_w, res_w, ctl_child.fileno()])
            sent = True
        except OSError as exc:
            sent = False
            _line(res_w, f"infra the slot's zygote is gone: {exc}")
            self.server.broken = True
        finally:
            for fd in (code_fd, job_fd, out_w, res_w):
                os.close(fd)
            ctl_child.close()
        del job["code"]
        self.bufs = {self.res_r: bytearray(), self.out_r: bytearray()}
        self.open_fds = {self.res_r, self.out_r}
        for fd in self.bufs:
            os.set_blocking(fd, False)
        return sent

    # -- watch it ------------------------------------------------------------------------------
    def watch(self) -> None:
        """Until A reports J's end (or the result pipe closes, or a killed sample's pipe stays open 5 s)."""
        give_up = None  # after a kill: how long to wait for the result pipe to close
        wall_deadline = self.started + self.server.wall_s
        while self.res_r in self.open_fds:
            now = time.monotonic()
            if self.timed_out is None:
                self.timed_out = self._over_limit(now, wall_deadline)
                if self.timed_out is not None:
                    give_up = now + 5.0
                    self.kill()
            elif not self.kill_sent:
                self.kill()
            if give_up is not None and now >= give_up:
                return
            limit = (give_up if give_up is not None else wall_deadline) - now
            watch = list(self.open_fds) + ([self.ctl.fileno()] if self.pids is None else [])
            ready, _, _ = select.select(
                watch, [], [], max(0.0, min(limit, _POLL_S if self.cpu0 is not None else limit))
            )
            for fd in ready:
                if fd == self.ctl.fileno():
                    self._receive_pids()
                    continue
                self.drain(fd)
                if fd == self.res_r and b"judge-exit " in self.bufs[self.res_r]:
                    return

    def _over_limit(self, now: float, wall_deadline: float) -> str | None:
        if now >= wall_deadline:
            return f"timed out after {self.server.wall_s:g} s of wall-clock time"
        if self.cpu0 is not None:
            used = self.slot.cpu_usage()
            if used is not None:
                self.cpu_used = used - self.cpu0
                if self.cpu_used >= self.server.timeout_s:
                    return f"timed out after {self.server.timeout_s:g} s of CPU time"
        return None

    def _receive_pids(self) -> None:
        try:
            msg, fds, _, _ = socket.recv_fds(self.ctl, 64, 1)
            b, a = (int(x) for x in msg.split())
            self.pids = (b, a)
            self.b_pidfd = fds[0] if fds else None
        except (OSError, ValueError):
            self.pids = (0, 0)

    def drain(self, fd: int) -> None:
        """Read what `fd` holds now; past the output limit, output is spliced to /dev/null (no copy), so a
        solution that prints a lot keeps working and the flood costs the server next to nothing (its own
        CPU counts against the sample)."""
        limit = self.server.output_limit
        while fd in self.open_fds:
            if fd == self.out_r and len(self.bufs[fd]) >= limit and self.server.discard_fd():
                try:
                    n = os.splice(fd, self.server.discard_fd(), 1 << 20, flags=os.SPLICE_F_NONBLOCK)  # type: ignore[attr-defined]
                except BlockingIOError:
                    return
                except OSError:
                    n = 0
                if n:
                    self.out_total += n
                    continue
                chunk = b""
            else:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    return
                except OSError:
                    chunk = b""
            if chunk and fd == self.out_r:
                self.bufs[fd] += chunk[: max(0, limit - len(self.bufs[fd]))]
                self.out_total += len(chunk)
                continue
            if chunk:
                self.bufs[fd] += chunk
                if len(self.bufs[fd]) <= _RESULT_LIMIT:
                    continue
                self.result_overflow = True
            self.open_fds.discard(fd)
            os.close(fd)

    def kill(self) -> None:
        if self.b_pidfd is not None:
            try:
                signal.pidfd_send_signal(self.b_pidfd, signal.SIGKILL)
            except OSError:
                pass
            self.kill_sent = True
        elif self.pids is not None:
            try:
                os.kill(self.pids[0], signal.SIGKILL)
            except OSError:
                pass
            self.kill_sent = True
        if not self.isolated:
            self._kill_unisolated()

    def _kill_unisolated(self) -> None:
        if self.pids is not None and self.pids[1] > 0:
            try:
                os.killpg(self.pids[1], signal.SIGKILL)
            except OSError:
                pass
        self.slot.kill_cgroups(spare=self.server.zpid)

    # -- end it --------------------------------------------------------------------------------
    def reap(self) -> None:
        """Z reported J's end (or the result pipe closed): B, which became J, has been reaped, and its exit
        emptied the pid namespace. Unisolated, whatever is left in the slot's cgroups is killed."""
        if self.b_pidfd is not None:
            ready, _, _ = select.select([self.b_pidfd], [], [], 2.0)
            if not ready:
                self.kill()
                select.select([self.b_pidfd], [], [], 5.0)
            os.close(self.b_pidfd)
        if not self.isolated:
            self._kill_unisolated()
        end = time.monotonic() + 0.2
        while self.out_r in self.open_fds and time.monotonic() < end:
            if select.select([self.out_r], [], [], max(0.0, end - time.monotonic()))[0]:
                self.drain(self.out_r)
        for fd in list(self.open_fds):
            self.drain(fd)
            if fd in self.open_fds:
                self.open_fds.discard(fd)
                os.close(fd)
        self.ctl.close()
        if not self.isolated:
            import shutil

            for path in set(self.workdirs):
                shutil.rmtree(path, ignore_errors=True)

    def result(self) -> dict:
        if self.cpu0 is not None:
            used = self.slot.cpu_usage()
            if used is not None:
                self.cpu_used = used - self.cpu0
        out = self.bufs.get(self.out_r, bytearray()) if self.bufs else bytearray()
        output = bytes(out).decode("utf-8", "replace")
        if self.out_total > len(out):
            output += f"\n[... {self.out_total - len(out)} more bytes of output discarded]"
        res = bytes(self.bufs.get(self.res_r, b"")) if self.bufs else b""
        result = verdict(res, self.n, timed_out=self.timed_out, overflow=self.result_overflow)
        result.update(
            output=output,
            duration_s=round(time.monotonic() - self.started, 4),
            isolated=self.isolated,
            cpu_s=round(self.cpu_used, 4) if self.cpu0 is not None else None,
        )
        return result


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
        hint = {
            "SIGXCPU": " (CPU time limit)",
            "SIGXFSZ": " (file size limit)",
            "SIGKILL": " (memory limit, or killed)",
            "SIGSEGV": " (crashed)",
            "SIGSYS": " (forbidden system call)",
        }
        return f"killed by {name}{hint.get(name, '')}"
    return f"exit status {code}"


def verdict(res: bytes, n: int, timed_out: str | None = None, overflow: bool = False) -> dict:
    """Turn the result pipe's lines (written by J, and by Z/B for infra) into a result dict.

    J writes: `loaded` | `loadfail <why>`; `pass <i>` / `fail <i> <why>` for i = 0..n-1 in order (none
    after a loadfail); `gone <why>` at most once; `done <n>`. Z, B or J write `infra <why>` when the
    sandbox (or the row's trusted set-up code) failed; Z writes `judge-exit <code>` when J (B) ended."""
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
        elif (
            kind == "done"
            and rest == str(n)
            and loaded is not None
            and (len(tests) == n or loaded is False)
            and not done
        ):
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
