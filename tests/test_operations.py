"""Operations against a real `prefect server start` (127.0.0.1, free port, temporary PREFECT_HOME, basic
auth): `regimen serve` registers on-demand and nightly, the server refuses bad parameters with 409, a run
created as the UI's Run button does completes and lists its artifacts, a run failed in GRPO and retried
through the API reuses the finished stages (Cached) and resumes GRPO from its checkpoint, two runs never
train at once, stopping serve leaves the nightly schedule active (and starting it keeps a person's pause),
basic auth guards the API, and prefect.yaml deploys the same deployments for a process worker."""

import json
import subprocess
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

pytest.register_assert_rewrite("prefect_ops")
from prefect_ops import AUTH, CRON, EXPERIMENT, ROOT, TIMEZONE, bin_path, stop, tail  # noqa: E402

pytest_plugins = ["prefect_ops"]
pytestmark = pytest.mark.slow

from regimen.stages.registry import NAMES  # noqa: E402

STAGES = [n for n in NAMES if n != "distill"]  # the stages tiny.yaml runs (it distils nothing)


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def latest_states(server, run_id: str, timeout: float = 30) -> dict[str, str]:
    """Each stage's state in the run's latest attempt (a retried run keeps its earlier task runs too); the
    preflight and verdict tasks run every time and are left out. Task-run states reach the database as
    events, after the flow run's own final state: this waits until every stage is there in a final state."""
    deadline = time.monotonic() + timeout
    while True:
        out: dict[str, tuple[str, str, str]] = {}
        for tr in server.task_runs(run_id):
            stage = tr["name"].split(" ")[0]
            if stage not in NAMES or "(cycle 0," in tr["name"]:  # cycle 0: the champion's evaluation
                continue
            if stage not in out or tr["created"] > out[stage][0]:
                out[stage] = (tr["created"], tr["state_name"], tr["state_type"])
        final = all(v[2] in ("COMPLETED", "FAILED", "CANCELLED", "CRASHED") for v in out.values())
        if (set(out) == set(STAGES) and final) or time.monotonic() > deadline:
            return {k: v[1] for k, v in out.items()}
        time.sleep(0.5)


# -- registration, parameters -----------------------------------------------------------------------


def test_serve_registers_on_demand_and_nightly_with_cron_and_timezone(prefect_server, faulty_serve):
    deps = faulty_serve.registered  # as registered: the session's scenario pauses nightly, whichever test ran it first
    assert set(deps) == {"on-demand", "nightly"}
    assert deps["on-demand"]["schedules"] == []
    [sched] = deps["nightly"]["schedules"]
    assert sched["schedule"]["cron"] == CRON and sched["schedule"]["timezone"] == TIMEZONE and sched["active"]
    for d in deps.values():
        assert not d["paused"]
        assert d["parameters"]["config"] == "tiny.yaml"  # a name inside the folder UI runs choose from (here tests/)
        assert d["enforce_parameter_schema"] is True
        props = d["parameter_openapi_schema"]["properties"]
        assert set(props) == {"config", "experiment", "overrides"}  # the store is the operator's, not a UI parameter
        assert all(p.get("description") for p in props.values()), props  # what the Custom run form shows
        assert d["global_concurrency_limit"]["limit"] == 1
        assert d["concurrency_options"]["collision_strategy"] == "ENQUEUE"
    print(
        f"\n`regimen serve` to both deployments visible via the API: {faulty_serve.visible_s:.1f}s "
        f"(server healthy after {prefect_server.started_s:.1f}s)"
    )


@pytest.mark.parametrize(
    "parameters, field",
    [
        ({"overrides": "grpo.beta=0.1"}, "overrides"),  # a string where a mapping is expected
        ({"config": 42}, "config"),
        ({"experiment": ["a", "b"]}, "experiment"),
        ({"overide": {"grpo.beta": 0.1}}, "overide"),  # a typo: unknown parameters are refused too
        ({"store": "../elsewhere"}, "store"),  # the store is not a UI parameter, whatever its value
    ],
)
def test_invalid_parameters_are_refused_with_409_and_no_run(prefect_server, faulty_serve, parameters, field):
    # Only the on-demand deployment's runs are counted: the server's scheduler adds the nightly deployment's
    # scheduled runs whenever it wakes, which is not a run this request created.
    on_demand = {"deployments": {"id": {"any_": [prefect_server.deployments()["on-demand"]["id"]]}}}
    before = prefect_server.post("/flow_runs/count", on_demand).json()
    r = prefect_server.create_run("on-demand", parameters)
    assert r.status_code == 409, r.text
    assert field in r.json()["detail"]
    assert prefect_server.post("/flow_runs/count", on_demand).json() == before


def test_a_recipe_that_fails_validation_fails_the_run_at_once_with_its_message(prefect_server, faulty_serve, ops_dirs):
    store, _ = ops_dirs
    r = prefect_server.create_run(
        "on-demand", {"config": "tiny.yaml", "experiment": "bad", "overrides": {"grpo.no_such_field": 1}}
    )
    assert r.status_code == 201, r.text
    run = prefect_server.wait_run(r.json()["id"], timeout=90, logs=[faulty_serve.log])
    assert run["state"]["type"] == "FAILED"
    assert "no_such_field" in run["state"]["message"]
    # refused before the preflight or any stage started (task runs are recorded from events, a little after
    # the run's own state: watch for a few seconds)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert prefect_server.task_runs(run["id"]) == []
        time.sleep(0.5)
    assert not (store / "bad").exists()  # nothing written


HOSTILE = {  # what a UI user may try; each is refused before anything runs, naming the key
    "launcher-shell": (
        {
            "overrides": {
                "launcher": "accelerate",
                "accelerate.num_processes": 1,
                "accelerate.extra_args": ["--no_python", "/bin/sh", "-c", "touch {pwned}"],
            }
        },
        "'launcher'",
    ),
    "extra-args": (
        {"overrides": {"accelerate.extra_args": ["--no_python", "/bin/sh", "-c", "touch {pwned}"]}},
        "'accelerate.extra_args'",
    ),
    "reward-path": ({"overrides": {"rewards": [{"name": "os:system"}]}}, "'rewards'"),
    "reward-item": ({"overrides": {"rewards.0.name": "subprocess:getoutput"}}, "not a dotted recipe key"),
    "model-path": ({"overrides": {"model.name_or_path": "/etc"}}, "'model.name_or_path'"),
    "data-file": ({"overrides": {"data.train_file": "/etc/shadow"}}, "'data.train_file'"),
    "store-override": ({"overrides": {"store": "{outside}"}}, "'store'"),
    "teacher": ({"overrides": {"teacher.name_or_path": str(ROOT.parent)}}, "'teacher.name_or_path'"),
    "peft": ({"overrides": {"peft": {"r": 8}}}, "'peft'"),
    "hub-push": ({"overrides": {"grpo.push_to_hub": True}}, "'grpo.push_to_hub'"),
    "logger": ({"overrides": {"sft.report_to": "wandb"}}, "'sft.report_to'"),
    "vllm-url": ({"overrides": {"grpo.vllm_server_base_url": "http://evil:8000"}}, "'grpo.vllm_server_base_url'"),
    "config-abs": ({"config": "/etc/passwd"}, "configs folder"),
    "config-up": ({"config": "../pyproject.toml"}, "configs folder"),
    "config-not-yaml": ({"config": "conftest.py"}, "no such recipe"),
}


HOSTILE_THROUGH_THE_SERVER = ("launcher-shell", "reward-path", "store-override", "config-abs")
"""One of each kind goes the whole way (API -> serve's runner -> the flow's door); the full table goes through
the same door function in-process below (`resolve_ui_recipe`, the first thing `regimen_cycle` calls)."""


def _hostile_body(name: str, tmp_path: Path) -> dict:
    body = {"config": "tiny.yaml", "experiment": f"hostile-{name}", **HOSTILE[name][0]}
    return json.loads(
        json.dumps(body)
        .replace("{pwned}", str(tmp_path / "pwned"))
        .replace("{outside}", str(tmp_path / "outside-store"))
    )


def test_hostile_ui_parameters_are_refused_before_anything_runs(prefect_server, faulty_serve, ops_dirs, tmp_path):
    store, _ = ops_dirs
    ids = {}
    for name in HOSTILE_THROUGH_THE_SERVER:
        r = prefect_server.create_run("on-demand", _hostile_body(name, tmp_path))
        assert r.status_code == 201, (name, r.text)
        ids[name] = r.json()["id"]
    for name, run_id in ids.items():
        run = prefect_server.wait_run(run_id, timeout=120, logs=[faulty_serve.log])
        message = run["state"]["message"] or ""
        assert run["state"]["type"] == "FAILED", (name, run["state"])
        assert HOSTILE[name][1] in message, (name, message)
        assert "root:" not in message  # nothing read back from a file it names
        assert not (store / f"hostile-{name}").exists(), name  # nothing written, not even a lock
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "outside-store").exists()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_every_hostile_ui_parameter_is_refused_at_the_flows_door(name, tmp_path, monkeypatch):
    """The door a served run goes through, with serve's environment (its recipes folder, its store, the
    operator's default limits and no extra allowed keys)."""
    from regimen.flows.pipeline.cycle import resolve_ui_recipe
    from regimen.flows.serving import boundary
    from regimen.stages.core.errors import RegimenError

    store = tmp_path / "store"
    monkeypatch.setenv("REGIMEN_CONFIGS", str(ROOT / "tests"))
    monkeypatch.setenv("REGIMEN_STORE", str(store))
    monkeypatch.setenv("REGIMEN_UI_LIMITS", json.dumps(boundary.DEFAULT_LIMITS))
    monkeypatch.delenv("REGIMEN_UI_ALLOW", raising=False)
    body = _hostile_body(name, tmp_path)
    resolve_ui_recipe("tiny.yaml", {"grpo.learning_rate": 1e-5})  # an honest override passes the same door
    with pytest.raises(RegimenError) as caught:
        resolve_ui_recipe(body["config"], body.get("overrides", {}))
    message = str(caught.value)
    assert HOSTILE[name][1] in message and "root:" not in message, (name, message)
    assert not store.exists() and not (tmp_path / "pwned").exists() and not (tmp_path / "outside-store").exists()


# -- fail, stop serve, retry ------------------------------------------------------------------------


def test_fault_in_grpo_fails_the_run_after_the_earlier_stages_completed(scenario):
    failed = scenario.failed
    assert failed["state"]["type"] == "FAILED", failed["state"]
    assert "injected fault" in failed["state"]["message"] and "grpo" in failed["state"]["message"]
    exp = scenario.store / EXPERIMENT
    for stage in ("sft", "reward-dry-run", "grpo-smoke"):
        assert (exp / stage / "v1" / "manifest.json").exists()
    [attempt] = list((exp / "grpo" / "failed").iterdir())
    assert "injected fault" in json.loads((attempt / "error.json").read_text())["error"]


def test_stopping_serve_leaves_the_nightly_schedule_active_and_serving_again_keeps_a_pause(scenario):
    print("\n" + ", ".join(f"{k}: {v:.1f}s" for k, v in scenario.timings.items()))
    assert scenario.serve_exit == 0, tail(scenario.logs / "serve-faulty.log")
    assert "left as it is" in (scenario.logs / "serve-faulty.log").read_text()
    nightly = scenario.after_stop
    assert nightly["paused"] is False and [s["active"] for s in nightly["schedules"]] == [True]
    # a person paused the schedule while serve was down: starting serve again does not undo it
    again = scenario.after_restart
    assert [s["active"] for s in again["schedules"]] == [False] and again["updated"] != nightly["updated"]
    assert "stays paused" in scenario.serve.log.read_text()


def test_retry_through_the_api_completes_with_earlier_stages_cached_and_grpo_resumed(scenario):
    """Retried while nothing served it: the run waited as Scheduled and started with the next `regimen serve`."""
    server, run = scenario.server, scenario.retried
    assert run["state"]["type"] == "COMPLETED", (run["state"], tail(scenario.serve.log))
    assert run["run_count"] >= 2
    states = latest_states(server, run["id"])
    assert states == {
        "sft": "Cached",
        "reward-dry-run": "Cached",
        "grpo-smoke": "Cached",
        "grpo": "Completed",
        "eval": "Completed",
    }
    exp = scenario.store / EXPERIMENT
    for stage in ("sft", "reward-dry-run", "grpo-smoke"):
        assert sorted(p.name for p in (exp / stage).glob("v*")) == ["v1"]  # reused, not recomputed
    grpo = json.loads((exp / "grpo" / "v1" / "manifest.json").read_text())
    assert grpo["resumed_from_step"] == 2  # fault after step 3, checkpoints every 2 steps
    assert grpo["metrics"]["steps"] == 6 and grpo["metrics"]["steps_run"] == 4


def test_completed_run_lists_its_artifacts(scenario):
    server, run = scenario.server, scenario.retried
    tables = {a["key"]: a for a in server.artifacts(run["id"])}
    assert {f"{EXPERIMENT}-{s}" for s in STAGES} <= set(tables)
    data = tables[f"{EXPERIMENT}-eval"]["data"]
    rows = {row["metric"]: row["value"] for row in (json.loads(data) if isinstance(data, str) else data)}
    assert 0.0 <= rows["heldout_accuracy"] <= 1.0
    assert server.artifacts(run["id"], "markdown")  # trajectories


def test_a_nightly_run_due_during_a_training_run_is_queued_not_dropped(scenario):
    server, first, queued = scenario.server, scenario.retried, scenario.queued
    assert queued["state"]["type"] == "COMPLETED", (queued["state"], tail(scenario.serve.log))
    assert ts(queued["start_time"]) >= ts(first["end_time"]), "the two runs trained at once"
    # nothing changed since the retried run: a new run reuses every finished stage and trains nothing
    assert latest_states(server, queued["id"]) == dict.fromkeys(STAGES, "Cached")


def test_an_honest_custom_run_with_a_hyperparameter_still_works(scenario):
    server = scenario.server
    # the scenario's experiment: what the override does not touch (SFT, the gates) is reused, GRPO trains anew
    r = server.create_run(
        "on-demand", {"config": "tiny.yaml", "experiment": EXPERIMENT, "overrides": {"grpo.beta": 0.08}}
    )
    assert r.status_code == 201, r.text
    run = server.wait_run(r.json()["id"], timeout=240, logs=[scenario.serve.log])
    assert run["state"]["type"] == "COMPLETED", (run["state"], tail(scenario.serve.log))
    states = latest_states(server, run["id"])
    assert states["sft"] == "Cached" and states["grpo"] == "Completed", states
    newest = max((scenario.store / EXPERIMENT / "grpo").glob("v*"), key=lambda p: int(p.name[1:]))
    assert json.loads((newest / "manifest.json").read_text())["config"]["grpo"]["beta"] == 0.08


# -- auth --------------------------------------------------------------------------------------------


def test_basic_auth_refuses_unauthenticated_requests_and_accepts_the_auth_string(prefect_server, faulty_serve):
    import asyncio

    from prefect.client.orchestration import PrefectClient

    api = prefect_server.api
    assert httpx.get(f"{api}/health").status_code == 200  # probes stay open
    assert httpx.post(f"{api}/deployments/filter", json={}).status_code == 401
    assert httpx.post(f"{api}/deployments/filter", json={}, auth=("regimen", "wrong")).status_code == 401

    async def names(auth: str) -> list[str]:
        async with PrefectClient(api, auth_string=auth) as client:
            return sorted(d.name for d in await client.read_deployments())

    assert asyncio.run(names(AUTH)) == ["nightly", "on-demand"]  # what PREFECT_API_AUTH_STRING gives a client
    with pytest.raises(Exception, match="401"):
        asyncio.run(names("regimen:wrong"))


# -- prefect.yaml: the same deployments for a process work pool ---------------------------------------


def test_prefect_yaml_deploys_the_same_deployments_and_a_worker_runs_them(scenario, tmp_path):
    server = scenario.server
    stop(scenario.serve.proc)  # a served runner would race the worker for the run
    env = server.client_env()
    for cmd in (
        ["work-pool", "create", "regimen", "--type", "process"],
        ["work-pool", "set-concurrency-limit", "regimen", "1"],
        ["--no-prompt", "deploy", "--all"],
    ):
        out = subprocess.run(
            [bin_path("prefect"), *cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, (cmd, out.stdout[-2000:], out.stderr[-2000:])
    deps = server.deployments()
    for name in ("on-demand", "nightly"):
        d = deps[name]
        assert d["work_pool_name"] == "regimen" and d["entrypoint"] == "flows/pipeline/cycle.py:regimen_cycle"
        assert d["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]
        assert (
            d["global_concurrency_limit"]["limit"] == 1 and d["concurrency_options"]["collision_strategy"] == "ENQUEUE"
        )
    [sched] = deps["nightly"]["schedules"]
    assert sched["schedule"]["cron"] == "0 2 * * *" and sched["schedule"]["timezone"] == "UTC"
    # one run through `prefect worker start`, from another folder: the pull step sets the project root
    r = server.create_run(
        "on-demand",
        {"config": "tiny.yaml", "experiment": EXPERIMENT},
        job_variables={"env": {"REGIMEN_CONFIGS": str(ROOT / "tests"), "REGIMEN_STORE": str(scenario.store)}},
    )
    assert r.status_code == 201, r.text
    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen(
            [bin_path("prefect"), "worker", "start", "--pool", "regimen", "--run-once"],
            cwd=tmp_path,
            env=env | {"PREFECT_WORKER_QUERY_SECONDS": "1"},
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        run = server.wait_run(r.json()["id"], timeout=120, logs=[log])
    finally:
        stop(worker)
    assert run["state"]["type"] == "COMPLETED", (run["state"], tail(log))
    assert latest_states(server, run["id"]) == dict.fromkeys(STAGES, "Cached")
