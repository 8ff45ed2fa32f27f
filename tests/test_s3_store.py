"""The store in a real S3 bucket (SeaweedFS through s3fs, `tests/s3_server.py`): versions appear whole or
not at all and never share a number, digests are checked as files come into the local cache, the lease
and the record lock hold across processes, and a bad bucket, bad credentials, an unreachable endpoint or
a bucket that ignores conditional writes are each one line naming the bucket, before anything is written.
End to end: `regimen run` SIGKILLed mid-GRPO on host A resumes on host B (its own HOME, REGIMEN_CACHE and
TMPDIR, so nothing but the bucket in common) from the newest checkpoint A uploaded; a third run while B
trains is refused naming B; the champion is exported from the bucket by a host that never ran anything."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from regimen.stages.core.errors import InputError, StoreError
from regimen.stages.store import ExperimentBusy, Store

pytest.register_assert_rewrite("prefect_ops")
from prefect_ops import ROOT, bin_path, stop, tail  # noqa: E402

pytest_plugins = ["prefect_ops", "s3_server"]


def manifest(stage="sft", key="k1", **extra):
    return {
        "experiment": "exp",
        "stage": stage,
        "fingerprint": key,
        "cycle": 1,
        "inputs": {},
        "config": {},
        "metrics": {"x": 1.0},
        **extra,
    }


def staged(store: Store, text="weights", n=1, stage="sft") -> Path:
    d = store._workspace.staging_dir("exp", stage)
    (d / "model").mkdir()
    for i in range(n):
        (d / "model" / f"w{i}.bin").write_text(f"{text}-{i}" * 50)
    (d / "metrics.json").write_text("{}")
    return d


def test_commit_reuse_and_the_cache_checked_against_the_manifest(s3_env, bucket, tmp_path):
    url = f"s3://{bucket}/regimen"
    store = Store(url, cache_dir=tmp_path / "a")
    m1 = store._catalog.commit(staged(store, "a"), manifest(key="k1"))
    m2 = store._catalog.commit(staged(store, "b"), manifest(key="k2"))
    assert (m1["version"], m2["version"]) == (1, 2)
    fs = s3_env.client()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/regimen/exp/sft")) == ["index.json", "v1", "v2"]
    assert fs.exists(f"{bucket}/regimen/exp/sft/v1/.claim")  # the number stays taken
    # another host (its own cache) finds the version by fingerprint and reads it through its cache
    other = Store(url, cache_dir=tmp_path / "b")
    found, damaged = other._catalog.find_intact("exp", "sft", "k1")
    assert found["version"] == 1 and damaged == []
    local = other.local_path(found)
    assert str(local).startswith(str(tmp_path / "b")) and (local / "model" / "w0.bin").read_text().startswith("a-0")
    assert other.verify(found) == []
    # a damaged cached copy is fetched again, not trusted
    (local / "model" / "w0.bin").write_text("x" * len((local / "model" / "w0.bin").read_text()))
    assert other.check(found) == [] and (other.local_path(found) / "model" / "w0.bin").read_text().startswith("a-0")


def test_a_tampered_object_in_the_bucket_makes_the_version_damaged_on_a_fresh_host(s3_env, bucket, tmp_path):
    url = f"s3://{bucket}/r"
    store = Store(url, cache_dir=tmp_path / "a")
    store._catalog.commit(staged(store, "good"), manifest(key="same"))
    key = f"{bucket}/r/exp/sft/v1/model/w0.bin"
    fs = s3_env.client()
    body = fs.cat_file(key)
    fs.pipe_file(key, b"X" * len(body))  # same size: only the sha256 can tell
    fresh = Store(url, cache_dir=tmp_path / "fresh")
    found, damaged = fresh._catalog.find_intact("exp", "sft", "same")
    assert found is None and damaged[0]["version"] == 1 and "model/w0.bin: sha256 differs" in damaged[0]["problems"][0]
    with pytest.raises(StoreError, match=r"v1 is damaged .*model/w0.bin"):
        fresh.local_path(store.versions("exp", "sft")[0])
    assert not list((tmp_path / "fresh").rglob("w0.bin"))  # nothing damaged left in the cache


def test_a_version_is_visible_whole_or_not_at_all_and_writers_never_share_a_number(s3_env, bucket, tmp_path):
    url = f"s3://{bucket}/r"
    reader = Store(url, cache_dir=tmp_path / "reader")
    seen_incomplete: list[str] = []
    done = threading.Event()

    def watch():
        fs = s3_env.client()
        while not done.is_set():
            for m in reader.scan("exp", "sft")[0]:
                present = {
                    p.rsplit(f"/v{m['version']}/", 1)[-1] for p in fs.find(f"{bucket}/r/exp/sft/v{m['version']}")
                }
                missing = set(m["files"]) - present
                if missing:
                    seen_incomplete.append(f"v{m['version']} without {sorted(missing)[:3]}")

    watcher = threading.Thread(target=watch)
    watcher.start()
    results: list[dict] = []
    try:
        writers = [
            threading.Thread(
                target=lambda i=i: results.append(
                    (s := Store(url, cache_dir=tmp_path / f"w{i}"))._catalog.commit(
                        staged(s, f"w{i}", n=12), manifest(key=f"k{i}")
                    )
                )
            )
            for i in range(3)
        ]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
    finally:
        done.set()
        watcher.join()
    assert sorted(m["version"] for m in results) == [1, 2, 3]
    assert seen_incomplete == []
    assert [m["fingerprint"] for m in reader.versions("exp", "sft")] == [
        m["fingerprint"] for m in sorted(results, key=lambda m: m["version"])
    ]


def test_a_claim_left_by_a_killed_writer_is_never_a_version_and_is_swept_under_the_lease(s3_env, bucket, tmp_path):
    url = f"s3://{bucket}/r"
    fs = s3_env.client()
    fs.pipe_file(f"{bucket}/r/exp/sft/v1/.claim", b"{}")  # a writer killed after claiming and uploading one file
    fs.pipe_file(f"{bucket}/r/exp/sft/v1/model/w0.bin", b"half")
    store = Store(url, cache_dir=tmp_path / "a")
    assert store.versions("exp", "sft") == [] and store._catalog.malformed("exp", "sft") == []
    assert store._catalog.commit(staged(store), manifest())["version"] == 2  # the claimed number is not reused
    with store.lock("exp"):
        pass
    assert not fs.exists(f"{bucket}/r/exp/sft/v1/model/w0.bin") and [
        m["version"] for m in store.versions("exp", "sft")
    ] == [2]


def test_the_lease_refuses_a_second_host_naming_the_holder_and_is_free_after(s3_env, bucket, tmp_path):
    url = f"s3://{bucket}/r"
    a, b = Store(url, cache_dir=tmp_path / "a"), Store(url, cache_dir=tmp_path / "b")
    with a.lock("exp"):
        with pytest.raises(ExperimentBusy, match=r"already being run by another process \(pid \d+ on "):
            with b.lock("exp"):
                pass
    with b.lock("exp"):
        assert s3_env.client().exists(f"{bucket}/r/exp/.lease.json")
    assert not s3_env.client().exists(f"{bucket}/r/exp/.lease.json")


def test_failed_attempts_decisions_and_records_in_the_bucket(s3_env, bucket, tmp_path):
    url = f"s3://{bucket}/r"
    store = Store(url, cache_dir=tmp_path / "a")
    d = staged(store)
    (d / "trajectories.jsonl").write_text('{"step": 1}\n')
    where = store._ledger.record_failure(d, manifest(), "boom")
    store._ledger.record_failure(None, manifest(), "no files")
    assert sorted(f["error"] for f in store._ledger.failures("exp", "sft")) == ["boom", "no files"]
    assert s3_env.client().cat_file(f"{where}/trajectories.jsonl") == b'{"step": 1}\n'
    assert store.versions("exp", "sft") == []
    store._ledger.record_decision("exp", {"eval_version": 3, "verdict": "keep", "cycle": 1})
    assert [(d["eval_version"], d["verdict"]) for d in store._ledger.decisions("exp")] == [(3, "keep")]
    rec = store._ledger.update("exp", "champion.json", lambda cur: {"history": [*(cur or {}).get("history", []), "a"]})
    assert rec["revision"] == 1 and Store(url, cache_dir=tmp_path / "b")._ledger.read("exp", "champion.json")[
        "history"
    ] == ["a"]


WORK = "work"  # a stage's work folder in the store (Trainer checkpoints)

DECIDE = """
import json, os, sys
from regimen.stages.store import StaleRecord, Store
store = Store(sys.argv[1])
for i in range(int(sys.argv[3])):
    while True:  # as a run decides: read, judge on what was read, write only if nobody moved meanwhile
        seen = store._ledger.read("exp", "champion.json") or {}
        try:
            add = lambda cur: {"history": [*(cur or {}).get("history", []), f"{sys.argv[2]}-{i}"]}
            store._ledger.update("exp", "champion.json", add,
                                expect=seen.get("revision", 0))
            break
        except StaleRecord:
            continue
"""


def test_two_processes_deciding_at_once_leave_one_consistent_champion_json(s3_server, bucket, tmp_path):
    """Each decision reads champion.json, decides, and writes it under the record lock (an exclusive-create
    object in the bucket) only if its revision is still the one read (else decides again): two processes,
    each with its own cache, deciding at once lose no line and leave one consistent record."""
    import os

    url, n = f"s3://{bucket}/r", 8
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", DECIDE, url, who, str(n)],
            env={**os.environ, **s3_server.env(), "REGIMEN_CACHE": str(tmp_path / who)},
            stderr=subprocess.PIPE,
            text=True,
        )
        for who in ("night", "person")
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    record = json.loads(s3_server.client().cat_file(f"{bucket}/r/exp/champion.json"))
    assert record["revision"] == 2 * n
    assert sorted(record["history"]) == sorted(f"{who}-{i}" for who in ("night", "person") for i in range(n))
    for who in ("night", "person"):  # each process's own decisions in its order
        assert [h for h in record["history"] if h.startswith(who)] == [f"{who}-{i}" for i in range(n)]
    assert not s3_server.client().exists(f"{bucket}/r/exp/.records.lock")


def test_an_unreadable_record_lock_is_aged_by_its_write_time_and_taken_over_when_expired(
    s3_env, bucket, tmp_path, monkeypatch
):
    """An empty `.records.lock` (what a local store's filelock leaves behind, copied into a bucket; or a lock
    another tool wrote): a writer waits while it is younger than the lock's time to live, then takes it over;
    it never stays locked forever."""
    monkeypatch.setenv("REGIMEN_RECORD_LOCK_TTL_S", "3")
    url = f"s3://{bucket}/r"
    store = Store(url, cache_dir=tmp_path / "a")
    store._ledger.update("exp", "champion.json", lambda cur: {"history": ["a"]})
    s3_env.client().pipe_file(f"{bucket}/r/exp/.records.lock", b"")
    started = time.monotonic()
    rec = store._ledger.update("exp", "champion.json", lambda cur: {"history": [*cur["history"], "b"]})
    waited = time.monotonic() - started
    assert rec["history"] == ["a", "b"] and rec["revision"] == 2
    assert waited > 1.5, waited  # a fresh one was respected: it waited for its age, then took it over
    assert not s3_env.client().exists(f"{bucket}/r/exp/.records.lock")


# -- the bad cases: one line naming the bucket and the endpoint, nothing written -----------------------------


def test_a_missing_bucket_is_named_and_not_created(s3_env, tmp_path):
    with pytest.raises(
        InputError,
        match=r"store s3://no-such-bucket-x/r \(bucket 'no-such-bucket-x' at http://127\.0\.0\.1:\d+\): the bucket "
        r"does not exist",
    ):
        Store("s3://no-such-bucket-x/r", cache_dir=tmp_path)
    assert "no-such-bucket-x" not in s3_env.client().ls("")


def test_refused_credentials_are_named(s3_env, bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(
        InputError,
        match=rf"bucket '{bucket}' at http://127\.0\.0\.1:\d+\): the credentials were refused .*AWS_SECRET_ACCESS_KEY",
    ):
        Store(f"s3://{bucket}/r", cache_dir=tmp_path)
    assert s3_env.client().find(bucket) == []


def test_an_unreachable_endpoint_is_named(s3_env, bucket, tmp_path, monkeypatch):
    from s3_server import _free_port

    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(StoreError, match=rf"at {dead}\): the endpoint cannot be reached .*AWS_ENDPOINT_URL"):
        Store(f"s3://{bucket}/r", cache_dir=tmp_path)
    assert s3_env.client().find(bucket) == []


def test_a_bucket_that_ignores_conditional_writes_is_named_before_training(s3_env, bucket, tmp_path, monkeypatch):
    """A server that accepts `If-None-Match: *` and overwrites anyway (simulated: s3fs's exclusive mode
    turned into a plain write) is refused by the preflight probe, which leaves nothing behind."""
    import s3fs

    from regimen.stages.run.preflight import check_store

    plain_open = s3fs.S3FileSystem.open
    monkeypatch.setattr(
        s3fs.S3FileSystem,
        "open",
        lambda self, path, mode="rb", **kw: plain_open(self, path, mode.replace("x", "w"), **kw),
    )
    with pytest.raises(StoreError, match=rf"bucket '{bucket}' at .*\) does not honour conditional writes"):
        check_store(f"s3://{bucket}/other")
    assert s3_env.client().find(bucket) == []
    monkeypatch.setattr(s3fs.S3FileSystem, "open", plain_open)
    check_store(f"s3://{bucket}/other")  # the real server does


def test_a_lease_whose_process_is_gone_from_this_machine_is_taken_over_at_once_another_machines_is_not(
    s3_env, bucket, tmp_path
):
    import subprocess as sp

    from regimen.stages.store.lock import _machine

    url = f"s3://{bucket}/r"
    fs = s3_env.client()
    dead = sp.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    far_future = 4_000_000_000
    fs.pipe_file(
        f"{bucket}/r/exp/.lease.json",
        json.dumps(
            {
                "owner": f"pid {dead.pid} on this machine",
                "token": "t",
                "expires": far_future,
                "machine": _machine(),
                "pid": dead.pid,
                "pid_started": 1.0,
            }
        ).encode(),
    )
    store = Store(url, cache_dir=tmp_path / "a")
    with store.lock("exp"):  # the crashed run's lease: its process is gone, no waiting for the expiry
        assert json.loads(fs.cat_file(f"{bucket}/r/exp/.lease.json"))["token"] != "t"
    fs.pipe_file(
        f"{bucket}/r/exp/.lease.json",
        json.dumps(
            {
                "owner": "pid 1 on another-host",
                "token": "t",
                "expires": far_future,
                "machine": "another-host:boot:1",
                "pid": dead.pid,
                "pid_started": 1.0,
            }
        ).encode(),
    )
    with pytest.raises(ExperimentBusy, match=r"\(pid 1 on another-host\)"):
        with store.lock("exp"):
            pass


def fake_checkpoint(work: Path, step: int) -> Path:
    from regimen.stages.training.checkpoints import MARKER

    ckpt = work / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(bytes([step % 256]) * 3000)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (ckpt / "sub").mkdir()
    (ckpt / "sub" / "rng.pth").write_bytes(b"r" * step)
    (ckpt / MARKER).write_text(json.dumps({"step": step}))
    return ckpt


def test_checkpoints_go_to_the_bucket_marker_last_pruned_and_come_back_checked_on_a_fresh_host(
    s3_env, bucket, tmp_path
):
    from regimen.stages.store import work as mirror
    from regimen.stages.training.checkpoints import MARKER, complete_checkpoints, fetch_remote

    url = f"s3://{bucket}/r"
    a = Store(url, cache_dir=tmp_path / "host-a")._workspace.work_dir("exp", "grpo", "f" * 64)
    for step in (10, 20, 30):
        assert mirror.push(a, fake_checkpoint(a, step), MARKER, keep=2)
    fs = s3_env.client()
    key = "/".join([bucket, "r", "exp", "grpo", WORK, "f" * 16])
    assert mirror.remote_checkpoints(fs, key, MARKER) == ([20, 30], [])  # save_total_limit 2: checkpoint-10 pruned
    assert json.loads(fs.cat_file(f"{key}/checkpoint-30/{MARKER}"))["files"]["sub/rng.pth"]
    fs.pipe_file(f"{key}/checkpoint-40/model.safetensors", b"torn upload: no marker")  # a host killed mid-upload
    assert mirror.remote_checkpoints(fs, key, MARKER) == ([20, 30], [40])

    # a host that has never seen the run
    b = Store(url, cache_dir=tmp_path / "host-b")._workspace.work_dir("exp", "grpo", "f" * 64)
    assert complete_checkpoints(b) == []
    assert fetch_remote(b) == 30
    assert [s for s, _ in complete_checkpoints(b)] == [30]
    assert (b / "checkpoint-30" / "model.safetensors").read_bytes() == (
        a / "checkpoint-30" / "model.safetensors"
    ).read_bytes()
    assert fetch_remote(b) is None  # nothing newer in the bucket

    fs.pipe_file(f"{key}/checkpoint-30/model.safetensors", b"X" * 3000)  # damaged in the bucket: the one before is used
    c = Store(url, cache_dir=tmp_path / "host-c")._workspace.work_dir("exp", "grpo", "f" * 64)
    assert fetch_remote(c) == 20 and [s for s, _ in complete_checkpoints(c)] == [20]
    assert not list(c.glob(".pull-*"))

    from regimen.stages.store import lost_lease

    lost_lease(url, "exp").set()  # this run lost the experiment's lease: nothing more goes to the bucket
    try:
        assert mirror.push(a, fake_checkpoint(a, 50), MARKER, keep=2) is False
    finally:
        lost_lease(url, "exp").clear()
    assert 50 not in mirror.remote_checkpoints(fs, key, MARKER)[0]

    # the committed stage's work goes
    Store(url, cache_dir=tmp_path / "host-c")._workspace.drop_work("exp", "grpo", "f" * 64)
    assert mirror.remote_checkpoints(fs, key, MARKER) == ([], []) and not c.exists()


# -- end to end: the CLI on two "hosts" (separate HOME, REGIMEN_CACHE, TMPDIR) sharing one bucket -----------

EXP = "s3resume"
MAX_STEPS, SAVE_STEPS = 240, 20


def host(tmp: Path, name: str, prefect_server, s3_server, **extra: str) -> dict[str, str]:
    """A machine of its own as far as Regimen can tell: its home, its cache, its temporary folder."""
    dirs = {k: tmp / name / k for k in ("home", "cache", "tmp", "xdg", "hf")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return prefect_server.client_env(
        HOME=str(dirs["home"]),
        REGIMEN_CACHE=str(dirs["cache"]),
        TMPDIR=str(dirs["tmp"]),
        XDG_CACHE_HOME=str(dirs["xdg"]),
        HF_DATASETS_CACHE=str(dirs["hf"]),
        **s3_server.env(),
        **extra,
    )


def regimen(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as fh:
        return subprocess.Popen(
            [bin_path("regimen"), *args], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )


def run_args(url: str) -> list[str]:
    return [
        "run",
        "tests/tiny.yaml",
        "--store",
        url,
        "--experiment",
        EXP,
        "--set",
        f"grpo.max_steps={MAX_STEPS}",
        "--set",
        f"grpo.save_steps={SAVE_STEPS}",
    ]


def bucket_checkpoints(fs, bucket: str) -> list[int]:
    from regimen.stages.training.checkpoints import MARKER

    return sorted(
        int(re.search(r"checkpoint-(\d+)/", k).group(1))
        for k in fs.glob("/".join([bucket, "r", EXP, "grpo", WORK, "*", "checkpoint-*", MARKER]))
    )


def versions(fs, bucket: str, stage: str) -> dict[str, str]:
    """v<N> -> the sha256 of its manifest, for the versions with one."""
    out = {}
    for key in fs.glob(f"{bucket}/r/{EXP}/{stage}/v*/manifest.json"):
        out[key.split("/")[-2]] = hashlib.sha256(fs.cat_file(key)).hexdigest()
    return out


@pytest.fixture(scope="module")
def two_hosts(prefect_server, s3_server, tmp_path_factory):
    """Host A runs the tiny recipe against the bucket and is SIGKILLed mid-GRPO once a checkpoint has
    reached the bucket; host B (empty cache) reruns it; while B trains GRPO (B paused with SIGSTOP so it
    cannot finish first), host C's run of the same experiment is refused; then B finishes."""
    tmp = tmp_path_factory.mktemp("two-hosts")
    bucket = s3_server.make_bucket()
    url = f"s3://{bucket}/r"
    fs = s3_server.client()
    info: dict = {"tmp": tmp, "bucket": bucket, "url": url}

    a = regimen(run_args(url), host(tmp, "a", prefect_server, s3_server), tmp / "a.log")
    try:
        t0 = time.monotonic()
        while len(bucket_checkpoints(fs, bucket)) < 2:  # two: the resume must take the newest
            assert a.poll() is None, (
                f"host A ended (exit {a.returncode}) before two checkpoints reached the bucket:\n{tail(tmp / 'a.log')}"
            )
            assert time.monotonic() - t0 < 300, "no GRPO checkpoints in the bucket after 300 s"
            time.sleep(0.02)
        os.killpg(a.pid, signal.SIGKILL)
        a.wait(30)
    finally:
        stop(a)
    info["killed_rc"] = a.returncode
    info["in_bucket_at_kill"] = bucket_checkpoints(fs, bucket)
    info["grpo_versions_after_kill"] = versions(fs, bucket, "grpo")
    info["earlier"] = {stage: versions(fs, bucket, stage) for stage in ("sft", "reward-dry-run", "grpo-smoke")}

    env_b = host(tmp, "b", prefect_server, s3_server)
    b = regimen(run_args(url), env_b, tmp / "b.log")
    try:
        # B uploads a checkpoint of its own
        while max(bucket_checkpoints(fs, bucket), default=0) <= info["in_bucket_at_kill"][-1]:
            assert b.poll() is None, (
                f"host B ended (exit {b.returncode}) before it saved a GRPO checkpoint:\n{tail(tmp / 'b.log')}"
            )
            time.sleep(0.02)
        os.killpg(b.pid, signal.SIGSTOP)  # so the refusal below is of a run that is still training, whatever the timing
        try:
            c = regimen(run_args(url), host(tmp, "c", prefect_server, s3_server), tmp / "c.log")
            info["c_rc"] = c.wait(240)
        finally:
            os.killpg(b.pid, signal.SIGCONT)
        info["b_pid"] = b.pid
        info["b_paused_at"] = max(bucket_checkpoints(fs, bucket))
        info["b_rc"] = b.wait(400)
    finally:
        stop(b)
    info["after"] = {stage: versions(fs, bucket, stage) for stage in ("sft", "reward-dry-run", "grpo-smoke")}
    # a bucket key, not a local path
    info["work_left"] = fs.glob("/".join([bucket, "r", EXP, "grpo", "work", "*", "checkpoint-*", "*"]))
    return info


@pytest.mark.slow
def test_killed_on_host_a_resumed_on_host_b_from_the_bucket(two_hosts, s3_env):
    info = two_hosts
    assert info["killed_rc"] == -signal.SIGKILL
    assert info["in_bucket_at_kill"] and info["grpo_versions_after_kill"] == {}  # nothing half-written is a version
    assert info["b_rc"] == 0, tail(info["tmp"] / "b.log")
    # first: SFT, the dry run and the smoke test reused from the bucket, untouched (if SFT ran again, its
    # fingerprint changed between the two runs, e.g. code edited meanwhile, and GRPO's work key with it)
    assert info["after"] == info["earlier"], (
        "host B did not reuse the earlier stages: their fingerprints changed between the runs"
    )
    store = Store(info["url"], cache_dir=info["tmp"] / "reader")
    [grpo] = store.versions(EXP, "grpo")
    # host B's cache was empty: the checkpoint it resumed from came from the bucket, the newest complete one
    assert grpo["resumed_from_step"] == info["in_bucket_at_kill"][-1] > 0
    assert (
        grpo["metrics"]["steps"] == MAX_STEPS and grpo["metrics"]["steps_run"] == MAX_STEPS - grpo["resumed_from_step"]
    )
    assert info["b_paused_at"] < MAX_STEPS  # the third run was refused while B had GRPO steps left
    assert all(store.verify(m) == [] for stage in ("sft", "grpo", "eval") for m in store.versions(EXP, stage))
    assert info["work_left"] == []  # the committed stage's checkpoints left the bucket
    assert store.versions(EXP, "heldout") and store.versions(EXP, "data")  # the data records, in the bucket
    print(
        f"\nhost A killed with GRPO checkpoints {info['in_bucket_at_kill']} of {MAX_STEPS} steps in the bucket; host B "
        f"(empty cache) resumed from {grpo['resumed_from_step']} and trained {grpo['metrics']['steps_run']} steps"
    )


@pytest.mark.slow
def test_a_third_run_while_b_trains_is_refused_at_once_naming_the_holder(two_hosts):
    log = (two_hosts["tmp"] / "c.log").read_text(errors="replace")
    assert two_hosts["c_rc"] == 1, log[-3000:]
    assert re.search(
        rf"experiment '{EXP}' in store {two_hosts['url']} is already being run by another process \(pid "
        rf"{two_hosts['b_pid']} on ",
        log,
    ), log[-3000:]
    assert not re.search(r"\d+/\d+ \[", log)  # no training progress at all: refused before anything ran


@pytest.mark.slow
def test_export_from_the_bucket_on_a_host_that_never_ran_it(two_hosts, prefect_server, s3_server, s3_env):
    tmp = two_hosts["tmp"]
    out = tmp / "exported"
    proc = regimen(
        ["export", EXP, str(out), "--store", two_hosts["url"]],
        host(tmp, "d", prefect_server, s3_server),
        tmp / "export.log",
    )
    assert proc.wait(240) == 0, tail(tmp / "export.log")
    champion = json.loads(s3_server.client().cat_file(f"{two_hosts['bucket']}/r/{EXP}/champion.json"))["champion"]
    ref = champion["policy_ref"]
    [m] = [
        m
        for m in Store(two_hosts["url"], cache_dir=tmp / "reader2").scan(EXP, ref["stage"])[0]
        if m["version"] == ref["version"]
    ]
    assert hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest() == m["files"]["model/model.safetensors"]


BAD = {
    "missing-bucket": (
        lambda s, b: ({}, "s3://no-such-bucket-e2e/r"),
        2,
        r"^error: store s3://no-such-bucket-e2e/r \(bucket 'no-such-bucket-e2e' at http://127\.0\.0\.1:\d+\): the "
        r"bucket does not exist",
    ),
    "wrong-credentials": (
        lambda s, b: ({"AWS_SECRET_ACCESS_KEY": "wrong"}, f"s3://{b}/r"),
        2,
        r"^error: store s3://\S+ \(bucket '\S+' at http://127\.0\.0\.1:\d+\): the credentials were refused",
    ),
    "unreachable-endpoint": (
        lambda s, b: ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, f"s3://{b}/r"),
        1,
        r"^stopped: store s3://\S+ \(bucket '\S+' at http://127\.0\.0\.1:9\): the endpoint cannot be reached",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_bucket_is_one_line_with_its_exit_code_and_nothing_written(case, prefect_server, s3_server, tmp_path):
    bucket = s3_server.make_bucket()
    make, code, pattern = BAD[case]
    extra, url = make(s3_server, bucket)
    env = host(tmp_path, "h", prefect_server, s3_server)
    env.update(extra)
    proc = regimen(["run", "tests/tiny.yaml", "--store", url, "--experiment", EXP], env, tmp_path / "run.log")
    rc = proc.wait(240)
    log = (tmp_path / "run.log").read_text(errors="replace")
    assert rc == code, log[-3000:]
    [line] = [ln for ln in log.splitlines() if ln.startswith(("error:", "stopped:"))]
    assert re.search(pattern, line), line
    assert "Traceback" not in log
    fs = s3_server.client()
    assert fs.find(bucket) == [] and "no-such-bucket-e2e" not in fs.ls("")


STALLED_ROLLBACK = """
import os, signal, sys
from pathlib import Path
from regimen.flows.cli import main
from regimen.flows.pipeline import champion

inside, real = Path(sys.argv[1]), champion.evaluation_of

def stalled(*args, **kwargs):  # called inside the record lock, after the record was read: stop here, as a paused VM
    if not inside.exists():
        inside.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    return real(*args, **kwargs)

champion.evaluation_of = stalled
sys.argv = ["regimen", "rollback", "rec", "--store", sys.argv[2], "--reason", "stalled"]
main()
"""


def test_a_promote_made_while_a_rollback_stalls_in_the_record_lock_stands_and_the_rollback_is_refused_at_the_write(
    s3_server, bucket, tmp_path
):
    """Issue 42: a `rollback` stopped (SIGSTOP) inside the bucket's record lock past its expiry; a person's
    `promote` takes the expired lock and writes its revision; the rollback, resumed, decided on the record it
    read before the promote and is refused at the write itself (its revision's claim exists): it stops
    saying why, writes nothing, and the promote's line stays. No revision number is written twice."""
    from test_records import EXP, build, conclude

    url = f"s3://{bucket}/r"
    env = {**os.environ, **s3_server.env(), "REGIMEN_CACHE": str(tmp_path / "cache"), "REGIMEN_RECORD_LOCK_TTL_S": "2"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        st = build(url)  # grpo v1..v3 evaluated on one frozen set, in the bucket
        conclude(st, 1)
        conclude(st, 2)  # champion v2; a rollback would return to v1
        before = st._ledger.read(EXP, "champion.json")["revision"]
        inside = tmp_path / "inside"
        proc = subprocess.Popen(
            [sys.executable, "-c", STALLED_ROLLBACK, str(inside), url],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while not inside.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(3)  # past the record lock's 2 s: the stalled holder can neither renew nor release it
        promoted = subprocess.run(
            [str(bin_path("regimen")), "promote", EXP, "grpo/v3", "--store", url, "--reason", "v3 is better"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert promoted.returncode == 0, promoted.stderr
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    assert proc.returncode == 1, (out, err)
    assert "refused" in err and f"revision {before + 1}" in err and "nothing of it was written" in err, err
    rec = Store(url, cache_dir=tmp_path / "fresh")._ledger.read(EXP, "champion.json")
    assert rec["revision"] == before + 1 and rec["champion"]["policy"] == "grpo v3"
    assert [(h["event"], h["by"]) for h in rec["history"]][-1] == ("promoted", "person")
    assert not any(h.get("reason") == "stalled" for h in rec["history"])
    claims = s3_server.client().ls(f"{bucket}/r/{EXP}/revisions/champion.json", detail=False)
    numbers = [int(re.search(r"r(\d+)\.json$", c).group(1)) for c in claims]
    assert sorted(numbers) == list(range(1, before + 2))  # one claim per revision, none twice
