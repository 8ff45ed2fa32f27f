"""`curriculum.kind: levels` (issue 44): the level controller on scripted pass rates, and a real GRPO run whose
levels are recorded, plotted from the manifest and restored after a SIGKILL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

from regimen.stages.core.errors import InputError
from regimen.stages.recipe import load_recipe
from regimen.stages.recipe.schema import LevelsSection
from regimen.stages.training.levels import LevelController, LevelsCurriculum

RG = ROOT / "tests" / "rg-tiny.yaml"


def feed(c: LevelController, rate: float, n: int = 10) -> int:
    ones = round(rate * n)
    for i in range(n):
        c.observe(c.level, 1.0 if i < ones else 0.0)
    return c.decide(step=len(c.history))


def test_the_level_moves_up_above_up_down_below_down_and_stays_between():
    c = LevelController(LevelsSection(window=10, up=0.8, down=0.2), top=2)
    assert [feed(c, r) for r in (0.9, 0.5, 1.0, 1.0, 0.1, 0.0, 0.0, 0.3)] == [1, 1, 2, 2, 1, 0, 0, 0]
    assert [h["level"] for h in c.history] == [0, 1, 1, 2, 2, 1, 0, 0, 0]  # the levels over time, each decision
    c.observe(c.level, 1.0)
    assert c.decide(99) == 0 and len(c.window) == 1  # a window not yet full decides nothing
    c.observe(c.level + 1, 1.0)  # a completion of a prompt from before a move counts for nothing
    assert len(c.window) == 1


def test_the_state_round_trips_and_the_baselines_never_move():
    c = LevelController(LevelsSection(window=4), top=3)
    feed(c, 1.0, 4)
    feed(c, 1.0, 2)
    again = LevelController(LevelsSection(window=4), top=3)
    again.load(json.loads(json.dumps(c.state())))
    assert again.state() == c.state() and again.level == 1
    for mode in ("fixed", "uniform"):
        still = LevelController(LevelsSection(window=4, mode=mode), top=3)
        assert [feed(still, 1.0, 4) for _ in range(3)] == [0, 0, 0]


def test_the_stream_generates_at_the_current_level_skips_heldout_prompts_and_resumes_where_it_was():
    r = load_recipe(str(RG), {"data.heldout_levels": [0, 1, 2], "data.config": {}}, check_trl=False)
    from regimen.stages.tasks import reasoning_gym as task_module
    from regimen.stages.tasks.registry import load_task

    task = load_task(r.data)
    pacing = LevelsCurriculum(task_module, r.data, LevelsSection(window=2), seed=0, heldout=task.heldout)
    stream = pacing.stream()
    first = [next(stream) for _ in range(3)]
    assert {row["level"] for row in first} == {0} and all(row["prompt_id"] for row in first)
    pacing.observe([0, 0], [1.0, 1.0])
    pacing.controller.decide(1)
    assert next(stream)["level"] == 1
    saved = json.loads(json.dumps(pacing.state()))
    later = [next(stream)["prompt"] for _ in range(2)]
    again = LevelsCurriculum(task_module, r.data, LevelsSection(window=2), seed=0, heldout=task.heldout)
    again.load(saved)
    assert [next(again.stream())["prompt"] for _ in range(1)] == later[:1]
    held = {row["prompt"] for row in task.heldout}
    assert not any(next(stream)["prompt"] in held for _ in range(50))
    uniform = LevelsCurriculum(task_module, r.data, LevelsSection(mode="uniform"), seed=0, heldout=task.heldout)
    assert {next(uniform.stream())["level"] for _ in range(40)} == {0, 1, 2}


def test_the_screen_in_front_of_the_levels_tells_the_controller_what_it_saw(monkeypatch):
    """`skip_all_alike` with `kind: levels` (issue 49, item 3): a level whose prompts the policy all solves is screened
    out, so GRPO's own groups never report it; the screening answers count toward the pass rate at their level, so
    the level still rises. A row at the next level whose answers differ enters."""
    from regimen.stages.tasks import reasoning_gym as task_module
    from regimen.stages.tasks.registry import load_task
    from regimen.stages.training import screen as screening

    over = {
        "data.heldout_levels": [0, 1, 2],
        "data.config": {},
        "curriculum": {"kind": "levels", "levels": {"window": 8}, "skip_all_alike": True, "screen_batch": 2},
    }
    r = load_recipe(str(RG), over, check_trl=False)
    task = load_task(r.data)

    def answers(model, tok, recipe, rows, num_return_sequences, **_):  # level 0 always right, above it half right
        k = num_return_sequences
        return [[row["answer"] if row["level"] == 0 or i % 2 else "x" for i in range(k)] for row in rows], None

    monkeypatch.setattr(screening, "complete", answers)
    pacing = LevelsCurriculum(task_module, r.data, r.curriculum.levels, 0, task.heldout, metric=r.eval.metric)
    screen = screening.Screen(r, pacing)
    screen.model = screen.tokenizer = object()  # a policy to ask (the scripted answers above)
    assert screen.screen([screen._next() for _ in range(2)]) == []  # level 0: all solved, both skipped
    assert pacing.controller.window == [1.0] * 8  # ... and their 2 x 4 answers heard at level 0
    assert pacing.controller.decide(1) == 1
    entered = screen.screen([screen._next() for _ in range(2)])
    assert [row["level"] for row in entered] == [1, 1] and pacing.controller.window == [0.0, 1.0] * 4


def test_a_level_is_its_value_alone_or_every_value_up_to_it_and_the_default_keeps_the_fingerprint():
    """`data.level_range` (reasoning-gym's RangeAttributeMode): spell_backward's level 1 is 5-letter words alone
    (upper_bound, the default) or words of 3 to 5 letters (inclusive); the default leaves the data's identity as it
    was before the field existed."""
    from regimen.stages.tasks import reasoning_gym as task_module

    lengths = {}
    for mode in ("upper_bound", "inclusive"):
        over = {"data.name": "spell_backward", "data.config": {}, "data.level": 1, "data.level_range": mode}
        r = load_recipe(str(RG), over, check_trl=False)
        rows = task_module.generate(r.data, 200, seed=0)
        lengths[mode] = {len(row["answer"]) for row in rows}
        assert {len(task_module.row_at(r.data, 1, 0, i)["answer"]) for i in range(60)} <= lengths[mode]
        ident = task_module.identity(r.data)
        assert ("level_range" in ident) == (mode != "upper_bound")
    assert lengths == {"upper_bound": {5}, "inclusive": {3, 4, 5}}


def test_levels_need_a_task_that_generates_by_level():
    with pytest.raises(InputError, match="curriculum.kind: levels needs a task that generates problems by level"):
        load_recipe(str(ROOT / "tests" / "tiny.yaml"), {"curriculum": {"kind": "levels"}}, check_trl=False)
    with pytest.raises(InputError, match="down .* must be below up"):
        load_recipe(str(RG), {"curriculum": {"kind": "levels", "levels": {"up": 0.2, "down": 0.5}}}, check_trl=False)


@pytest.mark.slow
def test_a_killed_grpo_resumes_its_levels_from_the_checkpoint(tmp_path, monkeypatch):
    """A window of 8 completions fills every step (16 per step): a decision each step. Killed at step 4 (its
    checkpoint not yet written), the rerun restores the controller from step 2's checkpoint: the manifest's levels over
    time hold the decisions made before the kill, and the section is part of GRPO's fingerprint."""
    import os
    import subprocess
    import sys

    from regimen.stages.store import Store

    store = tmp_path / "store"
    args = [
        str(Path(sys.executable).parent / "regimen"),
        "run",
        str(RG),
        "--store",
        str(store),
        "--set",
        "curriculum={kind: levels, levels: {window: 8, up: 0.5, down: 0.0}}",
        "--set",
        "data.heldout_levels=[0, 1]",
        "--set",
        "data.config={}",
        "--set",
        "grpo.max_steps=6",
        "--set",
        "grpo.save_steps=2",
        "--set",
        "smoke.max_steps=1",
        "--set",
        "dry_run={max_frac_zero_std: 1.0, min_mean_reward: 0.0, max_mean_reward: 1.0, gameable: warn}",
        "--set",
        "rewards=[{name: reasoning_gym, weight: 0}, {name: 'rewards_for_tests:length_parity'}]",
        "--set",
        "cycle.max_cycles=1",
    ]
    env = {**os.environ, "REGIMEN_KILL": "grpo@4", "PYTHONPATH": str(ROOT / "tests")}
    killed = subprocess.run(
        args,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode != 0, killed.stderr[-2000:]
    env.pop("REGIMEN_KILL")
    done = subprocess.run(
        args,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    st = Store(store)
    [grpo] = st.scan("rg-tiny", "grpo")[0] or pytest.fail(done.stderr[-3000:])
    assert grpo["resumed_from_step"] == 2  # killed as step 4 ended, before its checkpoint: resumed from step 2's
    steps = [h["step"] for h in grpo["curriculum"]["levels"]]
    assert steps == [0, 1, 2, 3, 4, 5, 6], steps  # steps 1 and 2's decisions came back from the checkpoint
    assert grpo["config"]["curriculum"]["kind"] == "levels"  # part of the stage's identity
    log = [json.loads(x) for x in (st.local_path(grpo) / "train_log.jsonl").read_text().splitlines()]
    assert any("curriculum/level" in h for h in log)


def test_a_gate_sees_no_change_from_the_levels_section_and_grpo_does():
    from regimen.stages.run.runner import stage_key

    a = load_recipe(str(RG), check_trl=False)
    b = load_recipe(str(RG), {"curriculum": {"kind": "levels"}}, check_trl=False)
    policy = {"policy": {"stage": "sft", "fingerprint": "x", "version": 1}}
    assert stage_key("reward-dry-run", a, policy)[0] == stage_key("reward-dry-run", b, policy)[0]
    assert stage_key("grpo", a, policy)[0] != stage_key("grpo", b, policy)[0]
