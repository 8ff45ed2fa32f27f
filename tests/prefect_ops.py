"""Fixtures shared by the operations, UI and resume tests (loaded with `pytest_plugins = ["prefect_ops"]`).

A real `prefect server start` on 127.0.0.1 on a free port, with a temporary PREFECT_HOME and basic auth
(PREFECT_SERVER_API_AUTH_STRING), `regimen serve` processes against it, and the scenario the UI and the
operations tests share: a run that fails in GRPO (REGIMEN_FAULT in the serving process's environment),
then, served again without the fault, retried through the API. Every process started here is stopped
by its PID (its own process group, so the flow runs it spawned go with it).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
AUTH = "regimen:s3cret-for-tests"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# Passed to `regimen serve` so the test sees them arrive in the API (the defaults are 0 2 * * * and UTC).
CRON, TIMEZONE = "30 3 * * *", "Europe/Paris"
READY = "registered, runs start here"  # what `regimen serve` prints once its deployments are as it means them
EXPERIMENT = "ops"


def bin_path(name: str) -> str:
    """A console script of the environment running the tests (the venv's `prefect`, `regimen`)."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
    """Signal the process we started (by PID), wait, then SIGKILL its process group if anything is left."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
            proc.wait(timeout)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group we created with start_new_session: our children only
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass
    return proc.returncode


def tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except FileNotFoundError:
        return ""


@dataclass
class Server:
    url: str
    home: Path
    proc: subprocess.Popen
    log: Path
    http: httpx.Client = field(repr=False)
    started_s: float = 0.0

    @property
    def api(self) -> str:
        return f"{self.url}/api"

    def client_env(self, **extra: str) -> dict[str, str]:
        """The environment of a process that talks to this server as an authenticated client."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGIMEN_FAULT") and k != "REGIMEN_KILL"}
        env.update(
            PREFECT_API_URL=self.api,
            PREFECT_API_AUTH_STRING=AUTH,
            PREFECT_HOME=str(self.home),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_LOGGING_LEVEL="INFO",
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            # the tiny model gains nothing from threads, and OpenMP threads spinning against another
            # training on the same 2 cores slowed tiny GRPO steps 50x (0.02s to 1.2s) in a measured run
            OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
        )
        env.update(extra)
        return env

    def post(self, path: str, body: Any = None, **kw) -> httpx.Response:
        return self._retry(lambda: self.http.post(f"{self.api}{path}", json=body if body is not None else {}, **kw))

    def get(self, path: str, **kw) -> httpx.Response:
        return self._retry(lambda: self.http.get(f"{self.api}{path}", **kw))

    @staticmethod
    def _retry(send) -> httpx.Response:
        """Retry what Prefect's own client retries: a busy server's 429/502/503 (SQLite under load)."""
        for attempt in range(6):
            r = send()
            if r.status_code not in (429, 502, 503):
                return r
            time.sleep(0.5 * 2**attempt)
        return r

    def deployments(self) -> dict[str, dict]:
        r = self.post("/deployments/filter", {"flows": {"name": {"any_": ["regimen-cycle"]}}})
        r.raise_for_status()
        return {d["name"]: d for d in r.json()}

    def create_run(
        self, deployment: str, parameters: dict[str, Any], job_variables: dict[str, Any] | None = None
    ) -> httpx.Response:
        dep = self.deployments()[deployment]
        body: dict[str, Any] = {"parameters": parameters}
        if job_variables:
            body["job_variables"] = job_variables
        return self.post(f"/deployments/{dep['id']}/create_flow_run", body)

    def run(self, run_id: str) -> dict:
        r = self.get(f"/flow_runs/{run_id}")
        r.raise_for_status()
        return r.json()

    def wait_run(self, run_id: str, timeout: float = 180, logs: list[Path] = ()) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.run(run_id)
            if run["state"]["type"] in TERMINAL:
                return run
            time.sleep(0.5)
        raise AssertionError(
            f"flow run {run_id} not finished after {timeout}s: {run['state']}\n" + "\n".join(tail(p) for p in logs)
        )

    def task_runs(self, run_id: str) -> list[dict]:
        r = self.post("/task_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}, "sort": "EXPECTED_START_TIME_ASC"})
        r.raise_for_status()
        return r.json()

    def artifacts(self, run_id: str, kind: str = "table") -> list[dict]:
        r = self.post("/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}, "type": {"any_": [kind]}}})
        r.raise_for_status()
        return r.json()


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory) -> Server:
    """`prefect server start` on 127.0.0.1, a free port, a temporary PREFECT_HOME, basic auth on."""
    with prefect_server_in(tmp_path_factory.mktemp("prefect-home")) as server:
        yield server


@contextmanager
def prefect_server_in(home: Path, **settings: str) -> Iterator[Server]:
    """A `prefect server start` of its own in `home` (tests that change deployments others rely on, such
    as the work pool's, use one of their own); `settings`: more PREFECT_* for the server."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_API_AUTH_STRING=AUTH,
        PREFECT_UI_API_URL=f"{url}/api",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_API_HOST="127.0.0.1",
        **settings,
    )
    log = home / "server.log"
    t0 = time.monotonic()
    from regimen.flows.serving.server import start_server

    try:
        proc, _ = start_server(port, env, log, timeout_s=90)
    except RuntimeError as exc:
        raise AssertionError(str(exc)) from None
    http = httpx.Client(auth=tuple(AUTH.split(":", 1)), timeout=30)
    try:
        yield Server(url=url, home=home, proc=proc, log=log, http=http, started_s=time.monotonic() - t0)
    finally:
        http.close()
        stop(proc)


@dataclass
class Serve:
    proc: subprocess.Popen
    log: Path
    visible_s: float = 0.0  # from starting `regimen serve` to both deployments listed by the API
    # the deployments as the API showed them then (later tests change them)
    registered: dict = field(default_factory=dict)


def start_serve(server: Server, store: Path, log: Path, **env: str) -> Serve:
    """`regimen serve tests/tiny.yaml` (a path relative to the project, as a user types it) against `server`."""
    before = {name: d["updated"] for name, d in server.deployments().items()}
    t0, visible = time.monotonic(), 0.0
    log.touch()
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [
                bin_path("regimen"),
                "serve",
                "tests/tiny.yaml",
                "--configs",
                "tests",
                "--store",
                str(store),
                "--cron",
                CRON,
                "--timezone",
                TIMEZONE,
            ],
            cwd=ROOT,
            env=server.client_env(PREFECT_RUNNER_POLL_FREQUENCY="1", **env),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    start = log.stat().st_size
    while True:
        found = server.deployments()
        # visible to the API first; registered (the guarded fields set, their digests taken) once serve says so:
        # a change made through the API in between is overwritten by serve's own registration
        if all(name in found and found[name]["updated"] != before.get(name) for name in ("on-demand", "nightly")):
            visible = visible or time.monotonic() - t0
            if READY in log.read_bytes()[start:].decode(errors="replace"):
                return Serve(proc, log, visible, server.deployments())
        if proc.poll() is not None or time.monotonic() - t0 > 90:
            stop(proc)
            raise AssertionError(
                f"`regimen serve` did not register its deployments (exit {proc.returncode}):\n{tail(log)}"
            )
        time.sleep(0.1)


@dataclass
class Scenario:
    """What happened in the shared scenario, for the tests to assert on."""

    server: Server
    store: Path
    logs: Path
    serve_visible_s: float = 0.0
    failed: dict | None = None
    after_stop: dict | None = None  # the nightly deployment as the API shows it once the first serve stopped
    after_restart: dict | None = None  # ... and once serve started again, after a person paused its schedule
    serve_exit: int | None = None
    retried: dict | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase, printed by the tests
    queued: dict | None = None  # a nightly run created while the retried run was training
    serve: Serve | None = None


@pytest.fixture(scope="session")
def ops_dirs(tmp_path_factory) -> tuple[Path, Path]:
    return tmp_path_factory.mktemp("ops-store"), tmp_path_factory.mktemp("ops-logs")


@pytest.fixture(scope="session")
def faulty_serve(prefect_server, ops_dirs):
    """`regimen serve` whose flow runs fail in GRPO after step 3 (REGIMEN_FAULT in its environment)."""
    store, logs = ops_dirs
    serve = start_serve(prefect_server, store, logs / "serve-faulty.log", REGIMEN_FAULT="grpo@3")
    yield serve
    stop(serve.proc)


@pytest.fixture(scope="session")
def scenario(prefect_server, ops_dirs, faulty_serve):
    """Fail a run in GRPO; stop serve (SIGTERM); while nothing serves, pause the nightly schedule and retry
    the run via the API; serve again without the fault; while the retry trains, let a nightly run arrive."""
    store, logs = ops_dirs
    sc = Scenario(prefect_server, store, logs, serve_visible_s=faulty_serve.visible_s)
    # served from tests/: the recipe's folder; the store is serve's
    params = {"config": "tiny.yaml", "experiment": EXPERIMENT}
    t = time.monotonic()

    def lap(name: str) -> None:
        nonlocal t
        sc.timings[name] = time.monotonic() - t
        t = time.monotonic()

    r = prefect_server.create_run("on-demand", params)
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    sc.failed = prefect_server.wait_run(run_id, logs=[faulty_serve.log])
    lap("run failing in GRPO")
    sc.serve_exit = stop(faulty_serve.proc, signal.SIGTERM)
    sc.after_stop = prefect_server.deployments()["nightly"]
    lap("serve stop (SIGTERM)")
    # while nothing serves: a person pauses the nightly schedule, and retries the failed run the way
    # `prefect flow-run retry` and the UI's Retry do (force it back to Scheduled)
    nightly = sc.after_stop
    r = prefect_server._retry(
        lambda: prefect_server.http.patch(  # SQLite busy answers 503, as for the other writes
            f"{prefect_server.api}/deployments/{nightly['id']}/schedules/{nightly['schedules'][0]['id']}",
            json={"active": False},
        )
    )
    assert r.status_code == 204, r.text
    r = prefect_server.post(
        f"/flow_runs/{run_id}/set_state",
        {"state": {"type": "SCHEDULED", "message": "Retried via the API"}, "force": True},
    )
    assert r.status_code in (200, 201) and r.json()["status"] == "ACCEPT", r.text
    sc.serve = start_serve(prefect_server, store, logs / "serve.log")
    sc.after_restart = prefect_server.deployments()["nightly"]
    lap("serve again, to deployments visible")
    try:
        deadline = time.monotonic() + 120
        while prefect_server.run(run_id)["state"]["type"] not in {"RUNNING", *TERMINAL} and time.monotonic() < deadline:
            time.sleep(0.2)
        # a nightly run arrives while the retry trains (as its schedule would make it): it must wait, not be dropped
        r = prefect_server.create_run("nightly", params)
        assert r.status_code == 201, r.text
        sc.retried = prefect_server.wait_run(run_id, logs=[sc.serve.log])
        lap("retry")
        sc.queued = prefect_server.wait_run(r.json()["id"], logs=[sc.serve.log])
        lap("queued nightly run, after the retry")
        yield sc  # the second (fault-free) `regimen serve` keeps serving for the tests that follow
    finally:
        stop(sc.serve.proc)
