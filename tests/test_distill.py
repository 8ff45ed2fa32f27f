"""The on-policy distillation stage (`stages/distill.py`): its door, a run through the flow with a teacher
folder and with `champion:<experiment>`, reuse, resume after SIGKILL, the UI's allow-list for `distill.*`,
and the teacher's identity in the manifest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY, run_cli, run_flow

from regimen.stages.core.errors import InputError
from regimen.stages.store import Store

REGIMEN = str(Path(sys.executable).parent / "regimen")
TEACHER_SHAPE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "max_position_embeddings": 64,
    "seed": 1,
    "chat": False,
}
DISTILL = {
    "max_steps": 6,
    "per_device_train_batch_size": 8,
    "max_completion_length": 4,
    "learning_rate": 1e-3,
    "save_steps": 2,
    "logging_steps": 2,
    "gradient_checkpointing": False,
}
FAST = {"grpo.max_steps": 2, "probe.steps": 2}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """A tiny model folder with the student's tokenizer (another shape, another seed)."""
    from regimen.stages.training.model import build_tiny_model

    return Path(build_tiny_model(TEACHER_SHAPE, tmp_path_factory.mktemp("teacher") / "model"))


def distill(teacher: str | Path, **more) -> dict:
    return {"distill": {"teacher_model_name_or_path": str(teacher), **DISTILL, **more}}


def recipe(**overrides):
    from regimen.stages.recipe import load_recipe

    return load_recipe(TINY, overrides)


# -- the door -------------------------------------------------------------------------------------------


def test_a_recipe_without_distill_runs_no_distill_stage_and_one_with_it_names_the_teacher(teacher):
    from regimen.stages import registry

    assert "distill" not in registry.names_for(recipe())
    assert registry.names_for(recipe(**distill(teacher)))[:2] == ("sft", "distill")


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"distill": {"max_steps": 5}}, "distill.teacher_model_name_or_path"),  # no teacher named
        (
            {"distill": {"teacher_model_name_or_path": "x", "max_steps": 5, "no_such_field": 1}},
            "distill.no_such_field is not a field of TRL's DistillationConfig",
        ),
        ({"distill": {"teacher_model_name_or_path": "x", "max_steps": 5, "beta": 2.0}}, "distill.beta"),
        (
            {"distill": {"teacher_model_name_or_path": "x", "max_steps": 5, "output_dir": "elsewhere"}},
            "distill.output_dir is set by Regimen",
        ),
        (
            {"distill": {"teacher_model_name_or_path": "champion:../etc", "max_steps": 5}},
            "champion:<experiment> takes an experiment name",
        ),
        (
            {"distill": {"teacher_model_name_or_path": "x", "max_steps": -1}},
            "distill.max_steps",
        ),  # unbounded: the operator's limit applies
    ],
)
def test_the_recipe_door_names_the_distill_field(bad, field, tmp_path, capsys):
    store = tmp_path / "store"
    sets = [f"--set=distill={json.dumps(bad['distill'])}"]
    code, _, err = run_cli(["run", str(TINY), "--store", str(store), "--set", "limits.max_steps=1000", *sets], capsys)
    assert code == 2 and field in err and "Traceback" not in err, err
    assert not store.exists()


def test_the_stage_door_refuses_a_missing_folder_a_champion_that_does_not_exist_and_another_tokenizer(
    teacher, tmp_path
):
    from regimen.stages import distill as stage
    from regimen.stages.training.model import build_real_shaped_model

    with pytest.raises(InputError, match="no such folder"):
        stage.door(recipe(**distill(tmp_path / "nowhere" / "model")))
    with pytest.raises(InputError, match=r"experiment 'nobody' has no champion in store"):
        stage.door(recipe(store=str(tmp_path / "store"), **distill("champion:nobody")))
    other = build_real_shaped_model(tmp_path / "qwen", arch="qwen3")  # a byte-level BPE tokenizer: not the student's
    with pytest.raises(InputError) as exc:
        stage.door(recipe(**distill(other)))
    assert "the teacher's tokenizer" in str(exc.value) and "tiny" in str(exc.value) and str(other) in str(exc.value)
    assert stage.door(recipe(**distill(teacher)))["sha256"]  # the same tokenizer: accepted, identified by content


def test_a_flow_run_with_a_refused_teacher_exits_2_before_anything_is_written(tmp_path, capsys):
    store = tmp_path / "store"
    code, _, err = run_cli(
        [
            "run",
            str(TINY),
            "--store",
            str(store),
            "--set",
            f"distill={json.dumps({'teacher_model_name_or_path': 'champion:default', **DISTILL})}",
        ],
        capsys,
    )
    assert code == 2 and "has no champion" in err, err
    assert not (store / "tiny-test").exists()


def test_distill_hyperparameters_are_ui_parameters_and_the_teacher_is_not():
    from regimen.flows.serving.boundary import check_overrides

    assert check_overrides({"distill.beta": 0.5, "distill.max_steps": 20, "distill.learning_rate": 1e-4}, [])
    for key in (
        "distill.teacher_model_name_or_path",
        "distill.teacher_model_init_kwargs",
        "distill.use_vllm",
        "distill.vllm_server_base_url",
        "distill.model_init_kwargs",
    ):
        with pytest.raises(InputError, match="not a UI parameter"):
            check_overrides({key: "x"}, [])


# -- through the flow ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_distill_runs_between_sft_and_the_gates_records_its_teacher_and_is_reused(teacher, tmp_path):
    store = tmp_path / "store"
    results = run_flow(TINY, store, overrides={**distill(teacher), **FAST})
    assert [r["stage"] for r in results][:3] == ["sft", "distill", "reward-dry-run"]
    d = next(r for r in results if r["stage"] == "distill")
    m = d["metrics"]
    assert 0.0 <= m["heldout_accuracy"] <= 1.0 and 0.0 <= m["teacher_heldout_accuracy"] <= 1.0 and m["steps"] == 6
    assert m["divergence_first"] > 0 and m["reverse_kl_mean"] >= 0
    st = Store(store)
    manifest = st.latest("tiny-test", "distill")
    from regimen.stages.core.fingerprint import tree_digest

    assert manifest["teacher"] == {"folder": str(teacher.resolve()), "sha256": tree_digest(teacher)}
    assert manifest["config"]["teacher"]["sha256"] == tree_digest(teacher)
    assert manifest["inputs"]["policy"]["stage"] == "sft"
    rows = [json.loads(x) for x in (st.local_path(manifest) / "trajectories.jsonl").read_text().splitlines()]
    graded = [r for r in rows if r["kind"] == "distill"]
    assert graded and all({"reverse_kl_mean", "teacher_logprob_mean", "student_logprob_mean"} <= set(r) for r in graded)
    assert any(r["kind"] == "heldout" for r in rows)
    smoke = st.latest("tiny-test", "reward-dry-run")
    assert smoke["inputs"]["policy"]["stage"] == "distill"  # the gates judge the distilled policy

    again = run_flow(TINY, store, overrides={**distill(teacher), **FAST})
    assert all(r["reused"] for r in again), [(r["stage"], r["reused"]) for r in again]

    # the teacher's files changed
    (teacher / "generation_config.json").write_text((teacher / "generation_config.json").read_text() + " ")
    third = run_flow(TINY, store, overrides={**distill(teacher), **FAST})
    ran = {r["stage"]: not r["reused"] for r in third}
    assert ran["sft"] is False and ran["distill"] is True


@pytest.mark.slow
def test_champion_of_another_experiment_is_the_teacher_resolved_once_and_recorded(tmp_path):
    """`champion:tiny-test` after a run of tests/tiny.yaml made one: its version and weights' digest are
    in the distilling stage's manifest."""
    store = tmp_path / "store"
    run_flow(TINY, store, overrides=FAST)
    champ = json.loads((store / "tiny-test" / "champion.json").read_text())["champion"]
    results = run_flow(TINY, store, experiment="student", overrides={**distill("champion:tiny-test"), **FAST})
    d = next(r for r in results if r["stage"] == "distill")
    manifest = Store(store).latest("student", "distill")
    assert (
        manifest["teacher"]["champion"] == "tiny-test"
        and manifest["teacher"]["version"] == champ["policy_ref"]["version"]
    )
    assert (
        manifest["teacher"]["content"] == champ["policy_ref"]["content"]
        and d["metrics"]["teacher_heldout_accuracy"] >= 0
    )


@pytest.mark.slow
def test_a_killed_distill_resumes_from_its_last_checkpoint(teacher, tmp_path):
    store = tmp_path / "store"
    sets = [
        "--set",
        "distill="
        + json.dumps({"teacher_model_name_or_path": str(teacher), **DISTILL, "max_steps": 25, "save_steps": 5}),
        "--set",
        "grpo.max_steps=2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "REGIMEN_MACHINE_SLOTS": "0"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(
        [REGIMEN, "run", str(TINY), "--store", str(store), *sets],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    work = store / "tiny-test" / "distill" / "work"
    try:
        deadline = time.monotonic() + 300
        while not list(work.glob("*/checkpoint-10/regimen_complete")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (store / "tiny-test" / "distill" / "v1").exists()
    from regimen.stages.training.checkpoints import last_checkpoint

    [workdir] = list(work.iterdir())
    step, _ = last_checkpoint(workdir)
    assert 10 <= step < 25
    r = subprocess.run(
        [REGIMEN, "run", str(TINY), "--store", str(store), *sets],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = Store(store).latest("tiny-test", "distill")
    assert manifest["resumed_from_step"] == step and manifest["metrics"]["steps"] == 25
