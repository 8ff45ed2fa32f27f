"""The screen in front of GRPO's prompts (`curriculum.skip_all_alike`, `stages/training/screen.py`) on scripted
answers: a candidate whose screening answers all score alike is skipped, one whose answers differ enters; what it saw
sets the prompt aside in the curriculum's history, which re-admits it later; a pool that is all alike never stalls
the trainer (a candidate enters unscreened after a bounded number of rounds); its state survives a checkpoint."""

from __future__ import annotations

import itertools
import json

import pytest
from conftest import TINY

from regimen.stages.recipe import load_recipe
from regimen.stages.training import screen as screening
from regimen.stages.training.curriculum import Curriculum
from regimen.stages.training.screen import MAX_ROUNDS, Rows, Screen

ROWS = [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(6)]
SOLVED, HOPELESS, HALF = {"0+1=", "1+1="}, {"2+1=", "3+1="}, {"4+1=", "5+1="}


def scripted(rows, num_return_sequences, **_):
    """The policy's answers: right every time, wrong every time, or right then wrong, by prompt."""
    out = []
    for r in rows:
        right, wrong = r["answer"], "x"
        if r["prompt"] in SOLVED:
            out.append([right] * num_return_sequences)
        elif r["prompt"] in HOPELESS:
            out.append([wrong] * num_return_sequences)
        else:
            out.append([right if k % 2 == 0 else wrong for k in range(num_return_sequences)])
    return out, None


@pytest.fixture
def recipe():
    return load_recipe(
        TINY,
        check_trl=False,
        overrides={
            "curriculum.skip_all_alike": True,
            "curriculum.screen_batch": 6,
            "curriculum.readmit_after": 5,
            "rewards": [{"name": "answer", "weight": 1.0}],
        },
    )


@pytest.fixture(autouse=True)
def answers(monkeypatch):
    # where the screen looks it up (imported at the top of screen.py)
    monkeypatch.setattr(screening, "complete", lambda model, tok, recipe, rows, **kw: scripted(rows, **kw))


def test_alike_candidates_are_skipped_and_varied_ones_enter(recipe):
    screen = Screen(recipe, Rows(ROWS, seed=0))
    screen.model = object()  # the live policy (answers are scripted)
    drawn = [r["prompt"] for r in itertools.islice(screen.stream(), 6)]
    assert set(drawn) == HALF
    assert screen.counts["skipped"] >= 4 and screen.counts["samples"] == screen.counts["screened"] * 4
    assert screen.summary()["seconds"] == round(screen.seconds, 3) and screen.seconds > 0  # its cost, timed


def test_the_screen_feeds_the_history_which_sets_aside_and_readmits(recipe):
    cur = Curriculum(ROWS, recipe.curriculum, seed=0)
    screen = Screen(recipe, cur)
    screen.model = object()
    list(itertools.islice(screen.stream(), 2))
    aside = {r["prompt"] for r in ROWS if r["prompt"] in SOLVED | HOPELESS}
    assert aside and all(not cur.active(cur.ids[ROWS.index(next(r for r in ROWS if r["prompt"] == p))]) for p in aside)
    cur.step = 5  # readmit_after steps later they are drawn again
    assert all(cur.active(cur.ids[i]) for i in range(len(ROWS)))
    assert cur.counts["readmitted"] >= len(aside)


def test_a_pool_of_alike_prompts_never_stalls_the_trainer(recipe):
    rows = [r for r in ROWS if r["prompt"] in SOLVED]
    screen = Screen(recipe, Rows(rows, seed=0))
    screen.model = object()
    first = next(screen.stream())
    assert first["prompt"] in SOLVED
    assert screen.counts["unscreened"] == 1 and screen.counts["screened"] == MAX_ROUNDS * 6


def test_its_state_survives_a_checkpoint(recipe):
    screen = Screen(recipe, Rows(ROWS, seed=0))
    screen.model = object()
    stream = screen.stream()
    list(itertools.islice(stream, 1))
    saved = json.loads(json.dumps(screen.state()))
    rest = [r["prompt"] for r in itertools.islice(stream, 5)]
    again = Screen(recipe, Rows(ROWS, seed=0))
    again.model = object()
    again.load(saved)
    assert [r["prompt"] for r in itertools.islice(again.stream(), 5)] == rest
    assert again.counts["screened"] >= saved["counts"]["screened"]
    assert again.seconds >= saved["seconds"] > 0


def test_no_policy_yet_or_one_sample_means_no_screen(recipe):
    screen = Screen(recipe, Rows(ROWS, seed=0))
    assert len(list(itertools.islice(screen.stream(), 6))) == 6 and screen.counts["screened"] == 0


def test_a_killed_grpo_resumes_its_screen_from_the_checkpoint(tmp_path):
    """SIGKILL as GRPO's step 4 ends (before its checkpoint): the rerun resumes from step 2's checkpoint with the
    screen's counts and place in the rows restored, so its counts go on rising rather than starting again."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from regimen.stages.store import Store

    store = tmp_path / "store"
    args = [
        str(Path(sys.executable).parent / "regimen"),
        "run",
        str(TINY),
        "--store",
        str(store),
        "--set",
        "curriculum.skip_all_alike=true",
        "--set",
        "grpo.max_steps=6",
        "--set",
        "grpo.save_steps=2",
    ]
    env = {**os.environ, "REGIMEN_KILL": "grpo@4"}
    killed = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode != 0, killed.stderr[-2000:]
    env.pop("REGIMEN_KILL")
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    st = Store(store)
    [grpo] = st.scan("tiny-test", "grpo")[0] or pytest.fail(done.stderr[-3000:])
    assert grpo["resumed_from_step"] == 2
    log = [json.loads(x) for x in (st.local_path(grpo) / "train_log.jsonl").read_text().splitlines()]
    screened = [(h["step"], h["screen/screened"]) for h in log if "screen/screened" in h]
    assert [s for s, _ in screened] == [2, 4, 6], screened
    counts = [c for _, c in screened]
    assert counts == sorted(counts) and counts[0] > 0 and counts[-1] > counts[0], screened
    assert grpo["curriculum"]["screen"]["screened"] == counts[-1]
    assert grpo["sampler"]["screen"] is True and grpo["config"]["curriculum"]["skip_all_alike"] is True
    # the screen's answers went back to their groups (training/reuse.py): the resumed run reused some, and every
    # group it built from kept answers scored varied (tiny's screen_samples = num_generations: whole groups reused)
    reused = grpo["curriculum"]["screen"]["reuse"]["reused"]
    groups = [
        g
        for line in (st.local_path(grpo) / "groups.jsonl").read_text().splitlines()
        for g in json.loads(line)["groups"]
        if json.loads(line)["step"] > 2
    ]
    g = grpo["config"]["grpo"]["num_generations"]
    assert reused > 0 and sum(x["alike"] for x in groups) <= len(groups) - reused // g, (reused, groups)


def test_the_report_shows_grpo_s_groups_trained_skipped_and_all_alike():
    from regimen.flows.present.report import groups

    grpo = {
        "metrics": {"steps": 10.0, "frac_reward_zero_std_mean": 0.25},
        "config": {"grpo": {"num_generations": 4, "per_device_train_batch_size": 16}, "curriculum": None},
        "curriculum": {},
    }
    assert groups(grpo) == "40 trained, all-alike 10 of 40"
    grpo["config"]["curriculum"] = {"skip_all_alike": True}
    grpo["curriculum"] = {"groups_skipped": 3, "screen": {"skipped": 7}}
    assert groups(grpo) == "30 trained, skipped 10 (history 3, screen 7), all-alike 10 of 40 (out of the loss)"
    grpo["curriculum"]["screen"]["reuse"] = {"reused": 24}
    assert groups(grpo).endswith("(out of the loss); 24 screening answers reused in their groups")
