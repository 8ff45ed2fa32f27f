"""The Prefect API is the boundary, tried through a real `prefect server start` and `regimen serve`:

- a deployment patched through the API (a `run_shell_script` pull step; `entrypoint: os:system` with
  `path: /somewhere`) runs nothing of the attacker's: the run is refused (Failed, with the changed fields
  named), an event `regimen.deployment.tampered` is recorded, nothing is copied or executed, and serving
  again resets the record;
- values outside the door's bounds, and runs asking for more than the operator's limits, are refused
  naming the field, before anything is written;
- `regimen serve` outlives its server: killed and started again, serve registers anew and serves.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

pytest.register_assert_rewrite("prefect_ops")
from prefect_ops import AUTH, READY, ROOT, Server, bin_path, free_port, start_serve, stop, tail  # noqa: E402

pytest_plugins = ["prefect_ops"]
pytestmark = pytest.mark.slow

PARAMS = {"config": "tiny.yaml"}


def patch(server: Server, deployment_id: str, body: dict) -> httpx.Response:
    return server._retry(lambda: server.http.patch(f"{server.api}/deployments/{deployment_id}", json=body))


def refused_run(server: Server, experiment: str, logs: list[Path], **params) -> dict:
    r = server.create_run("on-demand", {**PARAMS, "experiment": experiment, **params})
    assert r.status_code == 201, r.text
    return server.wait_run(r.json()["id"], timeout=120, logs=logs)


def tampered_events(server: Server) -> list[dict]:
    r = server.post("/events/filter", {"filter": {"event": {"name": ["regimen.deployment.tampered"]}}, "limit": 50})
    r.raise_for_status()
    return r.json().get("events", [])


def test_a_deployment_patched_through_the_api_runs_nothing_of_the_attackers(
    prefect_server, faulty_serve, ops_dirs, tmp_path
):
    server, (store, _) = prefect_server, ops_dirs
    dep = server.deployments()["on-demand"]
    original = {k: dep[k] for k in ("pull_steps", "entrypoint", "path")}
    pwned = tmp_path / "pwned"
    try:
        # 1. a pull step that runs a shell command as the user serving
        r = patch(
            server,
            dep["id"],
            {"pull_steps": [{"prefect.deployments.steps.run_shell_script": {"script": f"touch {pwned}"}}]},
        )
        assert r.status_code == 204, r.text
        run = refused_run(server, "tamper-pull", [faulty_serve.log])
        assert run["state"]["type"] == "FAILED", run["state"]
        message = run["state"]["message"] or ""
        assert message.startswith("refused:") and "pull_steps" in message and "restart `regimen serve`" in message, (
            message
        )
        assert not pwned.exists() and not (store / "tamper-pull").exists()
        assert server.task_runs(run["id"]) == []  # no stage, not even the preflight

        # 2. the flow swapped for os.system, loaded from a folder of the attacker's choosing
        patch(server, dep["id"], {"pull_steps": original["pull_steps"]})
        bait = tmp_path / "bait"
        bait.mkdir()
        name = f"bait-{uuid.uuid4().hex}.txt"
        (bait / name).write_text("copied?")
        r = patch(server, dep["id"], {"entrypoint": "os:system", "path": str(bait)})
        assert r.status_code == 204, r.text
        run = refused_run(server, "tamper-entry", [faulty_serve.log])
        message = run["state"]["message"] or ""
        assert run["state"]["type"] == "FAILED" and message.startswith("refused:"), run["state"]
        assert "entrypoint" in message and "path" in message, message
        found = subprocess.run(
            ["find", "/tmp", str(ROOT), "-name", name, "-not", "-path", f"{bait}/*"], capture_output=True, text=True
        ).stdout
        assert found.strip() == "", found  # nothing copied out of the attacker's folder
        assert not (store / "tamper-entry").exists()

        # the operator hears of it: an event per refused run, and a line in serve's log
        deadline = time.monotonic() + 30
        while len(tampered_events(server)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        events = tampered_events(server)
        assert len(events) >= 2 and all(
            e["resource"]["prefect.resource.id"] == f"prefect.deployment.{dep['id']}" for e in events
        )
        assert "refused: deployment 'on-demand' was changed through Prefect's API" in tail(faulty_serve.log, 200_000)
    finally:
        patch(server, dep["id"], original)  # as serve registered it: the next tests' runs are honest again
    assert {k: server.deployments()["on-demand"][k] for k in original} == original


def test_a_concurrency_limit_or_an_opened_schema_changed_through_the_api_refuses_the_runs(
    prefect_server, faulty_serve, ops_dirs
):
    """The deployment's concurrency (1, ENQUEUE: one training at a time) is a guarded field: raised through
    the API, the next run is refused with the field named and the tampered event. A parameter schema
    opened through the API lets the server accept a parameter the flow does not have (`store`): that run
    fails as refused, with the reason and the event, not as a crash of parameter validation."""
    server, (store, _) = prefect_server, ops_dirs
    dep = server.deployments()["on-demand"]
    original = {"parameter_openapi_schema": dep["parameter_openapi_schema"]}
    assert dep["global_concurrency_limit"]["limit"] == 1
    before = len(tampered_events(server))
    try:
        r = patch(server, dep["id"], {"concurrency_limit": 5})
        assert r.status_code == 204, r.text
        run = refused_run(server, "tamper-concurrency", [faulty_serve.log])
        message = run["state"]["message"] or ""
        assert (
            run["state"]["type"] == "FAILED"
            and run["state"]["name"] == "Refused"
            and message.startswith("refused:")
            and "global_concurrency_limit" in message
        ), run["state"]
        assert server.task_runs(run["id"]) == [] and not (store / "tamper-concurrency").exists()
        patch(server, dep["id"], {"concurrency_limit": 1})

        opened = {**original["parameter_openapi_schema"], "additionalProperties": True}
        opened["properties"] = {**opened["properties"], "store": {"type": "string", "title": "store"}}
        r = patch(server, dep["id"], {"parameter_openapi_schema": opened})
        assert r.status_code == 204, r.text
        run = refused_run(server, "tamper-schema", [faulty_serve.log], store=str(store.parent / "elsewhere"))
        deadline = time.monotonic() + 30  # Prefect's engine stops the run process before the flow's first line; serve's
        # runner then calls the flow's crash hook
        while run["state"]["type"] == "CRASHED" and time.monotonic() < deadline:
            time.sleep(0.5)
            run = server.run(run["id"])
        message = run["state"]["message"] or ""
        assert (
            run["state"]["type"] == "FAILED"
            and run["state"]["name"] == "Refused"
            and message.startswith("refused:")
            and "parameter_openapi_schema" in message
        ), run["state"]
        assert not (store.parent / "elsewhere").exists() and not (store / "tamper-schema").exists()
        deadline = time.monotonic() + 30
        while len(tampered_events(server)) < before + 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)  # a second event for either run (its failure hook refusing it again) would have landed by now
        assert len(tampered_events(server)) == before + 2, tampered_events(server)[before:]
    finally:
        patch(server, dep["id"], {**original, "concurrency_limit": 1})
    assert server.deployments()["on-demand"]["parameter_openapi_schema"] == original["parameter_openapi_schema"]
    assert server.deployments()["on-demand"]["global_concurrency_limit"]["limit"] == 1


OVER = {  # the door's bounds and the operator's limits (serve's defaults: 100,000 steps, 5 checkpoints), through the UI
    "lr-huge": ({"grpo.learning_rate": 1e308}, "grpo.learning_rate"),
    "beta-huge": ({"grpo.beta": 1e300}, "grpo.beta"),
    "temperature-zero": ({"grpo.temperature": 0}, "grpo.temperature"),
    "seed-2-64": ({"grpo.seed": 2**64}, "grpo.seed"),
    "max-cycles": ({"cycle.max_cycles": 10**9}, "cycle.max_cycles"),
    "num-proc": ({"sft.dataset_num_proc": 64}, "sft.dataset_num_proc"),
    "workers": ({"grpo.dataloader_num_workers": 64}, "grpo.dataloader_num_workers"),
    "steps-1e12": ({"grpo.max_steps": 10**12}, "grpo.max_steps"),
    "steps-over-limit": ({"grpo.max_steps": 200_000}, "limits.max_steps"),
    "checkpoints-over-limit": ({"grpo.save_total_limit": 50, "grpo.save_steps": 1}, "limits.max_checkpoints"),
    "limits-themselves": ({"limits.max_steps": 10**9}, "'limits.max_steps' is not a UI parameter"),
    "guard-off": (
        {"cycle.guard.action": "warn"},
        "'cycle.guard.action' is not a UI parameter",
    ),  # the operator's policy
    "guard-blind": ({"cycle.guard.train_rise": 1000.0}, "'cycle.guard.train_rise' is not a UI parameter"),
}


THROUGH_THE_SERVER = ("lr-huge", "steps-over-limit", "limits-themselves", "guard-off")
"""One of each kind goes the whole way (API → serve's runner → the flow's door); the full table goes through
the same door function in-process below, which is what the flow calls (`resolve_ui_recipe`)."""


def test_values_out_of_bounds_and_over_the_operators_limits_are_refused_naming_the_field(
    prefect_server, faulty_serve, ops_dirs
):
    server, (store, _) = prefect_server, ops_dirs
    ids = {}
    for name in THROUGH_THE_SERVER:
        r = server.create_run("on-demand", {**PARAMS, "experiment": f"over-{name}", "overrides": OVER[name][0]})
        assert r.status_code == 201, (name, r.text)
        ids[name] = r.json()["id"]
    for name, run_id in ids.items():
        run = server.wait_run(run_id, timeout=120, logs=[faulty_serve.log])
        assert run["state"]["type"] == "FAILED", (name, run["state"])
        assert OVER[name][1] in (run["state"]["message"] or ""), (name, run["state"]["message"])
        assert not (store / f"over-{name}").exists(), name


@pytest.mark.parametrize("name", sorted(OVER))
def test_every_bound_and_limit_is_refused_at_the_flows_door(name, monkeypatch):
    """The door a served run goes through (`regimen_cycle` calls `resolve_ui_recipe` first), with serve's
    environment: the recipes folder and the operator's default limits."""
    import json

    from regimen.flows.pipeline.cycle import resolve_ui_recipe
    from regimen.flows.serving import boundary
    from regimen.stages.core.errors import RegimenError

    monkeypatch.setenv("REGIMEN_CONFIGS", str(ROOT / "tests"))
    monkeypatch.setenv("REGIMEN_UI_LIMITS", json.dumps(boundary.DEFAULT_LIMITS))
    monkeypatch.delenv("REGIMEN_UI_ALLOW", raising=False)
    resolve_ui_recipe(PARAMS["config"], {"grpo.learning_rate": 1e-5})  # an honest override passes the same door
    with pytest.raises(RegimenError) as caught:
        resolve_ui_recipe(PARAMS["config"], OVER[name][0])
    assert OVER[name][1] in str(caught.value), (name, str(caught.value))


def test_serve_outlives_its_server_and_serves_again_when_it_is_back(tmp_path):
    """The server killed under `regimen serve` and started again on the same port and database."""
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    url = f"http://127.0.0.1:{port}"

    def start_server() -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            PREFECT_HOME=str(home), PREFECT_SERVER_API_AUTH_STRING=AUTH, PREFECT_SERVER_ANALYTICS_ENABLED="false"
        )
        from regimen.flows.serving.server import start_server as start

        return start(port, env, home / "server.log")[0]

    proc = start_server()
    server = Server(
        url=url,
        home=home,
        proc=proc,
        log=home / "server.log",
        http=httpx.Client(auth=tuple(AUTH.split(":", 1)), timeout=30),
    )
    serve = start_serve(server, tmp_path / "store", tmp_path / "serve.log")
    try:
        deadline = time.monotonic() + 60  # registered and guarded (serve sets the entrypoint it runs)
        while any(
            d["entrypoint"] != "regimen.flows.pipeline.cycle.regimen_cycle" for d in server.deployments().values()
        ):
            assert time.monotonic() < deadline, server.deployments()
            time.sleep(0.2)
        stop(proc, __import__("signal").SIGKILL)
        time.sleep(8)  # serve's runner loses its API; serve must not die of it
        assert serve.proc.poll() is None, tail(serve.log)
        server.proc = start_server()
        # Prefect's runner either rides out the outage (its loops retry) or gives up; then serve waits for
        # the API, registers anew ("answers again", then its ready line a second time) and serves
        run = refused_run(server, "after-outage", [serve.log], overrides={"grpo.no_such_field": 1})
        assert run["state"]["type"] == "FAILED" and "grpo.no_such_field" in (run["state"]["message"] or ""), run[
            "state"
        ]
        log = tail(serve.log, 100_000)
        if "serve waits for it to come back" in log:
            assert "answers again" in log and log.count(READY) == 2, log
        assert serve.proc.poll() is None, log
    finally:
        stop(serve.proc)
        stop(server.proc)
        server.http.close()


def _own_server(home: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    from regimen.flows.serving.server import start_server

    return start_server(port, env, home / "server.log")


@pytest.mark.parametrize("signal_after", [False, True])
def test_a_run_outlives_its_orchestrator(signal_after, tmp_path):
    """The Prefect server killed mid-GRPO: the run trains on and finishes (exit 0), or, signalled, stops
    with 143; one line says the API is gone, and none of the client's retry tracebacks reach the terminal."""
    import signal

    home = tmp_path / "home"
    home.mkdir()
    server, url = _own_server(home)
    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_API_URL=url, PREFECT_HOME=str(home), OMP_NUM_THREADS="1", REGIMEN_MACHINE_SLOTS="0")
    proc = subprocess.Popen(
        [
            bin_path("regimen"),
            "run",
            "tests/tiny.yaml",
            "--store",
            str(store),
            "--set",
            "grpo.max_steps=60",
            "--set",
            "grpo.save_steps=20",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not list((store / "tiny-test" / "grpo" / "work").glob("*/checkpoint-20/regimen_complete")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.1)
        stop(server, signal.SIGKILL)
        if signal_after:
            time.sleep(1)
            os.kill(proc.pid, signal.SIGTERM)
        # a hang guard, not a speed claim (bench/orchestrator_outage.py measures)
        out, _ = proc.communicate(timeout=300)
    finally:
        stop(server, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == (143 if signal_after else 0), out
    assert out.count("Prefect's API does not answer") <= 1 and "Traceback" not in out, out
    assert "EventsWorker" not in out and "Error logging to API" not in out, out
    if signal_after:
        assert "interrupted by SIGTERM" in out and "rerun resumes from step" in out, out
    else:
        assert (
            "Prefect's API does not answer" in out and (store / "tiny-test" / "eval" / "v1" / "manifest.json").is_file()
        ), out
