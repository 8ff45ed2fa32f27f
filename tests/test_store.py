"""The artifact store: versions appear whole or not at all, are never overwritten, carry digests,
are reused by fingerprint; failed attempts are kept beside them; one run per experiment."""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from regimen.stages.core.errors import InputError, StoreError
from regimen.stages.core.fingerprint import digest as fingerprint
from regimen.stages.store import MANIFEST, ExperimentBusy, Store, sha256_file


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


def stage_files(store: Store, text="weights") -> Path:
    d = store._workspace.staging_dir("exp", "sft")
    (d / "model").mkdir()
    (d / "model" / "w.bin").write_text(text)
    (d / "metrics.json").write_text("{}")
    return d


def test_commit_writes_version_with_digests(tmp_path):
    store = Store(tmp_path)
    m = store._catalog.commit(stage_files(store), manifest())
    vdir = tmp_path / "exp" / "sft" / "v1"
    assert m["version"] == 1 and m["status"] == "completed"
    on_disk = json.loads((vdir / MANIFEST).read_text())
    assert on_disk["files"]["model/w.bin"] == sha256_file(vdir / "model" / "w.bin")
    assert set(on_disk["files"]) == {"model/w.bin", "metrics.json"}
    assert store.verify(on_disk) == []
    assert not list((tmp_path / "exp" / "sft").glob(".staging-*"))


def test_versions_are_never_overwritten_and_count_up(tmp_path):
    store = Store(tmp_path)
    store._catalog.commit(stage_files(store, "a"), manifest(key="k1"))
    m2 = store._catalog.commit(stage_files(store, "b"), manifest(key="k2"))
    assert m2["version"] == 2
    assert (tmp_path / "exp/sft/v1/model/w.bin").read_text() == "a"
    assert [m["version"] for m in store.versions("exp", "sft")] == [1, 2]


def test_find_reuses_by_fingerprint_and_ignores_damaged_versions(tmp_path):
    store = Store(tmp_path)
    store._catalog.commit(stage_files(store), manifest(key="same"))
    assert store._catalog.find("exp", "sft", "same")["version"] == 1
    assert store._catalog.find("exp", "sft", "other") is None
    os.remove(tmp_path / "exp/sft/v1/model/w.bin")
    assert store._catalog.find("exp", "sft", "same") is None


def test_tampered_file_is_detected(tmp_path):
    store = Store(tmp_path)
    m = store._catalog.commit(stage_files(store), manifest())
    (tmp_path / "exp/sft/v1/model/w.bin").write_text("tampered")
    assert store.verify(m) == ["model/w.bin"]


def test_half_written_staging_is_not_a_version(tmp_path):
    store = Store(tmp_path)
    stage_files(store)  # a crash before commit leaves only a staging folder
    (tmp_path / "exp/sft/v7").mkdir()  # and a folder without a manifest is not a version either
    assert store.versions("exp", "sft") == []
    assert store._catalog.find("exp", "sft", "k1") is None


def test_failed_attempt_is_recorded_beside_versions_not_as_one(tmp_path):
    store = Store(tmp_path)
    d = stage_files(store)
    store._ledger.record_failure(d, manifest(), "boom")
    assert store.versions("exp", "sft") == []
    [fail] = store._ledger.failures("exp", "sft")
    assert fail["error"] == "boom" and fail["status"] == "failed"
    assert store._catalog.next_version("exp", "sft") == 1


def test_lock_refuses_a_second_run_of_the_same_experiment(tmp_path):
    store = Store(tmp_path)
    with store.lock("exp"):
        with pytest.raises(ExperimentBusy, match="already being run"):
            with Store(tmp_path).lock("exp"):
                pass
        with Store(tmp_path).lock("other"):  # a different experiment is fine
            pass
    with store.lock("exp"):
        pass


def test_fingerprint_is_order_independent():
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


def test_fsspec_memory_store_keeps_the_same_contract(tmp_path):
    store = Store("memory://regimen-test", cache_dir=tmp_path / "cache")
    m = store._catalog.commit(stage_files(store, "remote"), manifest(key="r"))
    assert m["version"] == 1
    assert store.fs.exists("/regimen-test/exp/sft/v1/manifest.json")
    assert store._catalog.find("exp", "sft", "r")["files"] == m["files"]
    assert store.verify(m) == []
    local = store.local_path(m)
    assert (local / "model" / "w.bin").read_text() == "remote"
    assert {
        p.relative_to(local).as_posix(): sha256_file(p) for p in local.rglob("*") if p.is_file() and p.name != MANIFEST
    } == m["files"]
    store._ledger.record_failure(stage_files(store), manifest(key="f"), "nope")
    assert store._ledger.failures("exp", "sft")[0]["error"] == "nope"
    m2 = store._catalog.commit(stage_files(store, "two"), manifest(key="r2"))
    assert m2["version"] == 2 and [v["version"] for v in store.versions("exp", "sft")] == [1, 2]


def test_a_remote_commit_never_reuses_a_claimed_number_and_a_claim_without_manifest_is_swept(tmp_path):
    """Any fsspec store (memory:// here; a real S3 server in test_s3_store.py): a version number is claimed
    by exclusive create and stays taken; a folder claimed by a killed writer is not a version, is skipped
    by the next commit, and is removed under the experiment's lease."""
    url = "memory://regimen-claims"
    store = Store(url, cache_dir=tmp_path / "cache")
    with store.fs.open("/regimen-claims/exp/sft/v1/.claim", "xb") as fh:  # a writer killed after claiming v1
        fh.write(b"{}")
    store.fs.pipe_file("/regimen-claims/exp/sft/v1/model/w.bin", b"half")
    assert store.versions("exp", "sft") == [] and store._catalog.malformed("exp", "sft") == []
    m = store._catalog.commit(stage_files(store, "whole"), manifest(key="k"))
    assert m["version"] == 2 and store.fs.exists("/regimen-claims/exp/sft/v2/.claim")
    with store.lock("exp"):
        assert not store.fs.exists("/regimen-claims/exp/sft/v1/model/w.bin")
    assert [v["version"] for v in store.versions("exp", "sft")] == [2]
    assert (store.local_path(m) / "model" / "w.bin").read_text() == "whole"


def test_taking_the_lock_sweeps_staging_left_by_a_killed_run(tmp_path):
    store = Store(tmp_path)
    left = stage_files(store)  # a run killed before commit
    with store.lock("exp"):
        assert not left.exists()
    assert store.versions("exp", "sft") == []


def test_latest_policy_skips_evaluations_that_suspected_hacking(tmp_path):
    from regimen.stages.training.policy import latest_policy

    store = Store(tmp_path)
    good = store._catalog.commit(stage_files(store, "good"), manifest(stage="sft", key="g1"))
    for key, verdict in (("g1", "back-to-sft"), ("g2", "reward-hacking-suspected")):
        d = store._workspace.staging_dir("exp", "grpo")
        (d / "model").mkdir()
        (d / "model" / "w.bin").write_text(key)
        store._catalog.commit(d, manifest(stage="grpo", key=key))
        e = store._workspace.staging_dir("exp", "eval")
        (e / "metrics.json").write_text("{}")
        ev = store._catalog.commit(
            e, manifest(stage="eval", key="e" + key, inputs={"policy": {"stage": "grpo", "fingerprint": key}})
        )
        store._ledger.record_decision("exp", {"eval_version": ev["version"], "verdict": verdict})
    assert good["version"] == 1
    assert latest_policy(store, "exp", "eval", ("grpo",))["fingerprint"] == "g1"


def test_truncated_file_makes_a_version_damaged_and_not_reused(tmp_path):
    store = Store(tmp_path)
    m = store._catalog.commit(stage_files(store, "weights" * 100), manifest(key="same"))
    assert store.check(m) == []
    with open(tmp_path / "exp/sft/v1/model/w.bin", "r+b") as fh:
        fh.truncate(10)
    found, damaged = store._catalog.find_intact("exp", "sft", "same")
    assert found is None
    assert damaged[0]["version"] == 1 and "model/w.bin" in damaged[0]["problems"][0]


def test_same_size_change_is_caught_by_the_full_hash_when_mtime_moved(tmp_path):
    store = Store(tmp_path)
    m = store._catalog.commit(stage_files(store, "aaaa"), manifest(key="same"))
    path = tmp_path / "exp/sft/v1/model/w.bin"
    before = path.stat()
    path.write_text("bbbb")  # same size, new mtime (moved by a second, for filesystems with coarse timestamps)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    assert store.check(m) == ["model/w.bin: sha256 differs from the manifest"]
    path.write_text("aaaa")  # content restored: the full hash says intact again
    assert store.check(m) == []


def test_malformed_manifest_is_reported_not_a_crash(tmp_path):
    """Lookups read the index, not every manifest: a manifest damaged after its commit is found when its version
    is read (reuse reads it), reported as damaged, never reused, and the index rebuilt without it."""
    store = Store(tmp_path)
    store._catalog.commit(stage_files(store), manifest(key="k"))
    (tmp_path / "exp/sft/v1" / MANIFEST).write_text('{"status": "completed"}')
    found, damaged = store._catalog.find_intact("exp", "sft", "k")
    assert found is None and damaged == [{"version": 1, "problems": ["manifest.json: missing or damaged"]}]
    assert store.versions("exp", "sft") == []  # the index rebuilt from the manifests
    assert store._catalog.malformed("exp", "sft") == [str(tmp_path / "exp/sft/v1" / MANIFEST)]
    (tmp_path / "exp/sft/v1" / MANIFEST).write_text("not json")
    assert store._catalog.index.rebuild("exp", "sft")["versions"] == {} and store._catalog.malformed("exp", "sft")


def test_a_planted_symlink_in_the_store_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "victim.txt"
    target.write_text("precious")
    store = Store(tmp_path / "store")
    store._workspace.stage_dir("exp", "sft")
    (tmp_path / "store/exp/sft/running.json").symlink_to(target)
    with pytest.raises(StoreError, match="symbolic link"):
        with store._workspace.running("exp", "sft", {"x": 1}):
            pass
    assert target.read_text() == "precious"
    # a linked stage folder is refused before anything is written through it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "store/exp/grpo").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(StoreError, match="symbolic link"):
        store._workspace.staging_dir("exp", "grpo")
    assert list(elsewhere.iterdir()) == []
    # the lock's owner file
    (tmp_path / "store/exp/.lock.owner").symlink_to(target)
    with pytest.raises(StoreError, match="symbolic link"):
        with store.lock("exp"):
            pass
    assert target.read_text() == "precious"


def test_experiment_names_are_checked(tmp_path):
    store = Store(tmp_path)
    for bad in ("../escape", "a" * 300, "", "-x", "a/b"):
        with pytest.raises(InputError, match="experiment"):
            store.versions(bad, "sft")


def test_the_lock_holds_across_machines_on_a_shared_store(tmp_path):
    url = "memory://regimen-lease"
    one, two = Store(url, cache_dir=tmp_path / "machine1"), Store(url, cache_dir=tmp_path / "machine2")
    with one.lock("exp"):
        with pytest.raises(ExperimentBusy, match="already being run"):
            with two.lock("exp"):
                pass
    with two.lock("exp"):  # released: the other machine may run it now
        pass


def test_an_expired_lease_of_a_crashed_holder_is_taken_over(tmp_path):
    import json as _json
    import time as _time

    url = "memory://regimen-lease-expired"
    store = Store(url, cache_dir=tmp_path / "m1")
    store.fs.pipe_file(
        store.join("exp", ".lease.json"),
        _json.dumps({"owner": "pid 1 on crashed", "token": "x", "expires": _time.time() - 1}).encode(),
    )
    with store.lock("exp"):
        assert _json.loads(store.fs.cat_file(store.join("exp", ".lease.json")))["token"] != "x"
    store.fs.pipe_file(
        store.join("exp", ".lease.json"),
        _json.dumps({"owner": "pid 2 on alive", "token": "y", "expires": _time.time() + 60}).encode(),
    )
    with pytest.raises(ExperimentBusy, match="pid 2 on alive"):
        with Store(url, cache_dir=tmp_path / "m2").lock("exp"):
            pass


def test_a_run_that_lost_its_lease_never_commits(tmp_path):
    import json as _json
    import time as _time

    from regimen.stages.store import lost_lease
    from regimen.stages.store.lock import lease

    url = "memory://regimen-lease-lost"
    store = Store(url, cache_dir=tmp_path / "m1")
    path = store.join("exp", ".lease.json")
    with lease(store.fs, path, experiment="exp", url=url, ttl_s=0.3, lost=lost_lease(url, "exp")):
        store.fs.pipe_file(
            path, _json.dumps({"owner": "another machine", "token": "theirs", "expires": _time.time() + 60}).encode()
        )
        deadline = _time.time() + 5
        while not lost_lease(url, "exp").is_set() and _time.time() < deadline:
            _time.sleep(0.05)
        with pytest.raises(StoreError, match="lost the experiment's lease"):
            store._catalog.commit(stage_files(store), manifest())
    assert store.versions("exp", "sft") == []


def test_a_consumer_is_reused_only_for_the_weights_it_consumed(tmp_path):
    """Two versions with one fingerprint (a stage rerun after its version was damaged) whose weights
    differ give their consumers different fingerprints; identical weights give the same one."""
    from conftest import TINY

    from regimen.stages.recipe import load_recipe
    from regimen.stages.run.runner import StageResult, stage_key

    store = Store(tmp_path)
    refs = []
    for text in ("weights-a", "weights-b", "weights-a"):
        m = store._catalog.commit(stage_files(store, text), manifest(key="same-fingerprint"))
        refs.append(StageResult(m, False, 0.0, store.local_path(m)).ref)
    assert (
        len({r["fingerprint"] for r in refs}) == 1
        and refs[0]["content"] != refs[1]["content"]
        and refs[0]["content"] == refs[2]["content"]
    )
    recipe = load_recipe(TINY, {"store": str(tmp_path)})
    keys = [stage_key("eval", recipe, {"policy": r})[0] for r in refs]
    assert keys[0] != keys[1] and keys[0] == keys[2]


def test_latest_policy_takes_the_intact_version_with_the_weights_that_were_evaluated(tmp_path):
    from regimen.stages.run.runner import StageResult
    from regimen.stages.training.policy import latest_policy

    store = Store(tmp_path)
    versions = []
    for _ in range(2):  # the same weights committed twice under one fingerprint (v1 later damaged, v2 its rerun)
        d = store._workspace.staging_dir("exp", "grpo")
        (d / "model").mkdir()
        (d / "model" / "w.bin").write_text("weights")
        versions.append(store._catalog.commit(d, manifest(stage="grpo", key="g")))
    ref = StageResult(versions[0], False, 0.0, store.local_path(versions[0])).ref
    e = store._workspace.staging_dir("exp", "eval")
    (e / "metrics.json").write_text("{}")
    ev = store._catalog.commit(e, manifest(stage="eval", key="e", inputs={"policy": ref}))
    store._ledger.record_decision("exp", {"eval_version": ev["version"], "verdict": "back-to-sft"})
    (store.local_path(versions[0]) / "model" / "w.bin").write_text("damaged")
    found = latest_policy(store, "exp", "eval", ("grpo",))
    assert found["version"] == 2 and found["content"] == ref["content"]


def test_a_checkpoint_upload_is_retried_with_backoff_and_a_later_one_catches_the_store_up(
    tmp_path, monkeypatch, caplog
):
    """Issue 42: the bucket refuses uploads for a while: each checkpoint is tried three times (1 s, 2 s apart), a
    checkpoint that never got there is said, and the next one that does says the store caught up."""
    import logging

    from regimen.stages.store import work as mirror
    from regimen.stages.training import checkpoints

    calls: list[str] = []
    failing = {"left": 5}

    def push(work, ckpt, marker, keep):
        calls.append(ckpt.name)
        if failing["left"] > 0:
            failing["left"] -= 1
            raise OSError("503 Slow Down")
        return True

    monkeypatch.setattr(mirror, "push", push)
    slept: list[float] = []
    with caplog.at_level(logging.WARNING, logger="regimen.training"):
        checkpoints._push(tmp_path, tmp_path / "checkpoint-10", 2, pause=slept.append)  # 3 tries, all refused
        checkpoints._push(tmp_path, tmp_path / "checkpoint-20", 2, pause=slept.append)  # refused twice, then in
    assert calls == ["checkpoint-10"] * 3 + ["checkpoint-20"] * 3 and slept == [1, 2, 1, 2]
    text = caplog.text
    assert "could not upload checkpoint-10 to the store after 3 tries" in text
    assert "the store caught up: checkpoint-20 is there (the upload of checkpoint-10 had failed)" in text


def test_a_commit_the_store_refuses_records_the_attempt_and_says_what_it_left(tmp_path, monkeypatch):
    """A store that refuses the commit (a bucket down, full, or its key revoked): the stop keeps the attempt (here
    in the store's failed attempts), says the stage had finished and what it left, and no version appears."""
    from regimen.stages.core.errors import StoreError
    from regimen.stages.run import runner

    store = Store(tmp_path / "store")
    handle = store.stage("exp", "sft")
    staging = stage_files(store)

    def refuse(staging, manifest, **_):
        raise StoreError("s3://bucket/r: the credentials were refused while uploading (InvalidAccessKeyId)")

    monkeypatch.setattr(handle._catalog, "commit", refuse)
    dirs = SimpleNamespace(out=staging, checkpoints=tmp_path / "work")
    with pytest.raises(StoreError) as info:
        runner._commit(handle, dirs, {**manifest(key="k"), "started_at": "now"})
    message = str(info.value)
    assert "credentials were refused" in message and "the stage had finished" in message and "left nothing" in message
    [failed] = store._ledger.failures("exp", "sft")
    assert failed["error"].startswith("commit refused:") and store.versions("exp", "sft") == []


def test_an_attempt_the_store_could_not_take_is_recorded_there_when_it_answers_again(tmp_path, monkeypatch):
    from regimen.stages.run import runner

    monkeypatch.setenv("REGIMEN_CACHE", str(tmp_path / "cache"))
    kept = runner._record_elsewhere({"experiment": "exp", "stage": "sft", "fingerprint": "k"}, "the bucket was down")
    runner._record_elsewhere({"experiment": "exp-2", "stage": "sft", "fingerprint": "k"}, "another experiment's")
    store = Store(tmp_path / "store")
    with store.lock("exp"):
        pass
    [failed] = store._ledger.failures("exp", "sft")
    assert failed["error"] == "the bucket was down" and failed["recorded_late"] is True
    assert not Path(kept).exists() and len(list((tmp_path / "cache" / "unrecorded").glob("*.json"))) == 1


def test_a_revision_created_between_a_readers_miss_and_its_next_look_is_not_called_damaged(tmp_path, monkeypatch):
    """A reader rolling champion.json forward asks for the next revision; another process claims it just after
    that read missed. The reader must see the record as it was (the other writer's revision is for its next
    read), not a damaged revision: found in the bucket by two processes deciding at once (test_s3_store's
    two-process test), where the miss and an existence check were two requests."""
    from regimen.stages.store import backend, ledger

    store = Store(tmp_path)
    store._ledger.update("exp", "champion.json", lambda cur: {"history": ["a"]})
    nxt = store._ledger.revision_path("exp", "champion.json", 2)
    real = backend.files.read_text

    def read_then_another_claims(root, path, *a, **k):
        try:
            return real(root, path, *a, **k)
        except FileNotFoundError:
            if str(path) == nxt and not os.path.lexists(nxt):  # the other writer claims revision 2 right now
                before = {"history": ["a"], "revision": 1}
                Path(nxt).write_text(json.dumps(ledger._delta(before, {"history": ["a", "b"], "revision": 2})))
            raise

    monkeypatch.setattr(backend.files, "read_text", read_then_another_claims)
    record = store._ledger.read("exp", "champion.json")
    assert record["revision"] == 1 and record["history"] == ["a"]
    monkeypatch.setattr(backend.files, "read_text", real)
    assert store._ledger.read("exp", "champion.json")["history"] == ["a", "b"]  # the next read rolls it forward
