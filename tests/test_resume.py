"""Crash safety on the tiny recipe: `regimen run` SIGKILLed in the middle of GRPO (once a checkpoint is
complete) leaves no half-written version; the rerun reuses SFT, the dry run and the smoke test untouched
and resumes GRPO from its last good checkpoint, skipping torn ones; a last checkpoint already at
`max_steps` finishes the stage without training an extra step."""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.register_assert_rewrite("prefect_ops")
from conftest import TINY, run_cli  # noqa: E402
from prefect_ops import ROOT, bin_path, stop, tail  # noqa: E402

from regimen.stages.store import Store  # noqa: E402
from regimen.stages.training.checkpoints import MARKER, complete_checkpoints  # noqa: E402

pytest_plugins = ["prefect_ops"]
pytestmark = pytest.mark.slow

EXP = "resume"
MAX_STEPS, SAVE_STEPS = 200, 10  # ~40 tiny GRPO steps a second on 2 CPU cores: seconds to aim at, not one
EARLIER = ("sft", "reward-dry-run", "grpo-smoke")


def snapshot(store: Path) -> dict[str, list[tuple[int, str, dict]]]:
    s = Store(store)
    return {stage: [(m["version"], m["fingerprint"], m["files"]) for m in s.scan(EXP, stage)[0]] for stage in EARLIER}


def regimen_run(store: Path, env: dict, log: Path) -> subprocess.Popen:
    cmd = [
        bin_path("regimen"),
        "run",
        "tests/tiny.yaml",
        "--store",
        str(store),
        "--experiment",
        EXP,
        "--set",
        f"grpo.max_steps={MAX_STEPS}",
        "--set",
        f"grpo.save_steps={SAVE_STEPS}",
    ]
    with open(log, "wb") as fh:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def progress(log: Path) -> int:
    """The last GRPO step the progress bar showed (transformers' tqdm: ` 23/120 [`)."""
    steps = re.findall(rf"(\d+)/{MAX_STEPS} \[", log.read_text(errors="replace"))
    return int(steps[-1]) if steps else 0


@pytest.fixture(scope="module")
def crash(prefect_server, tmp_path_factory):
    """Run, SIGKILL the process group as soon as a GRPO checkpoint is complete, add torn checkpoints, rerun."""
    tmp = tmp_path_factory.mktemp("resume")
    store = tmp / "store"
    env = prefect_server.client_env()  # a real server: no temporary Prefect server per run
    info: dict = {"store": store, "tmp": tmp}

    t0 = time.monotonic()
    proc = regimen_run(store, env, tmp / "killed.log")
    work = store / EXP / "grpo" / "work"
    try:
        # wait for a complete checkpoint, then for GRPO to be half way to the next one, and kill
        while not (markers := list(work.glob(f"*/checkpoint-*/{MARKER}"))):
            assert proc.poll() is None, (
                f"the run ended (exit {proc.returncode}) before a GRPO checkpoint was "
                f"complete:\n{tail(tmp / 'killed.log')}"
            )
            assert time.monotonic() - t0 < 180, "no GRPO checkpoint after 180s"
            time.sleep(0.01)
        first = int(markers[0].parent.name.split("-")[1])
        while (
            progress(tmp / "killed.log") < first + SAVE_STEPS // 2
            and len(list(work.glob(f"*/checkpoint-*/{MARKER}"))) == 1
        ):
            assert proc.poll() is None, (
                f"the run ended (exit {proc.returncode}) before it was killed:\n{tail(tmp / 'killed.log')}"
            )
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        stop(proc)
    info["killed_rc"] = proc.returncode
    [workdir] = list(work.iterdir())
    good = complete_checkpoints(workdir)
    info["good_step"] = good[-1][0]
    # the progress bar lags the trainer by up to its refresh interval: a lower bound of the steps done
    info["steps_at_kill"] = max(progress(tmp / "killed.log"), info["good_step"])
    info["grpo_entries_after_kill"] = sorted(p.name for p in (store / EXP / "grpo").iterdir())
    info["before"] = snapshot(store)
    from regimen.flows.present.status import experiment_status

    info["status_after_kill"] = {r["stage"]: r for r in experiment_status(str(store), EXP)}

    # torn checkpoints after the good one, as a kill during a save leaves them: no marker; one with a
    # truncated weights file, one complete-looking
    last = max(int(p.name.split("-")[1]) for p in workdir.glob("checkpoint-*"))
    for n, truncate in ((last + SAVE_STEPS, True), (last + 2 * SAVE_STEPS, False)):
        torn = workdir / f"checkpoint-{n}"
        shutil.copytree(good[-1][1], torn)
        (torn / MARKER).unlink()
        if truncate:
            weights = torn / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    info["torn"] = [last + SAVE_STEPS, last + 2 * SAVE_STEPS]
    # keep a copy of the good checkpoint for the max_steps test
    shutil.copytree(good[-1][1], tmp / "good-checkpoint")

    t1 = time.monotonic()
    rerun = regimen_run(store, env, tmp / "rerun.log")
    try:
        info["rerun_rc"] = rerun.wait(240)
    finally:
        stop(rerun)
    info["rerun_s"] = time.monotonic() - t1
    info["after"] = snapshot(store)
    return info


def test_sigkill_mid_grpo_leaves_no_half_written_version(crash):
    assert crash["killed_rc"] == -signal.SIGKILL
    assert 0 < crash["good_step"] < MAX_STEPS
    assert not [n for n in crash["grpo_entries_after_kill"] if re.fullmatch(r"v\d+", n)], crash[
        "grpo_entries_after_kill"
    ]
    assert crash["before"]["sft"] and crash["before"]["grpo-smoke"]


def test_rerun_reuses_earlier_stages_untouched_and_resumes_grpo(crash):
    assert crash["rerun_rc"] == 0, tail(crash["tmp"] / "rerun.log")
    assert crash["after"] == crash["before"]  # same versions, fingerprints and file digests
    s = Store(crash["store"])
    for stage in EARLIER:
        assert all(s.verify(m) == [] for m in s.versions(EXP, stage))
    [grpo] = s.versions(EXP, "grpo")
    resumed = grpo["resumed_from_step"]
    assert resumed == crash["good_step"] > 0  # the torn checkpoints after it were skipped
    assert grpo["metrics"]["steps"] == MAX_STEPS and grpo["metrics"]["steps_run"] == MAX_STEPS - resumed
    redone = crash["steps_at_kill"] - resumed  # steps trained before the kill that the rerun trained again
    assert 0 <= redone <= SAVE_STEPS, crash
    log = (crash["tmp"] / "rerun.log").read_text(errors="replace")
    print(
        f"\nkilled at GRPO step ~{crash['steps_at_kill']}/{MAX_STEPS} (save_steps {SAVE_STEPS}); resumed from "
        f"{resumed}: {redone} steps redone, {MAX_STEPS - resumed} of {MAX_STEPS} trained after the restart; "
        f"rerun {crash['rerun_s']:.1f}s"
    )
    assert "resumed_from_step" in log


def test_status_shows_the_interrupted_stage_and_its_checkpoint_then_the_finished_resume(crash, capsys):
    grpo = crash["status_after_kill"]["grpo"]
    assert f"has checkpoint at step {crash['good_step']}" in grpo["detail"] and "interrupted run" in grpo["detail"], (
        grpo
    )
    assert grpo["state"] != "completed" and grpo["latest"] == "-"
    assert crash["status_after_kill"]["sft"]["state"] == "completed"
    code, out, _ = run_cli(["status", EXP, "--store", str(crash["store"])], capsys)
    assert code == 0
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    for stage in ("sft", "reward-dry-run", "grpo-smoke", "grpo", "eval"):
        assert "completed" in rows[stage], out


def test_last_checkpoint_at_max_steps_finishes_the_stage_without_an_extra_step(crash):
    """The checkpoint the kill left, with `max_steps` equal to its step: the stage commits its weights as
    they are (resume_from_checkpoint would train one more step)."""
    from safetensors.torch import load_file

    from regimen.stages.recipe import load_recipe
    from regimen.stages.run.runner import StageCall, StageResult, execute, stage_key

    store = Store(crash["store"])
    step = crash["good_step"]
    recipe = load_recipe(
        TINY, {"experiment": EXP, "store": str(crash["store"]), "grpo.max_steps": step, "grpo.save_steps": SAVE_STEPS}
    )
    sft = store.latest(EXP, "sft")
    inputs = {"policy": StageResult(sft, True, 0.0, store.local_path(sft)).ref}
    key, _ = stage_key("grpo", recipe, inputs)
    work = store.stage(EXP, "grpo").work_dir(key)
    shutil.copytree(crash["tmp"] / "good-checkpoint", work / f"checkpoint-{step}")

    result = execute(StageCall("grpo", recipe, inputs, experiment=EXP), store)
    m = result.manifest
    assert not result.reused and m["resumed_from_step"] == step
    assert m["metrics"]["steps"] == step and m["metrics"]["steps_run"] == 0
    ckpt = load_file(str(crash["tmp"] / "good-checkpoint" / "model.safetensors"))
    final = load_file(str(result.path / "model" / "model.safetensors"))
    assert ckpt.keys() == final.keys() and all((ckpt[k] == final[k]).all() for k in ckpt)  # no step after it
    assert json.loads((result.path / "metrics.json").read_text())["steps"] == step
