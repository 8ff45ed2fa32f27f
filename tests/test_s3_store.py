"""The store in a real S3 bucket (SeaweedFS through s3fs, `tests/s3_server.py`): versions appear whole or
not at all and never share a number, digests are checked as files come into the local cache, the lease
and the record lock hold across processes, and a bad bucket, bad credentials, an unreachable endpoint or
a bucket that ignores conditional writes are each one line naming the bucket, before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from regimen.stages.errors import InputError, StoreError
from regimen.stages.store import MANIFEST, ExperimentBusy, Store

pytest_plugins = ["s3_server"]


def manifest(stage="sft", key="k1", **extra):
    return {"experiment": "exp", "stage": stage, "fingerprint": key, "cycle": 1, "inputs": {}, "config": {}, "metrics": {"x": 1.0}, **extra}


def staged(store: Store, text="weights", n=1, stage="sft") -> Path:
    d = store.staging_dir("exp", stage)
    (d / "model").mkdir()
    for i in range(n):
        (d / "model" / f"w{i}.bin").write_text(f"{text}-{i}" * 50)
    (d / "metrics.json").write_text("{}")
    return d


def test_commit_reuse_and_the_cache_checked_against_the_manifest(s3_env, bucket, tmp_path):
    url = f"s3://{bucket}/regimen"
    store = Store(url, cache_dir=tmp_path / "a")
    m1 = store.commit(staged(store, "a"), manifest(key="k1"))
    m2 = store.commit(staged(store, "b"), manifest(key="k2"))
    assert (m1["version"], m2["version"]) == (1, 2)
    fs = s3_env.client()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/regimen/exp/sft")) == ["v1", "v2"]
    assert fs.exists(f"{bucket}/regimen/exp/sft/v1/.claim")  # the number stays taken
    # another host (its own cache) finds the version by fingerprint and reads it through its cache
    other = Store(url, cache_dir=tmp_path / "b")
    found, damaged = other.find_intact("exp", "sft", "k1")
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
    store.commit(staged(store, "good"), manifest(key="same"))
    key = f"{bucket}/r/exp/sft/v1/model/w0.bin"
    fs = s3_env.client()
    body = fs.cat_file(key)
    fs.pipe_file(key, b"X" * len(body))  # same size: only the sha256 can tell
    fresh = Store(url, cache_dir=tmp_path / "fresh")
    found, damaged = fresh.find_intact("exp", "sft", "same")
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
            for m in reader.versions("exp", "sft"):
                present = {p.rsplit("/v%d/" % m["version"], 1)[-1] for p in fs.find(f"{bucket}/r/exp/sft/v{m['version']}")}
                missing = set(m["files"]) - present
                if missing:
                    seen_incomplete.append(f"v{m['version']} without {sorted(missing)[:3]}")

    watcher = threading.Thread(target=watch)
    watcher.start()
    results: list[dict] = []
    try:
        writers = [threading.Thread(target=lambda i=i: results.append(
            (s := Store(url, cache_dir=tmp_path / f"w{i}")).commit(staged(s, f"w{i}", n=12), manifest(key=f"k{i}")))) for i in range(3)]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
    finally:
        done.set()
        watcher.join()
    assert sorted(m["version"] for m in results) == [1, 2, 3]
    assert seen_incomplete == []
    assert [m["fingerprint"] for m in reader.versions("exp", "sft")] == [m["fingerprint"] for m in sorted(results, key=lambda m: m["version"])]


def test_a_claim_left_by_a_killed_writer_is_never_a_version_and_is_swept_under_the_lease(s3_env, bucket, tmp_path):
    url = f"s3://{bucket}/r"
    fs = s3_env.client()
    fs.pipe_file(f"{bucket}/r/exp/sft/v1/.claim", b"{}")  # a writer killed after claiming and uploading one file
    fs.pipe_file(f"{bucket}/r/exp/sft/v1/model/w0.bin", b"half")
    store = Store(url, cache_dir=tmp_path / "a")
    assert store.versions("exp", "sft") == [] and store.malformed("exp", "sft") == []
    assert store.commit(staged(store), manifest())["version"] == 2  # the claimed number is not reused
    with store.lock("exp"):
        pass
    assert not fs.exists(f"{bucket}/r/exp/sft/v1/model/w0.bin") and [m["version"] for m in store.versions("exp", "sft")] == [2]


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
    where = store.record_failure(d, manifest(), "boom")
    store.record_failure(None, manifest(), "no files")
    assert sorted(f["error"] for f in store.failures("exp", "sft")) == ["boom", "no files"]
    assert s3_env.client().cat_file(f"{where}/trajectories.jsonl") == b'{"step": 1}\n'
    assert store.versions("exp", "sft") == []
    store.record_decision("exp", {"eval_version": 3, "verdict": "keep", "cycle": 1})
    assert [(d["eval_version"], d["verdict"]) for d in store.decisions("exp")] == [(3, "keep")]
    rec = store.update_record("exp", "champion.json", lambda cur: {"history": [*(cur or {}).get("history", []), "a"]})
    assert rec["revision"] == 1 and Store(url, cache_dir=tmp_path / "b").read_record("exp", "champion.json")["history"] == ["a"]


DECIDE = """
import json, os, sys
from regimen.stages.store import Store
store = Store(sys.argv[1])
for i in range(int(sys.argv[3])):
    store.update_record("exp", "champion.json", lambda cur: {"history": [*(cur or {}).get("history", []), f"{sys.argv[2]}-{i}"]})
"""


def test_two_processes_deciding_at_once_leave_one_consistent_champion_json(s3_server, bucket, tmp_path):
    """Each decision is a read-decide-write of champion.json under the record lock (an exclusive-create
    object in the bucket): two processes, each with its own cache, writing at once lose no line."""
    import os

    url, n = f"s3://{bucket}/r", 8
    procs = [subprocess.Popen([sys.executable, "-c", DECIDE, url, who, str(n)], env={**os.environ, **s3_server.env(), "REGIMEN_CACHE": str(tmp_path / who)},
                              stderr=subprocess.PIPE, text=True) for who in ("night", "person")]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    record = json.loads(s3_server.client().cat_file(f"{bucket}/r/exp/champion.json"))
    assert record["revision"] == 2 * n
    assert sorted(record["history"]) == sorted(f"{who}-{i}" for who in ("night", "person") for i in range(n))
    for who in ("night", "person"):  # each process's own decisions in its order
        assert [h for h in record["history"] if h.startswith(who)] == [f"{who}-{i}" for i in range(n)]
    assert not s3_server.client().exists(f"{bucket}/r/exp/.records.lock")


# -- the bad cases: one line naming the bucket and the endpoint, nothing written -----------------------------

def test_a_missing_bucket_is_named_and_not_created(s3_env, tmp_path):
    with pytest.raises(InputError, match=r"store s3://no-such-bucket-x/r \(bucket 'no-such-bucket-x' at http://127\.0\.0\.1:\d+\): the bucket does not exist"):
        Store("s3://no-such-bucket-x/r", cache_dir=tmp_path)
    assert "no-such-bucket-x" not in s3_env.client().ls("")


def test_refused_credentials_are_named(s3_env, bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(InputError, match=rf"bucket '{bucket}' at http://127\.0\.0\.1:\d+\): the credentials were refused .*AWS_SECRET_ACCESS_KEY"):
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

    from regimen.stages.preflight import check_store

    plain_open = s3fs.S3FileSystem.open
    monkeypatch.setattr(s3fs.S3FileSystem, "open", lambda self, path, mode="rb", **kw: plain_open(self, path, mode.replace("x", "w"), **kw))
    with pytest.raises(StoreError, match=rf"bucket '{bucket}' at .*\) does not honour conditional writes"):
        check_store(f"s3://{bucket}/other")
    assert s3_env.client().find(bucket) == []
    monkeypatch.setattr(s3fs.S3FileSystem, "open", plain_open)
    check_store(f"s3://{bucket}/other")  # the real server does


def test_a_lease_whose_process_is_gone_from_this_machine_is_taken_over_at_once_another_machines_is_not(s3_env, bucket, tmp_path):
    import subprocess as sp

    from regimen.stages.store.lock import _machine

    url = f"s3://{bucket}/r"
    fs = s3_env.client()
    dead = sp.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    far_future = 4_000_000_000
    fs.pipe_file(f"{bucket}/r/exp/.lease.json", json.dumps({"owner": f"pid {dead.pid} on this machine", "token": "t", "expires": far_future,
                                                           "machine": _machine(), "pid": dead.pid, "pid_started": 1.0}).encode())
    store = Store(url, cache_dir=tmp_path / "a")
    with store.lock("exp"):  # the crashed run's lease: its process is gone, no waiting for the expiry
        assert json.loads(fs.cat_file(f"{bucket}/r/exp/.lease.json"))["token"] != "t"
    fs.pipe_file(f"{bucket}/r/exp/.lease.json", json.dumps({"owner": "pid 1 on another-host", "token": "t", "expires": far_future,
                                                           "machine": "another-host:boot:1", "pid": dead.pid, "pid_started": 1.0}).encode())
    with pytest.raises(ExperimentBusy, match=r"\(pid 1 on another-host\)"):
        with store.lock("exp"):
            pass
