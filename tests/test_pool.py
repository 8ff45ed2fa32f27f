"""Several hosts through Prefect, on a Prefect server of this module's own (the pool's deployments take the
names `regimen serve`'s tests rely on): `regimen serve` is the one-host path (a second serve, or a serve
beside the pool's deployments, is refused at once, pointing at the pool); `regimen pool setup` is
idempotent and refuses a store the hosts cannot share; and a worker host SIGKILLed (its whole process tree)
mid-GRPO has its run marked Crashed (HostLost) by Prefect's automation on the missing heartbeats and done
again on the other host, which resumes from the bucket's checkpoint, without anyone acting.

Two "hosts" are two `prefect worker start --pool regimen --limit 1` processes with their own HOME,
PREFECT_HOME, REGIMEN_CACHE, TMPDIR and caches, sharing only the bucket (SeaweedFS) and the Prefect server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytest.register_assert_rewrite("prefect_ops")
from prefect_ops import ROOT, TERMINAL, Server, bin_path, prefect_server_in, start_serve, stop, tail  # noqa: E402

pytest_plugins = ["prefect_ops", "s3_server"]

EXP = "hostlost"
MAX_STEPS, SAVE_STEPS = 240, 20
LEASE_TTL_S = "15"  # the store lease of a lost host expires before its run is rescheduled (after 60 s: two heartbeats)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # the repossessor frees the lease of a serve that died sooner than its default 15 s loop
    with prefect_server_in(
        tmp_path_factory.mktemp("pool-prefect"), PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS="5"
    ) as srv:
        yield srv


def regimen(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as fh:
        return subprocess.Popen(
            [bin_path("regimen"), *args], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )


def second_serve(server: Server, tmp: Path, name: str) -> tuple[int, str, float]:
    log = tmp / f"{name}.log"
    t0 = time.monotonic()
    proc = regimen(
        ["serve", "tests/tiny.yaml", "--configs", "tests", "--store", str(tmp / "store")], server.client_env(), log
    )
    try:
        rc = proc.wait(60)
    finally:
        stop(proc)
    return rc, log.read_text(errors="replace"), time.monotonic() - t0


_STALE_SLOT = """
import time
from prefect import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
from regimen.flows.serving import deploy
from regimen.stages.core.errors import InputError
deploy.STALE_S = 3.0
with get_client(sync_client=True) as c:  # the slot taken, no lease behind it, no deployment polled yet
    c.upsert_global_concurrency_limit_by_name(deploy.SERVE_LIMIT, 1)
    c.update_global_concurrency_limit(deploy.SERVE_LIMIT, GlobalConcurrencyLimitUpdate(active_slots=1))
try:
    deploy.claim_serve()
    print("fresh: admitted")
except InputError:
    print("fresh: refused")
from regimen.flows.serving import pool
try:
    pool.refuse_pool_while_serving()
    print("pool: admitted")
except InputError:
    print("pool: refused")
time.sleep(4)
deploy.release_serve(deploy.claim_serve())
print("stale: admitted")
"""


def test_a_slot_taken_moments_ago_is_a_serve_still_starting_and_one_left_over_is_reset(server):
    # first in this module: no deployment of its server has been polled yet. A serve that has just taken the
    # slot has not polled either: the next serve (and `pool setup`) is refused, not let in beside it; a slot nobody took
    # for STALE_S (3 s here; a server restarted with its leases lost) is reset and taken
    r = subprocess.run(
        [sys.executable, "-c", _STALE_SLOT],
        cwd=ROOT,
        env=server.client_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.split("\n")[:3] == ["fresh: refused", "pool: refused", "stale: admitted"], (
        r.stdout + r.stderr[-2000:]
    )
    assert serve_slot_taken(server) == 0


def serve_slot_taken(server: Server) -> int:
    r = server.post("/v2/concurrency_limits/filter", {})
    return sum(x["active_slots"] for x in r.json() if x["name"] == "regimen-serve")


def stop_cleanly(server: Server, serve) -> None:
    """SIGTERM a serve: it exits 0, says it stopped, and its slot is free at once."""
    rc = stop(serve.proc, signal.SIGTERM)
    out = tail(serve.log)
    assert rc == 0 and "serve stopped" in out and serve_slot_taken(server) == 0, (rc, serve_slot_taken(server), out)


def test_a_second_serve_is_refused_at_once_and_a_stopped_serve_frees_its_place(server, tmp_path):
    first = start_serve(server, tmp_path / "store", tmp_path / "serve.log")
    try:
        rc, out, wall = second_serve(server, tmp_path, "second")
        assert rc == 2, out
        lines = [line for line in out.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: another `regimen serve` is serving"), out
        assert (
            "regimen pool setup --store s3://bucket/prefix" in out
            and "prefect worker start --pool regimen --limit 1" in out
        ), out
        assert first.proc.poll() is None  # the first one serves on, untouched
        print(f"\nsecond serve refused in {wall:.1f} s (process start included)")
    except BaseException:
        stop(first.proc)  # the body's own failure is what the report shows
        raise
    stop_cleanly(server, first)
    # a serve stopped cleanly released its lease: the next one starts at once; one stopped as soon as it has
    # registered too (a SIGTERM while Prefect's runner starts)
    again = start_serve(server, tmp_path / "store", tmp_path / "serve-again.log")
    stop_cleanly(server, again)


@pytest.mark.slow
def test_a_serve_that_died_frees_its_place_when_its_lease_expires(server, tmp_path):
    # the default lease of 60 s (Prefect's least), renewed every 20 s: at least 40 s of it is left when serve
    # dies, time enough for the next serve to start and be refused (about 10 s on a machine busy with other tests)
    dead = start_serve(server, tmp_path / "store", tmp_path / "serve.log")
    polled = dict.fromkeys(dead.registered)
    deadline = time.monotonic() + 60
    while not all(polled.values()) and time.monotonic() < deadline:  # it died serving: its runner polled the
        polled = {name: d["last_polled"] for name, d in server.deployments().items()}  # deployments (a slot taken
        time.sleep(0.2)  # by a serve that never polled them reads as left over from a restarted server)
    assert all(polled.values()), polled
    os.killpg(dead.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    stop(dead.proc)
    rc, out, wall = second_serve(server, tmp_path, "right-after")
    assert rc == 2 and "another `regimen serve`" in out, out  # its lease still holds: refused, not raced
    time.sleep(max(0.0, killed + 72 - time.monotonic()))  # the lease expired; the repossessor runs every 5 s here
    later = start_serve(server, tmp_path / "store", tmp_path / "serve-later.log")
    stop_cleanly(server, later)
    print(
        f"\na serve SIGKILLed: the next one refused {wall:.0f} s after, one started {time.monotonic() - killed:.0f} s "
        f"after"
    )


def test_a_serve_lease_below_prefects_least_is_refused_naming_the_variable(monkeypatch):
    from regimen.flows.serving.deploy import serve_lease_s
    from regimen.stages.core.errors import InputError

    monkeypatch.setenv("REGIMEN_SERVE_LEASE_S", "300")
    assert serve_lease_s() == 300
    for bad in ("30", "inf", "nan", "soon"):
        monkeypatch.setenv("REGIMEN_SERVE_LEASE_S", bad)
        with pytest.raises(InputError, match="REGIMEN_SERVE_LEASE_S=.*>= 60"):
            serve_lease_s()


def test_the_api_lost_while_the_runner_starts_is_waited_out_and_other_failures_are_not():
    """What serve waits out (the server gone) and what it reports (anything else), as Prefect's runner raises
    them. Seen in CI: the server killed while the runner started its event emitter (websockets, not httpx)."""
    import httpx
    from websockets.exceptions import InvalidMessage

    from regimen.flows.serving.deploy import _api_unreachable

    def caused(exc: BaseException, cause: BaseException) -> BaseException:
        exc.__cause__ = cause
        return exc

    lost = [
        httpx.ConnectError("refused"),
        ConnectionRefusedError(111, "refused"),
        caused(
            RuntimeError("Runner failed to start: event_emitter - did not receive a valid HTTP response"),
            InvalidMessage("did not receive a valid HTTP response"),
        ),
        RuntimeError("Service exceeded error threshold"),
        ExceptionGroup("unhandled errors in a TaskGroup", [httpx.ReadError("reset"), OSError(104, "reset")]),
    ]
    for exc in lost:
        assert _api_unreachable(exc), exc
    for exc in (
        ValueError("bad parameter schema"),
        caused(RuntimeError("Runner failed to start: x"), KeyError("flow")),
        ExceptionGroup("mixed", [httpx.ReadError("reset"), TypeError("bug")]),
    ):
        assert not _api_unreachable(exc), exc


def pool_setup(server: Server, url: str, s3_server, log: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    with open(log, "wb") as fh:
        return subprocess.run(
            [
                bin_path("regimen"),
                "pool",
                "setup",
                "--store",
                url,
                "--config",
                "tests/tiny.yaml",
                "--configs",
                "tests",
                *extra,
            ],
            cwd=ROOT,
            env=server.client_env(**s3_server.env(), REGIMEN_LEASE_TTL_S=LEASE_TTL_S, **env),
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=180,
        )


@pytest.fixture(scope="module")
def pool(server, s3_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pool")
    bucket = s3_server.make_bucket()
    url = f"s3://{bucket}/r"
    runs = [pool_setup(server, url, s3_server, tmp / f"setup-{i}.log") for i in (1, 2)]  # twice: idempotent
    for i, r in enumerate(runs, 1):
        assert r.returncode == 0, tail(tmp / f"setup-{i}.log")
    return {"tmp": tmp, "bucket": bucket, "url": url}


def test_pool_setup_is_idempotent_and_deploys_serves_guarded_parameters(server, pool):
    deps = server.deployments()
    assert set(deps) == {"on-demand", "nightly"}
    for d in deps.values():
        assert d["work_pool_name"] == "regimen" and d["entrypoint"] == "regimen.flows.pipeline.cycle.regimen_cycle"
        assert d["enforce_parameter_schema"] and d["parameter_openapi_schema"]["additionalProperties"] is False
        env = d["job_variables"]["env"]
        assert env["REGIMEN_STORE"] == pool["url"] and Path(env["REGIMEN_CONFIGS"]) == ROOT / "tests"
        assert (
            json.loads(env["REGIMEN_UI_LIMITS"])["max_steps"] == 100_000
            and env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"
        )
        assert not any("AWS_" in k for k in env)  # credentials stay on the hosts
        assert d["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]
    assert len(deps["nightly"]["schedules"]) == 1
    automations = server.post("/automations/filter", {}).json()
    names = sorted(a["name"] for a in automations)
    assert names == ["regimen-host-lost", "regimen-host-lost-rerun"]  # once each, after two setups
    crash = next(a for a in automations if a["name"] == "regimen-host-lost")
    # a 30 s heartbeat + the longer of the lease's 15 s and another heartbeat
    assert crash["trigger"]["posture"] == "Proactive" and crash["trigger"]["within"] == 60.0
    r = server.post("/work_pools/filter", {})
    assert [p["type"] for p in r.json() if p["name"] == "regimen"] == ["process"]
    # a UI run still cannot choose the store: the guarded overrides are the flow's own
    assert server.create_run("on-demand", {"config": "tiny.yaml", "nope": 1}).status_code == 409


def test_serve_beside_the_pool_is_refused_pointing_at_it(server, pool, tmp_path):
    rc, out, _ = second_serve(server, tmp_path, "beside")
    assert rc == 2, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert (
        len(lines) == 1
        and "belong to the work pool 'regimen'" in out
        and "prefect worker start --pool regimen --limit 1" in out
    ), out


@pytest.mark.parametrize(
    "url, says",
    [
        ("artifacts", "a folder or memory:// is this host's alone"),
        ("s3://", "no bucket name"),
        ("s3://regimen-no-such-bucket-x/r", "the bucket does not exist"),
    ],
)
def test_a_bad_store_is_one_line(server, s3_server, tmp_path, url, says):
    log = tmp_path / "setup.log"
    assert pool_setup(server, url, s3_server, log).returncode == 2
    out = log.read_text()
    assert len(out.strip().splitlines()) == 1 and says in out, out


# -- a host lost mid-GRPO ------------------------------------------------------------------------------


def host_env(server: Server, s3_server, tmp: Path, name: str) -> dict[str, str]:
    dirs = {k: tmp / name / k for k in ("home", "prefect", "cache", "tmp", "xdg", "hf")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return server.client_env(
        HOME=str(dirs["home"]),
        PREFECT_HOME=str(dirs["prefect"]),
        REGIMEN_CACHE=str(dirs["cache"]),
        TMPDIR=str(dirs["tmp"]),
        XDG_CACHE_HOME=str(dirs["xdg"]),
        HF_DATASETS_CACHE=str(dirs["hf"]),
        REGIMEN_LEASE_TTL_S=LEASE_TTL_S,
        PREFECT_WORKER_QUERY_SECONDS="2",
        PREFECT_WORKER_HEARTBEAT_SECONDS="5",
        **s3_server.env(),
    )


def worker(env: dict, name: str, log: Path) -> subprocess.Popen:
    with open(log, "wb") as fh:
        return subprocess.Popen(
            [bin_path("prefect"), "worker", "start", "--pool", "regimen", "--limit", "1", "--name", name],
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def checkpoints(fs, bucket: str, experiment: str = EXP) -> list[int]:
    from regimen.stages.training.checkpoints import MARKER

    return sorted(
        int(re.search(r"checkpoint-(\d+)/", k).group(1))
        for k in fs.glob("/".join([bucket, "r", experiment, "grpo", "work", "*", "checkpoint-*", MARKER]))
    )


def start_tiny_run(server, experiment: str) -> str:
    """The pool's on-demand deployment run with the tiny recipe, GRPO long enough to be caught mid-way: its id."""
    r = server.create_run(
        "on-demand",
        {
            "config": "tiny.yaml",
            "experiment": experiment,
            "overrides": {"grpo.max_steps": MAX_STEPS, "grpo.save_steps": SAVE_STEPS},
        },
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def states(server: Server, run_id: str) -> list[str]:
    r = server.get("/flow_run_states/", params={"flow_run_id": run_id})
    r.raise_for_status()
    return [s["name"] for s in sorted(r.json(), key=lambda s: s["timestamp"])]


@pytest.fixture(scope="module")
def host_lost(server, s3_server, pool):
    tmp, bucket = pool["tmp"], pool["bucket"]
    fs = s3_server.client()
    hosts = {
        name: worker(host_env(server, s3_server, tmp, name), f"host-{name}", tmp / f"worker-{name}.log")
        for name in ("a", "b")
    }
    logs = [tmp / "worker-a.log", tmp / "worker-b.log"]
    info: dict = {"tmp": tmp}
    try:
        run_id = info["run_id"] = start_tiny_run(server, EXP)
        t0 = time.monotonic()
        while not checkpoints(fs, bucket):  # mid-GRPO, with a checkpoint in the bucket
            run = server.run(run_id)
            assert run["state"]["type"] not in TERMINAL, f"{run['state']}\n" + "\n".join(tail(p) for p in logs)
            assert time.monotonic() - t0 < 400, "no GRPO checkpoint in the bucket after 400 s\n" + "\n".join(
                tail(p) for p in logs
            )
            time.sleep(0.05)
        # the worker with a flow run under it
        lost = next(name for name, proc in hosts.items() if len(tree(proc.pid)) > 1)
        procs = tree(hosts[lost].pid)
        for p in procs:  # the host dies: its worker, the flow run and whatever they started, at once
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        killed_at = time.monotonic()
        info.update(lost=lost, at_kill=checkpoints(fs, bucket), killed=len(procs))
        hosts[lost].wait(30)
        other = "b" if lost == "a" else "a"
        while server.run(run_id)["state"]["type"] != "RUNNING" or "HostLost" not in states(server, run_id):
            assert time.monotonic() - killed_at < 600, (
                f"not running again 600 s after the kill: "
                f"{server.run(run_id)['state']}\n{tail(tmp / f'worker-{other}.log')}"
            )
            time.sleep(0.5)
        info["to_running_again_s"] = time.monotonic() - killed_at
        info["final"] = server.wait_run(run_id, timeout=600, logs=[tmp / f"worker-{other}.log"])
        info["states"] = states(server, run_id)
        info["other"] = other
        info["other_log"] = (tmp / f"worker-{other}.log").read_text(errors="replace")
        info["other_cache"] = list((tmp / other / "cache").rglob("checkpoint-*"))
    finally:
        for proc in hosts.values():
            stop(proc)
    info["url"] = pool["url"]
    info["champion"] = [json.loads(fs.cat_file(k)) for k in fs.glob(f"{bucket}/r/{EXP}/champion.json")]
    return info


@pytest.mark.slow
def test_a_worker_host_killed_mid_grpo_has_its_run_done_on_the_other_host_from_the_bucket(host_lost, s3_env):
    info = host_lost
    assert info["final"]["state"]["type"] == "COMPLETED", info["final"]["state"]
    assert info["states"].count("HostLost") == 1 and info["states"][-1] == "Completed", info["states"]
    # rescheduled by the automation
    assert info["states"][info["states"].index("HostLost") + 1] == "Scheduled", info["states"]
    assert info["run_id"] in info["other_log"]  # the live host ran it
    from regimen.stages.store import Store

    store = Store(info["url"], cache_dir=info["tmp"] / "reader")
    # first: the stages before GRPO reused from the bucket (if SFT ran again, its fingerprint changed between the
    # two hosts' runs, e.g. code edited meanwhile in this tree, and GRPO's work key with it: nothing to resume)
    assert len(store.versions(EXP, "sft")) == 1, (
        "the live host did not reuse the earlier stages: their fingerprints changed between the runs"
    )
    [grpo] = store.versions(EXP, "grpo")
    assert grpo["resumed_from_step"] > 0 and grpo["resumed_from_step"] in info["at_kill"], (
        grpo.get("resumed_from_step"),
        info["at_kill"],
    )
    assert grpo["metrics"]["steps"] == MAX_STEPS
    [champion] = info["champion"]  # decided once
    assert champion["champion"] is not None and len(champion["history"]) == 1, champion["history"]
    assert info["to_running_again_s"] < 600
    print(
        f"\nhost {info['lost']} SIGKILLed ({info['killed']} processes) with GRPO checkpoints {info['at_kill']} in the "
        f"bucket; the run was "
        f"Running again on host {info['other']} {info['to_running_again_s']:.0f} s later and resumed from step "
        f"{grpo['resumed_from_step']}; states: {' > '.join(info['states'])}"
    )


PAUSED = "paused-host"


@pytest.fixture(scope="module")
def host_paused(server, s3_server, pool):
    """Issue 42: a worker host frozen (SIGSTOP, as a paused VM) mid-GRPO past its lease; the automation reschedules
    the run and the other host completes it; then the frozen host wakes up (SIGCONT) and runs to its end."""
    tmp, bucket = pool["tmp"], pool["bucket"]
    fs = s3_server.client()
    hosts = {
        name: worker(host_env(server, s3_server, tmp, f"p{name}"), f"paused-{name}", tmp / f"paused-worker-{name}.log")
        for name in ("a", "b")
    }
    info: dict = {"tmp": tmp}

    try:
        run_id = info["run_id"] = start_tiny_run(server, PAUSED)
        t0 = time.monotonic()
        while not checkpoints(fs, bucket, PAUSED):
            assert server.run(run_id)["state"]["type"] not in TERMINAL, server.run(run_id)["state"]
            assert time.monotonic() - t0 < 400, "no GRPO checkpoint in the bucket after 400 s"
            time.sleep(0.05)
        frozen = next(name for name, proc in hosts.items() if len(tree(proc.pid)) > 1)
        procs = tree(hosts[frozen].pid)
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        other = "b" if frozen == "a" else "a"
        frozen_at = time.monotonic()
        # Crashed (HostLost) is terminal for a moment, until the rerun automation schedules the run again: wait for
        # it to be running again before waiting for its end, as `host_lost` does
        while server.run(run_id)["state"]["type"] != "RUNNING" or "HostLost" not in states(server, run_id):
            assert time.monotonic() - frozen_at < 600, (
                f"not running again 600 s after the freeze: {server.run(run_id)['state']}\n"
                f"{tail(tmp / f'paused-worker-{other}.log')}"
            )
            time.sleep(0.5)
        info["completed"] = server.wait_run(run_id, timeout=900, logs=[tmp / f"paused-worker-{other}.log"])
        info["states_at_completion"] = states(server, run_id)
        for p in procs:
            try:
                p.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass
        flow_procs = [p for p in procs if p.pid != hosts[frozen].pid]
        deadline = time.monotonic() + 600
        while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in flow_procs):
            assert time.monotonic() < deadline, "the woken host's flow run did not end within 600 s"
            time.sleep(1)
        time.sleep(5)  # whatever it would still report reaches the server
        info["final"] = server.run(run_id)
        info["states"] = states(server, run_id)
        info["frozen_log"] = (tmp / f"paused-worker-{frozen}.log").read_text(errors="replace")
    finally:
        for proc in hosts.values():
            stop(proc)
    info["grpo_versions"] = fs.glob(f"{bucket}/r/{PAUSED}/grpo/v*/manifest.json")
    return info


@pytest.mark.slow
def test_a_host_paused_past_its_lease_leaves_the_other_hosts_completed_state_alone(host_paused):
    info = host_paused
    assert info["completed"]["state"]["type"] == "COMPLETED", info["completed"]["state"]
    assert info["final"]["state"]["type"] == "COMPLETED", (info["final"]["state"], info["states"])
    assert info["states"] == info["states_at_completion"], info["states"]  # the woken host wrote no state
    assert "taken over by another host" in info["frozen_log"] or "took the run over" in info["frozen_log"], info[
        "frozen_log"
    ][-3000:]
    assert "RunResult cannot be resolved" not in info["frozen_log"]
    assert len(info["grpo_versions"]) == 1  # the other host's GRPO; the woken one committed nothing
