"""One run of a stdin/stdout program, in the solution's process S: as a plain harness runs
`python solution.py < input > output`, per test case.

S forks a child per case. The child gets the case's input as its standard input (a memfd, so every way of
reading stdin works: `input()`, `sys.stdin.read()`, `sys.stdin.buffer`, `open(0)`), a pipe as its
standard output, the sample's output as its standard error, RLIMIT_CPU of the case's CPU limit, and runs
the compiled program as `__main__` in a fresh namespace; it exits with the program's status (SystemExit
as Python gives it, 1 after an uncaught exception, whose traceback goes to stderr). S reads the stdout up
to a limit (the rest is read and dropped, so the program is never blocked on a full pipe), kills the child
past the case's wall-clock limit, and answers `("ran", stdout bytes, status, truncated)`: status is the
exit code, or 128 + the signal that killed it (SIGXCPU: the CPU limit; SIGKILL: the wall-clock limit or
memory). The judge compares the output with the expected one, which S never sees.

S itself runs no code of the solution's in this mode, and it makes itself not dumpable before any child
exists (so a child cannot write S's memory through /proc). Stdlib only: the server imports it by path.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import sys
import time

_CHUNK = 1 << 16
_PR_SET_DUMPABLE = 4


def _not_dumpable() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def run(code, stdin: object, limits: object, output_limit: object) -> tuple:
    """Run the compiled `code` once with `stdin` (str or bytes); `limits` = (cpu_s, wall_s)."""
    if type(stdin) is str:
        stdin = stdin.encode("utf-8", "surrogateescape")
    if type(stdin) is not bytes or type(limits) is not tuple or len(limits) != 2 or type(output_limit) is not int:
        return ("bad", "a run request is (input, (cpu_s, wall_s), output_limit)")
    cpu_s, wall_s = float(limits[0]), float(limits[1])
    _not_dumpable()
    inp = os.memfd_create("stdin", 0)
    os.write(inp, stdin)
    os.lseek(inp, 0, os.SEEK_SET)
    out_r, out_w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _child(code, inp, out_w, out_r, cpu_s)
    os.close(inp)
    os.close(out_w)
    out, truncated, killed = _collect(out_r, pid, wall_s, output_limit)
    _, status = os.waitpid(pid, 0)
    code_ = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
    if killed and code_ == 0:
        code_ = 128 + signal.SIGKILL
    return ("ran", out, code_, truncated)


def _child(code, inp: int, out_w: int, out_r: int, cpu_s: float) -> None:
    """Never returns."""
    try:
        os.close(out_r)
        os.dup2(inp, 0)
        os.dup2(out_w, 1)
        os.close(inp)
        os.close(out_w)
        os.closerange(3, 1 << 16)  # the channel to the judge is not the program's
        limit = max(1, int(cpu_s + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 1))
        import builtins
        import io

        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace"
        )
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
        )
        sys.argv = ["solution.py"]
        sys.modules.pop("solution", None)
        ns = {"__name__": "__main__", "__builtins__": builtins}
        status = 0
        try:
            exec(code, ns)
        except SystemExit as exc:
            status = exc.code if type(exc.code) is int else (0 if exc.code is None else 1)
            if exc.code is not None and type(exc.code) is not int:
                print(exc.code, file=sys.stderr)
        except BaseException:
            import traceback

            traceback.print_exc()
            status = 1
        try:
            sys.stdout.flush()
        except BaseException:
            status = status or 1
        os._exit(status & 0xFF)
    except BaseException:
        os._exit(125)


def _collect(fd: int, pid: int, wall_s: float, limit: int) -> tuple[bytes, bool, bool]:
    """The child's stdout up to `limit` bytes (the rest drained and dropped); kill it past `wall_s`."""
    chunks: list[bytes] = []
    size, truncated, killed = 0, False, False
    deadline = time.monotonic() + wall_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            killed = True
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            break
        if size < limit:
            chunks.append(chunk[: limit - size])
        truncated = truncated or size + len(chunk) > limit
        size += len(chunk)
    os.close(fd)
    return b"".join(chunks), truncated, killed
