"""Cycles on the tiny recipe: back to SFT when evaluation stalls, teachers, sweeps, reports."""

import json

import pytest
from conftest import TINY, run_cli, run_flow

from regimen.stages.store import Store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_cycles(tmp_path_factory):

    store = tmp_path_factory.mktemp("cycles")
    results = run_flow(
        TINY, store, experiment="cycles", overrides={"cycle.max_cycles": 2, "cycle.patience": 1, "cycle.min_delta": 0.5}
    )
    return store, results


def test_stall_goes_back_to_sft_and_ends_after_the_last_cycle(two_cycles):
    store, results = two_cycles
    s = Store(store)
    sft = s.versions("cycles", "sft")
    assert [m["cycle"] for m in sft] == [1, 2] and [m["version"] for m in sft] == [1, 2]
    evals = s.versions("cycles", "eval")
    verdicts = s.verdicts_by_eval("cycles")  # the flow's decisions, kept beside the evaluations they judged
    assert [verdicts[m["version"]]["verdict"] for m in evals][0] == "back-to-sft"
    assert verdicts[evals[1]["version"]]["verdict"] in ("stalled", "budget-spent") and evals[1]["cycle"] == 2
    # cycle 2's SFT starts from cycle 1's GRPO policy, on freshly ordered traces
    assert sft[1]["inputs"]["policy"]["fingerprint"] == s.versions("cycles", "grpo")[0]["fingerprint"]
    assert [r["stage"] for r in results].count("sft") == 2
    assert (store / "cycles" / "plots" / "heldout_accuracy.png").stat().st_size > 1000


def test_report_prints_history_and_draws_plots(two_cycles, capsys):
    store, _ = two_cycles
    code, out, _ = run_cli(["report", "cycles", "--store", str(store)], capsys)
    assert code == 0 and "back-to-sft" in out and "c2 sft v2" in out
    assert "grpo_curves.png" in out


@pytest.mark.parametrize("kind", ["model", "self"])
def test_teacher_model_and_self_distillation_record_traces(two_cycles, kind):

    store, _ = two_cycles
    teacher = str(store / "cycles" / "grpo" / "v1" / "model")  # a checkpoint the pipeline produced
    overrides = {
        "teacher.kind": kind,
        "teacher.samples_per_prompt": 2,
        "teacher.min_reward": 0.0,
        "teacher.max_prompts": 64,
    }
    if kind == "model":
        overrides["teacher.name_or_path"] = teacher
    results = run_flow(TINY, store, experiment=f"teacher-{kind}", overrides=overrides)
    sft = results[0]
    assert sft["stage"] == "sft"
    assert sft["metrics"]["traces_generated"] == 128
    assert 0 < sft["metrics"]["traces_kept"] <= 128
    manifest = Store(store).latest(f"teacher-{kind}", "sft")
    assert manifest["config"]["teacher"]["kind"] == kind


def test_sweep_reuses_sft_and_compares_group_sizes(two_cycles, capsys):
    store, _ = two_cycles
    code, out, err = run_cli(
        ["sweep", str(TINY), "--store", str(store), "--experiment", "sweep", "--set", "grpo.num_generations=2,4"],
        capsys,
    )
    assert code == 0, err
    s = Store(store)
    assert len(s.versions("sweep", "sft")) == 1 and len(s.versions("sweep", "grpo")) == 2
    [folder] = list((store / "sweep" / "sweeps").iterdir())
    data = json.loads((folder / "comparison.json").read_text())
    assert [r["grpo.num_generations"] for r in data["rows"]] == [2, 4]
    assert [r["prompts_per_step"] for r in data["rows"]] == [8, 4]  # 16 completions per step each
    assert "completions per GRPO step" in data["note"]
    assert (folder / "sweep.png").stat().st_size > 1000
    assert "frac_reward_zero_std" in out
