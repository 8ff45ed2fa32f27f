"""Prefect's API for one `regimen run` when no `PREFECT_API_URL` is set: a temporary server that is this
process's own child, and dies with it.

Prefect's own temporary server (`SubprocessASGIServer`) gives no way to tie the server's life to ours:
a `regimen run` that is SIGKILLed would leave it running. So the CLI starts the same app itself:
`python -m regimen.flows.serving.server PARENT_PID` binds a free port on 127.0.0.1 first (and prints it, so the
parent never guesses a port that another process takes meanwhile), asks Linux to kill it when its parent
dies (PR_SET_PDEATHSIG, set in the child itself, so no `preexec_fn` and no patched `Popen`), and serves
`prefect.server.api.server.create_app(ephemeral=True)` with uvicorn on that socket: the API without the UI
and with the services an ephemeral server runs, on Prefect's database in PREFECT_HOME, as Prefect's own
temporary server does. The parent points `PREFECT_API_URL` at it (`temporary_settings`) for the run.

Its boot (imports, database migrations) overlaps the recipe's validation in the parent: the parent only
waits for `/api/health` right before the flow starts.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

HEALTH_TIMEOUT_S = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180"))


def wait_until_healthy(url: str, proc: subprocess.Popen | None, timeout_s: float, tail=lambda: "") -> None:
    """Poll `<url>/health` (the API's URL, ending in /api) until it answers 200. RuntimeError with the server's
    output (`tail()`) when its process exits or the time runs out. The one wait the CLI, the tests and the
    benchmarks use."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the Prefect server exited with code {proc.returncode}: {tail()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Prefect server did not answer within {timeout_s:.0f} s: {tail()}")
        time.sleep(0.1)


def start_server(port: int, env: dict[str, str], log: Path, timeout_s: float = 120) -> tuple[subprocess.Popen, str]:
    """`prefect server start` on 127.0.0.1:`port` in a session of its own (its output appended to `log`), waited
    for: (its process, the API's URL). For the tests and benchmarks that need a server of their own."""
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "prefect"),
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}/api"
    wait_until_healthy(url, proc, timeout_s, lambda: Path(log).read_text(errors="replace")[-3000:])
    return proc, url


class TemporaryServer:
    """A started child server: its URL, and `ready()` to wait until it answers."""

    def __init__(self) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="regimen-prefect-server-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "regimen.flows.serving.server", str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env={**os.environ, "PREFECT_UI_ENABLED": "false"},
        )
        line = self.proc.stdout.readline().decode().strip() if self.proc.stdout else ""
        if not line.isdigit():
            self.stop()
            raise RuntimeError(f"the temporary Prefect server did not start: {self.tail()}")
        self.url = f"http://127.0.0.1:{line}/api"

    def tail(self, n: int = 2000) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace")[-n:].strip() or "(no output)"
        except OSError:
            return "(no output)"

    def ready(self, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        """Wait until the API answers `/health` (raises RuntimeError with the server's output if it died)."""
        wait_until_healthy(self.url, self.proc, timeout_s, self.tail)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass


@contextmanager
def api_for_this_run():
    """Yield a `ready()` callable to call before the flow starts. Without a configured PREFECT_API_URL (and
    with Prefect's ephemeral mode allowed) a temporary server is started as this process's child and
    PREFECT_API_URL points at it until the block ends (and flow-run heartbeats are off: nothing outlives
    the run to watch them); otherwise nothing is started."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_SERVER_EPHEMERAL_ENABLED,
        temporary_settings,
    )

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        yield lambda: None
        return

    server = TemporaryServer()
    # Also stopped at exit (a run that ends by an exception); it dies with this process anyway (PR_SET_PDEATHSIG).
    atexit.register(server.stop)
    try:
        # Heartbeats let a long-lived server mark a run whose process vanished as Crashed; this server
        # vanishes with the run, and joining the heartbeat thread costs up to a second at the run's end.
        with temporary_settings(updates={PREFECT_API_URL: server.url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            os.environ["PREFECT_API_URL"] = server.url  # for this process's children (an accelerate launch's ranks)
            try:
                yield server.ready
                _drain()  # the run's last events and log lines reach the server before it stops
            finally:
                os.environ.pop("PREFECT_API_URL", None)
    except BaseException:
        server.stop()
        raise
    # Stopped when the block ends, not at exit: a process that runs several flows (a notebook, the tests)
    # would otherwise keep one idle server per run alive until it exits.
    server.stop()
    atexit.unregister(server.stop)


def _drain(timeout_s: float = 10.0) -> None:
    """Send what Prefect's event and log workers still hold (their public `drain_all`, which Prefect's own
    exit handlers call)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=timeout_s, at_exit=False)
        except Exception:  # noqa: BLE001 - a server that stopped answering: what it could not take is dropped
            pass


def _die_with_parent(parent: int) -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the line above
        sys.exit(0)


def main(parent: int) -> None:
    _die_with_parent(parent)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(sock.getsockname()[1], flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing more on the pipe the parent read the port from
    import uvicorn
    from prefect.server.api.server import create_app

    config = uvicorn.Config(create_app(ephemeral=True, final=True), log_level="error", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main(int(sys.argv[1]))
