"""The operator's boundary, tried as an unlucky operator and an attacker would, on real tiny runs:
ceilings on a run (steps, checkpoints, disk), links the store did not make (in a work folder, in the
base-model cache), a base model whose files changed, Ctrl-C and SIGTERM while a run waits for the
machine's compute slot, manifests and running markers of the wrong shape, a store made read-only in the
middle of GRPO, a reward that goes bad after the preflight, and a full disk while the base model is built.
Each gives one line naming what is wrong, the right exit code, and a store that stays intact."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY, run_cli
from test_faults import _mount_tmpfs, _wait_for, intact

REGIMEN = str(Path(sys.executable).parent / "regimen")
EXP = "tiny-test"


def _run(store: Path, *more: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [REGIMEN, "run", str(TINY), "--store", str(store), *more],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        timeout=timeout,
    )


def _last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


# -- the operator's ceilings -------------------------------------------------------------------------


def test_a_checkpoint_ceiling_caps_what_the_trainer_keeps(tmp_path):
    from regimen.stages.recipe import load_recipe
    from regimen.stages.recipe.trl import for_stage

    capped = load_recipe(TINY, {"limits.max_checkpoints": 3})
    assert for_stage(capped, "grpo", tmp_path).save_total_limit == 3  # unset in the recipe: the ceiling
    assert (
        for_stage(
            load_recipe(TINY, {"limits.max_checkpoints": 3, "grpo.save_total_limit": 2}), "grpo", tmp_path
        ).save_total_limit
        == 2
    )
    from regimen.stages.recipe.trl import DEFAULT_CHECKPOINTS

    assert for_stage(load_recipe(TINY, {}), "grpo", tmp_path).save_total_limit == DEFAULT_CHECKPOINTS  # as serve
    # the ceiling never enters a fingerprint: it refuses or stops a run, it never changes what it computes
    from regimen.stages.run.runner import stage_key

    policy = {"policy": {"stage": "base", "model": "m", "fingerprint": "f"}}
    assert stage_key("grpo", capped, policy)[0] == stage_key("grpo", load_recipe(TINY, {}), policy)[0]


@pytest.mark.slow
def test_a_disk_ceiling_stops_training_at_a_save_with_the_limit_named(tmp_path, capsys):
    store = tmp_path / "store"
    r = _run(store, "--set", "limits.max_disk_gb=0.0001")  # 100 kB: the first SFT checkpoint passes it
    assert r.returncode == 1, r.stderr
    assert "limits.max_disk_gb" in r.stderr and "sft" in _last_line(r.stderr) and "Traceback" not in r.stderr, r.stderr
    rc, out, _ = run_cli(["status", EXP, "--store", str(store)], capsys)
    assert rc == 0 and "limits.max_disk_gb" in out
    intact(store)


# -- links the store did not make -------------------------------------------------------------------


@pytest.mark.slow
def test_links_planted_in_a_work_folder_or_the_base_model_cache_are_refused(tmp_path, capsys):
    store = tmp_path / "store"
    r = _run(store, env={"REGIMEN_FAULT": "grpo@3"})  # fails in GRPO after its checkpoint at step 2
    assert r.returncode == 1 and "injected fault" in r.stderr, r.stderr
    work = next((store / EXP / "grpo" / "work").iterdir())
    assert (work / "checkpoint-2").is_dir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (work / "checkpoint-4").symlink_to(elsewhere)  # the Trainer would write its next checkpoint through it
    r = _run(store)
    assert r.returncode == 1, r.stderr
    assert f"{work / 'checkpoint-4'} is a symbolic link inside the store" in r.stderr and "Traceback" not in r.stderr, (
        r.stderr
    )
    assert list(elsewhere.iterdir()) == []
    (work / "checkpoint-4").unlink()

    # the base model: a link in place of the cached folder (another model, same fingerprint) is refused
    base = next((store / "_base").glob("tiny-*"))
    other = tmp_path / "other-model"
    shutil.copytree(base, other)
    moved = tmp_path / "moved"
    base.rename(moved)
    base.symlink_to(other)
    r = _run(store)
    assert (
        r.returncode == 1 and f"{base} is a symbolic link inside the store" in r.stderr and "Traceback" not in r.stderr
    ), r.stderr
    base.unlink()
    moved.rename(base)

    # ... and so are its files changed in place (new weights of the same shape)
    weights = base / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)
    weights.write_bytes(bytes(data))
    r = _run(store)
    assert (
        r.returncode == 1 and "do not match the digest recorded when it was built" in r.stderr and str(base) in r.stderr
    ), r.stderr
    shutil.rmtree(base)  # as the message says: removed, it is rebuilt, and the run finishes from its checkpoint
    r = _run(store)
    assert r.returncode == 0, r.stderr
    intact(store)


# -- signals while waiting for the compute slot --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_an_interruption_while_waiting_for_the_slot_says_so(sig, code, word, tmp_path, capsys):
    from filelock import FileLock

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "machine-slot.owner").write_text("another experiment/grpo (pid 1)")
    held = FileLock(str(cache / "machine-slot.lock"))
    held.acquire()
    store = tmp_path / "store"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "REGIMEN_CACHE": str(cache)}
    env.pop("REGIMEN_MACHINE_SLOTS", None)
    proc = subprocess.Popen(
        [REGIMEN, "run", str(TINY), "--store", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any("waiting for this machine's compute slot" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        reader.join(10)
    finally:
        held.release()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = "".join(lines)
    assert proc.returncode == code, err
    assert (
        "interrupted while waiting for this machine's compute slot" in err and word in err and "Traceback" not in err
    ), err
    rc, out, _ = run_cli(["status", EXP, "--store", str(store)], capsys)
    assert rc == 0 and "interrupted" in out and "while waiting" in out, out


# -- files of the wrong shape --------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("finished") / "store"
    r = _run(store)
    assert r.returncode == 0, r.stderr
    return store


BAD_SHAPES = [
    {"file_stats": ["a", "list"]},
    {"files": {"model/x": 3}},
    {"version": 1e400},
    {"metrics": "none"},
    {"inputs": []},
]


def _damage(finished: Path, tmp_path: Path, bad: dict) -> tuple[Path, str]:
    store = tmp_path / "store"
    shutil.copytree(finished, store, symlinks=True)
    manifest = store / EXP / "eval" / "v1" / "manifest.json"
    data = json.loads(manifest.read_text())
    data.update(bad)
    manifest.write_text(json.dumps(data))
    return store, json.loads((finished / EXP / "eval" / "v1" / "manifest.json").read_text())["fingerprint"]


@pytest.mark.slow
@pytest.mark.parametrize("bad", BAD_SHAPES)
def test_a_manifest_of_the_wrong_shape_is_a_damaged_version_named_and_not_reused(bad, finished, tmp_path, capsys):
    from regimen.stages.store import Store

    store, fp = _damage(finished, tmp_path, bad)
    rc, out, err = run_cli(["status", EXP, "--store", str(store)], capsys)
    assert rc == 0 and "malformed manifest" in out and "Traceback" not in err, (out, err)
    st = Store(store)
    found, _ = st.stage(EXP, "eval").find_intact(fp)  # what the runner asks before it reuses a version
    assert found is None and st.next_version(EXP, "eval") == 2  # not reused; a rerun writes v2 beside it


@pytest.mark.slow
def test_a_manifest_of_the_wrong_shape_is_rerun_by_the_cli(finished, tmp_path):
    # the rerun itself once (every shape above takes the same path: the catalog leaves it out as malformed)
    store, _ = _damage(finished, tmp_path, BAD_SHAPES[2])
    r = _run(store)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert (store / EXP / "eval" / "v2" / "manifest.json").is_file()  # the damaged version is left; the stage ran again


@pytest.mark.slow
@pytest.mark.parametrize(
    "marker, shown",
    [
        ('{"pid": 1e400, "since": "x"}', "damaged running marker"),
        ('{"pid": true, "since": "x"}', "damaged running marker"),
        (
            '{"pid": 1, "since": "x", "pid_started": 5.0}',
            "interrupted",
        ),  # pid 1 is alive, but it is not the run that wrote this
        ("[1, 2]", "damaged running marker"),
        ('{"pid": ', "damaged running marker"),
    ],
)
def test_a_running_marker_of_the_wrong_shape_never_crashes_status(marker, shown, finished, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(finished, store, symlinks=True)
    (store / EXP / "grpo" / "running.json").write_text(marker)
    rc, out, err = run_cli(["status", EXP, "--store", str(store)], capsys)
    assert rc == 0 and "Traceback" not in err, (out, err)
    assert shown in out and "running  " not in out, out


# -- a store made read-only mid-GRPO; a reward that goes bad; a full disk at the base model ----------


@pytest.mark.slow
def test_a_store_made_read_only_mid_grpo_reports_grpos_error_and_records_the_attempt(tmp_path, capsys):
    store = tmp_path / "ro"
    if os.geteuid() != 0 or not _mount_tmpfs(store, "size=64m"):
        pytest.skip("needs root to mount a tmpfs")
    cache = Path(os.environ["REGIMEN_CACHE"])
    before = set((cache / "unrecorded").glob("*")) if (cache / "unrecorded").exists() else set()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "REGIMEN_MACHINE_SLOTS": "0"}
    proc = subprocess.Popen(
        [REGIMEN, "run", str(TINY), "--store", str(store), "--set", "grpo.max_steps=400", "--set", "grpo.save_steps=5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        _wait_for(store / EXP / "grpo" / "work", "*/checkpoint-5/regimen_complete", proc)
        # a read-only view of the same files on top (the tmpfs itself refuses `remount,ro` while files are
        # open for writing): every path the run opens from now on is read-only
        assert subprocess.run(["mount", "--bind", str(store), str(store)], capture_output=True).returncode == 0
        ro = subprocess.run(["mount", "-o", "remount,bind,ro", str(store)], capture_output=True)
        assert ro.returncode == 0, ro.stderr
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        subprocess.run(["umount", "-l", str(store)])
        subprocess.run(["umount", "-l", str(store)])
    assert proc.returncode == 1, err
    last = _last_line(err)
    assert (
        last.startswith("stopped: grpo:")
        and "Read-only file system" in last
        and ".lock" not in last
        and "running.json" not in last
    ), err
    assert "Traceback" not in err
    kept = set((cache / "unrecorded").glob(f"{EXP}-grpo-*.json")) - before
    assert kept and "Read-only" in json.loads(next(iter(kept)).read_text())["error"], err
    assert "recorded in" in err


@pytest.mark.slow
def test_a_reward_that_goes_bad_in_training_names_the_reward_row_and_step(tmp_path, capsys):
    store = tmp_path / "store"
    r = _run(
        store,
        "--set",
        "rewards=[{name: 'rewards_for_tests:string_in_training'}]",
        "--set",
        "dry_run.gameable=warn",  # it pays every answer 0.5 in the dry run (the audit says so); it goes bad later
        env={"PYTHONPATH": str(ROOT / "tests")},
    )
    assert r.returncode == 2, r.stderr
    last = _last_line(r.stderr)
    assert (
        "reward 'rewards_for_tests.string_in_training'" in last
        and "row 0" in last
        and "'0.5'" in last
        and "at training step 1" in last
    ), r.stderr
    assert "could not convert" not in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_a_full_disk_while_building_the_base_model_names_the_path(tmp_path, capsys):
    store = tmp_path / "full"
    if os.geteuid() != 0 or not _mount_tmpfs(store, "size=48k"):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        r = _run(store)
    finally:
        subprocess.run(["umount", "-l", str(store)])
    assert r.returncode == 1, r.stderr
    last = _last_line(r.stderr)
    assert "could not write the base model to" in last and str(store / "_base") in last and "no space left" in last, (
        r.stderr
    )
    assert "Traceback" not in r.stderr and "SafetensorError" not in last
