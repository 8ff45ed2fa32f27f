"""The whole flow on the shrunken tiny recipe: real SFT and GRPO (seconds), real Prefect."""

import json
from pathlib import Path

import pytest
from conftest import TINY, run_cli, run_flow

from regimen.stages.registry import NAMES
from regimen.stages.store import Store

STAGES = tuple(n for n in NAMES if n != "distill")  # the stages tests/tiny.yaml runs (it distils nothing)

pytestmark = pytest.mark.slow


def versions(store: Path, experiment="tiny-test"):
    s = Store(store)
    return {stage: [m["version"] for m in s.versions(experiment, stage)] for stage in STAGES}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):

    store = tmp_path_factory.mktemp("store")
    results = run_flow(TINY, store)
    return store, results


def test_all_five_stages_complete_with_intact_files(first_run):
    store, results = first_run
    assert [r["stage"] for r in results] == list(STAGES)
    assert all(not r["reused"] for r in results)
    s = Store(store)
    for stage in STAGES:
        [m] = s.scan("tiny-test", stage)[0]
        assert m["status"] == "completed" and m["stage"] == stage and m["version"] == 1 and m["cycle"] == 1
        assert s.verify(m) == []
        for key in ("fingerprint", "inputs", "config", "metrics", "files", "started_at", "finished_at", "code_version"):
            assert key in m, (stage, key)
        vdir = store / "tiny-test" / stage / "v1"
        assert json.loads((vdir / "metrics.json").read_text()) == pytest.approx(m["metrics"], nan_ok=True)
        rows = [json.loads(line) for line in (vdir / "trajectories.jsonl").read_text().splitlines()]
        assert rows and all("prompt" in r and "completion" in r for r in rows)
    grpo = s.latest("tiny-test", "grpo")
    assert grpo["config"]["grpo"]["beta"] > 0 and grpo["metrics"]["beta"] > 0
    assert grpo["resumed_from_step"] == 0 and grpo["metrics"]["steps"] == 6
    assert (store / "tiny-test/grpo/v1/model/config.json").exists()
    log = [json.loads(line) for line in (store / "tiny-test/grpo/v1/train_log.jsonl").read_text().splitlines()]
    assert any(h.get("reward") is not None for h in log)
    assert all(h["wall_s"] >= 0 for h in log if "reward" in h)  # the curve against time, for resume figures
    ev = s.latest("tiny-test", "eval")
    [decision] = s.decisions("tiny-test")  # the flow decides; the verdict is kept beside the evaluation
    assert decision["eval_version"] == ev["version"] and decision["verdict"] in (
        "target-reached",
        "budget-spent",
        "stalled",
    )
    assert "cycle" not in ev["config"]  # evaluation measures: its fingerprint knows nothing of cycle settings
    assert [p["step"] for p in grpo["heldout_probe"]][0] == 0 and grpo["best_step"] in [
        p["step"] for p in grpo["heldout_probe"]
    ]
    assert 0.0 <= ev["metrics"]["heldout_accuracy"] <= 1.0
    assert ev["inputs"]["policy"]["fingerprint"] == grpo["fingerprint"]
    # no work folders or staging left behind once versions are committed
    assert not list(store.glob("tiny-test/*/.staging-*"))
    assert not any(any(p.iterdir()) for p in store.glob("tiny-test/*/work") if p.is_dir())


def test_identical_rerun_reuses_every_stage(first_run):

    store, _ = first_run
    before = versions(store)
    results = run_flow(TINY, store)
    assert all(r["reused"] for r in results)
    assert versions(store) == before


def test_changing_only_the_cycle_target_reruns_nothing_and_records_a_new_verdict(first_run):
    store, _ = first_run
    before = versions(store)
    results = run_flow(TINY, store, overrides={"cycle.target": 0.0, "cycle.stop_when_taught": False})
    assert all(r["reused"] for r in results)
    assert versions(store) == before
    latest = Store(store).decisions("tiny-test")[-1]
    assert latest["verdict"] == "target-reached" and latest["cycle_settings"]["target"] == 0.0


def test_a_cycle_whose_sft_meets_the_target_runs_no_grpo(tmp_path):
    """cycle.stop_when_taught: SFT's held-out accuracy already at the target ends the cycle there; the judge
    measures the SFT policy (the challenger) and the verdict is recorded; no gate, no GRPO."""
    results = run_flow(TINY, tmp_path, overrides={"cycle.target": 0.0})
    ran = [r["stage"] for r in results if r.get("cycle")]
    assert ran == ["sft", "eval"], ran
    ev = next(r for r in results if r["stage"] == "eval" and r.get("cycle"))
    assert ev["round"] == 0 and ev["verdict"] == "target-reached"
    assert Store(tmp_path).decisions("tiny-test")[-1]["verdict"] == "target-reached"


def test_a_truncated_file_is_not_reused_the_stage_runs_again_and_status_names_it(first_run, capsys):
    store, _ = first_run
    s = Store(store)
    [eval_v1] = [m for m in s.versions("tiny-test", "eval") if m["version"] == 1]
    victim = store / "tiny-test/eval/v1/trajectories.jsonl"
    victim.write_bytes(victim.read_bytes()[:10])
    code, out, _ = run_cli(["status", "tiny-test", "--store", str(store)], capsys)
    assert code == 0 and "DAMAGED v1" in out and "trajectories.jsonl" in out
    results = run_flow(TINY, store)
    ran = {r["stage"]: not r["reused"] for r in results}
    assert ran == {"sft": False, "reward-dry-run": False, "grpo-smoke": False, "grpo": False, "eval": True}
    ev = [r for r in results if r["stage"] == "eval"][0]
    assert ev["damaged"] and ev["damaged"][0]["version"] == 1 and ev["version"] > 1
    assert s.verify(s.latest("tiny-test", "eval")) == []
    assert s.verify(eval_v1) == ["trajectories.jsonl"]  # the damaged version is left for a person to look at
    # v1 is no longer the latest: plain status (which checks only the latest's files) names it from the run's record
    code, out, _ = run_cli(["status", "tiny-test", "--store", str(store)], capsys)
    assert code == 0 and "DAMAGED v1" in out and "found by a run" in out, out


def test_changing_a_grpo_field_reruns_grpo_and_eval_only(first_run):

    store, _ = first_run
    results = run_flow(TINY, store, overrides={"grpo.beta": 0.08})
    ran: dict[str, bool] = {}
    for (
        r
    ) in results:  # the first of each stage: the champion's evaluation comes last (reused, a version made in cycle 1)
        ran.setdefault(r["stage"], not r["reused"])
    assert ran == {"sft": False, "reward-dry-run": False, "grpo-smoke": True, "grpo": True, "eval": True}
    assert Store(store).latest("tiny-test", "grpo")["config"]["grpo"]["beta"] == 0.08


def test_gate_failure_exits_1_records_attempt_and_writes_no_version(first_run, capsys):
    store, _ = first_run
    code, out, err = run_cli(
        ["run", str(TINY), "--store", str(store), "--experiment", "gate", "--set", "dry_run.min_mean_reward=0.99"],
        capsys,
    )
    assert code == 1, (out, err)
    assert "reward-dry-run" in err and "too hard" in err and "more SFT" in err
    s = Store(store)
    assert s.versions("gate", "reward-dry-run") == []
    [fail] = s.failures("gate", "reward-dry-run")
    assert "too hard" in fail["error"]
    assert s.versions("gate", "sft")  # the stage before the gate completed and is kept
    code, out, _ = run_cli(["status", "gate", "--store", str(store)], capsys)
    assert code == 0 and "failed" in out and "completed" in out


def test_a_rerun_after_a_change_of_code_versions_reruns_every_stage_once_then_reuses_them(first_run):
    """Versions made by other code (as after issue 41's change of what a code version digests) carry another
    code version, hence another fingerprint: the next run runs every stage of the cycle again, once, and the
    run after it reuses them all."""
    from regimen.stages.core.fingerprint import digest

    store, _ = first_run
    s = Store(store)
    for stage in STAGES:
        for m in s.scan("tiny-test", stage)[0]:
            path = store / "tiny-test" / stage / f"v{m['version']}" / "manifest.json"
            before_move = {
                **m,
                "code_version": "0" * 16,
                "fingerprint": digest({"made before the move": m["fingerprint"]}),
            }
            path.write_text(json.dumps(before_move, indent=1))
    assert all(m["code_version"] == "0" * 16 for stage in STAGES for m in s.scan("tiny-test", stage)[0])

    after_move = run_flow(TINY, store)
    # the champion's own evaluation (cycle 0) may run too: its version was made before
    cycle = [r for r in after_move if r.get("cycle")]
    assert sorted(r["stage"] for r in cycle if not r["reused"]) == sorted(STAGES)  # every stage ran, once
    current = {stage: s.latest("tiny-test", stage)["code_version"] for stage in STAGES}
    assert all(v != "0" * 16 for v in current.values())

    before = versions(store)
    again = run_flow(TINY, store)
    assert all(r["reused"] for r in again), [(r["stage"], r["reused"]) for r in again]
    assert versions(store) == before
