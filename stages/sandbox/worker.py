"""One worker slot's server process, from the parent's side: started with an empty environment in its own
session (`python -I -S server.py --serve SETTINGS`), jobs sent as JSON lines on its stdin, results read
as JSON lines from its stdout, a server that dies or hangs reported (`_ServerDied`) so that the item it
was running scores `infra` and is never retried.

Servers are started from one long-lived thread of this process (`_Spawner`): a server asks to be killed
when its parent goes (PR_SET_PDEATHSIG), and the kernel sends that when the *thread* that started it
ends, which for a batch's worker threads is at the end of every call. Stdlib only (plus `syscalls.py`'s
optional libseccomp, which builds the filter the server installs).
"""

from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from typing import Any

from . import server as _server_module
from . import syscalls
from .jobs import Job, SandboxConfig, SandboxResult, SandboxUnavailable, _default_uid_base, _unavailable_message

_SERVER_SCRIPT = os.path.abspath(_server_module.__file__)
_SERVER_START_TIMEOUT_S = 30.0
_BACKSTOP_S = 15.0  # extra seconds the parent waits for a server's answer before declaring it dead


def _interpreter() -> str:
    return sys.executable or "/usr/bin/python3"


class _ServerDied(Exception):
    pass


class _Server:
    """One worker slot: a long-lived server process that runs one sample at a time."""

    def __init__(self, slot: int, cfg: SandboxConfig, uid_index: int | None = None):
        """`slot`: the position reported in results; `uid_index`: which pair of uids it runs samples
        as (default `slot`; a pool passes the indices it reserved)."""
        self.slot = slot
        self.cfg = cfg
        index = slot if uid_index is None else uid_index
        base = cfg.uid_base if cfg.uid_base is not None else _default_uid_base()
        program, why = syscalls.program("j")
        program_s, why_s = syscalls.program("s")
        settings = asdict(cfg)
        settings.update(
            uid_s=base + 2 * index,
            uid_j=base + 2 * index + 1,
            parent_pid=os.getpid(),
            slot=slot,
            wall_timeout_s=cfg.wall_s,
            seccomp=program.hex() if program and program_s else None,
            seccomp_s=program_s.hex() if program and program_s else None,
            seccomp_error=why or why_s,
            package_paths=cfg.package_paths,
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


def after_fork_in_child() -> None:
    """In a forked child: a fresh spawner (the parent's spawner thread does not exist here)."""
    global _spawner
    _spawner = _Spawner()
