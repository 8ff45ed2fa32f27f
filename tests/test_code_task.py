"""The generated code task: every reference solution passes its own tests, nearly-right variants fail,
the weak teacher is right on exactly the part it claims, and a shrunken run of the recipe goes end to end
with the sandboxed unit_tests in the dry run, GRPO and evaluation."""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT, run_flow

from regimen.stages import registry
from regimen.stages.tasks.code import Options, expression, load, program, weak_solution

TASK = load(Options())
ROWS = TASK.train + TASK.heldout


def passes(code: str, tests: list[str]) -> list[bool]:
    """Our own generated programs, run in-process (trusted): the fast path over every problem."""
    body = re.search(r"```python\n(.*?)```", code, re.S).group(1)
    ns: dict = {}
    exec(body, ns)  # noqa: S102 - generated reference code, not model output
    out = []
    for t in tests:
        try:
            exec(t, ns)  # noqa: S102
            out.append(True)
        except AssertionError:
            out.append(False)
    return out


def test_every_reference_solution_passes_its_own_tests():
    assert len(TASK.train) == 360 and len(TASK.heldout) == 90
    for row in ROWS:
        assert all(passes(row["solution"], row["tests"])), row["prompt"]


def test_nearly_right_variants_fail_at_least_one_test():
    for row in ROWS:
        a, b = row["slope"], int(row["prompt"].split("\n")[0].split("=")[1])
        for wrong in ({"a": a + 1, "b": b}, {"a": a - 1, "b": b}, {"a": a, "b": b + 1}):
            code = program(expression("lin", wrong["a"], wrong["b"]) if wrong["a"] > 0 else str(wrong["b"]))
            assert not all(passes(code, row["tests"])), (row["prompt"], wrong)


def test_heldout_functions_are_never_trained_on():
    assert not {r["prompt"] for r in TASK.train} & {r["prompt"] for r in TASK.heldout}


def test_the_weak_teacher_is_right_on_exactly_the_part_it_claims():
    right = {True: 0, False: 0}
    for row in ROWS:
        weak = weak_solution(row, max_slope=4)
        if row["slope"] <= 4:
            assert weak == row["solution"]
        else:
            slope = int(re.search(r"return (\d+)\*x", weak).group(1))
            assert abs(slope - row["slope"]) <= 1
            right[weak == row["solution"]] += 1
    share = right[True] / (right[True] + right[False])
    assert 0.2 < share < 0.45  # about a third of the large slopes, by the problem's own seeded choice
    assert weak_solution({"prompt": "not examples"}) is None


def test_the_sandboxed_judge_agrees_on_a_sample():
    from regimen.stages.rewards import get_reward

    rows = TASK.heldout[:16]
    fn = get_reward("unit_tests")
    right = fn(
        [r["prompt"] for r in rows],
        [r["solution"] for r in rows],
        tests=[r["tests"] for r in rows],
        entry_point=[r["entry_point"] for r in rows],
    )
    wrong = fn(
        [r["prompt"] for r in rows],
        [program("0") for r in rows],
        tests=[r["tests"] for r in rows],
        entry_point=[r["entry_point"] for r in rows],
    )
    assert right == [1.0] * 16 and wrong == [0.0] * 16


def test_the_tiny_code_teacher_traces_a_third_of_what_grpo_trains_on(tmp_path):
    """The recipe's design: the oracle traces 240 of the 720 training functions, never a held-out one,
    and GRPO's prompts are all 720 (the verifier needs no solution)."""
    from regimen.stages.recipe import load_recipe
    from regimen.stages.tasks.registry import load_task
    from regimen.stages.training.teacher import traces

    recipe = load_recipe(ROOT / "configs" / "tiny-code.yaml", {"store": str(tmp_path)})
    task = load_task(recipe.data)
    assert (len(task.train), len(task.heldout)) == (720, 180)
    rows, counts = traces(recipe, task, cycle=1, policy_path="unused by the oracle")
    train = {r["prompt"]: r["solution"] for r in task.train}
    assert counts == {"traces_generated": 240.0, "traces_kept": 240.0} and len({r["prompt"] for r in rows}) == 240
    assert all(train[r["prompt"]] == r["completion"] for r in rows)  # exact traces, of training functions only
    again, _ = traces(recipe, task, cycle=2, policy_path="unused by the oracle")
    assert {r["prompt"] for r in again} != {r["prompt"] for r in rows}  # a later cycle draws other functions

    from regimen.stages.store import Store
    from regimen.stages.training import trajectories
    from regimen.stages.training.grpo_trainer import build_trainer
    from regimen.stages.training.policy import base_policy

    policy = base_policy(recipe, Store(tmp_path))["model"]
    trainer, _ = build_trainer(recipe, policy, tmp_path / "grpo", trajectories.Recorder())
    assert sorted(trainer.train_dataset["prompt"]) == sorted(train)  # GRPO: every training function, traced or not


@pytest.mark.slow
def test_a_shrunken_tiny_code_run_goes_end_to_end_with_the_sandboxed_judge(tmp_path):
    from regimen.stages.store import Store

    shrink = {
        "sft.max_steps": 150,
        "grpo.max_steps": 4,
        "grpo.save_steps": 2,
        "grpo.logging_steps": 2,
        "probe.steps": 2,
        "probe.prompts": 16,
        "dry_run.min_mean_reward": 0.0,
        "dry_run.max_frac_zero_std": 1.0,
        "smoke.max_steps": 2,
        "data.b_max": 10,
    }
    results = run_flow(ROOT / "configs" / "tiny-code.yaml", tmp_path, overrides=shrink)
    assert [r["stage"] for r in results] == [n for n in registry.NAMES if n != "distill"]  # the recipe distils nothing
    st = Store(tmp_path)
    dry = st.latest("tiny-code", "reward-dry-run")
    assert "mean_reward" in dry["metrics"] and "rewards/unit_tests/mean" in dry["metrics"]
    grpo = st.latest("tiny-code", "grpo")
    rows = [json.loads(line) for line in (st.local_path(grpo) / "trajectories.jsonl").read_text().splitlines()]
    assert rows and all("unit_tests" in r["rewards"] for r in rows)
    ev = st.latest("tiny-code", "eval")
    assert 0.0 <= ev["metrics"]["heldout_accuracy"] <= 1.0 and ev["metrics"]["heldout_size"] == 18.0
