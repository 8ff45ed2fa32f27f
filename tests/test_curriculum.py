"""The pass-rate table, the curriculum's set-aside rule and bands, and the guard's three findings, on
made-up rewards and curves (no training); and a shrunken GRPO run where the curriculum is visible in the
manifest (slow)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from regimen.stages.decide.verdicts import (
    HACKING,
    OVERFITTING,
    SHARPENING,
    Evaluation,
    decide,
    finding,
    guard_in_training,
    stops,
)
from regimen.stages.recipe.schema import CurriculumSection, CycleSection, GuardSection
from regimen.stages.training.curriculum import Curriculum
from regimen.stages.training.pass_rates import PassRates, prompt_id

ROWS = [{"prompt": f"Q: {i}+1=", "answer": str(i + 1)} for i in range(20)]


def ids(rows):
    return [prompt_id(r["prompt"]) for r in rows]


def test_prompt_ids_are_stable_and_follow_the_overlap_normalisation():
    assert prompt_id("Q: 1+1=") == prompt_id("  q:   1+1=  ")
    assert prompt_id("Q: 1+1=") != prompt_id("Q: 1+2=")
    assert prompt_id([{"role": "user", "content": "hi"}]) == prompt_id([{"content": "hi", "role": "user"}])


def test_pass_rates_table_counts_attempts_means_and_alike_streaks(tmp_path):
    rates = PassRates()
    a, b = ids(ROWS[:2])
    assert rates.add_groups([a] * 4 + [b] * 4, [1, 1, 1, 1, 0, 1, 0, 1], 4, step=3, source="grpo") == [True, False]
    rates.add_group(a, [1, 1, 1, 1], 9, "grpo")
    rates.add_group(a, [float("nan"), 0.0, 1.0, 1.0], 12, "grpo")  # an unscored attempt is left out
    ea, eb = rates.table[a], rates.table[b]
    assert (ea.attempts, ea.groups, ea.alike_streak, ea.last_seen) == (11, 3, 0, 12)
    assert ea.mean_reward == pytest.approx(10 / 11)
    assert (eb.attempts, eb.mean_reward, eb.alike_streak) == (4, 0.5, 0)
    rates.write(tmp_path)
    back = PassRates.read(tmp_path)
    assert back.rows() == rates.rows()
    assert {r["prompt_id"] for r in back.rows()} == {a, b}
    with pytest.raises(ValueError, match="not one prompt's group"):
        rates.add_groups([a, b], [1, 0], 2, 0, "grpo")
    (tmp_path / "pass_rates.jsonl").write_text("{not json")
    assert PassRates.read(tmp_path).table == {}  # unreadable: starts without, says so


def draw(cur: Curriculum, n: int) -> list[str]:
    return [cur.ids[cur.next_index()] for _ in range(n)]


def test_a_solved_prompt_is_set_aside_and_readmitted_later():
    cfg = CurriculumSection(readmit_after=10)
    cur = Curriculum(ROWS, cfg, seed=0)
    solved = cur.ids[0]
    cur.step = 5
    cur.observe([solved] * 4, [1.0] * 4, 4)
    assert solved in cur.aside and cur.counts["set_aside"] == 1
    assert solved not in draw(cur, 200)  # set aside: never drawn before step 15 ...
    assert cur.summary()["bands"]["set_aside"] == 1  # ... and counted aside, not in its band
    cur.step = 15
    # ... re-admitted after readmit_after steps (easy: 1 prompt x 0.1 against 19 x 0.7)
    assert solved in draw(cur, 3000)
    assert cur.counts["readmitted"] == 1 and cur.rates.table[solved].alike_streak == 0


def test_a_hopeless_prompt_likewise_and_varied_groups_stay():
    cfg = CurriculumSection(readmit_after=10, set_aside_after=2)
    cur = Curriculum(ROWS, cfg, seed=0)
    hopeless, varied = cur.ids[1], cur.ids[2]
    cur.observe([hopeless] * 4 + [varied] * 4, [0, 0, 0, 0, 0, 1, 0, 1], 4)
    assert hopeless not in cur.aside  # one all-alike group is not yet two in a row
    cur.observe([hopeless] * 4 + [varied] * 4, [0, 0, 0, 0, 1, 0, 0, 1], 4)
    assert hopeless in cur.aside and varied not in cur.aside
    assert cur.band(hopeless) == "hard" and cur.band(varied) == "normal"
    assert hopeless not in draw(cur, 100)
    cur.step = 10
    assert hopeless in draw(cur, 3000)  # hard: 1 prompt x 0.2 against 19 x 0.7


def test_bands_are_drawn_by_weight():
    cfg = CurriculumSection(weights={"easy": 0.0, "normal": 1.0, "hard": 0.0}, set_aside_after=99)
    cur = Curriculum(ROWS, cfg, seed=0)
    easy, hard = cur.ids[3], cur.ids[4]
    cur.observe([easy] * 4 + [hard] * 4, [1, 1, 1, 0, 0, 0, 0, 1], 4)  # mean 0.75 and 0.25: normal both ...
    cur.rates.table[easy].mean_reward, cur.rates.table[hard].mean_reward = 0.9, 0.1  # ... made easy and hard
    cur._enlist(3), cur._enlist(4)  # (as observe does when a prompt changes band)
    got = draw(cur, 300)
    assert easy not in got and hard not in got and len(set(got)) == 18
    assert cur.summary()["bands"] == {"easy": 1, "normal": 18, "hard": 1, "set_aside": 0}
    cur.cfg = CurriculumSection(weights={"easy": 0.0, "normal": 0.0, "hard": 1.0}, set_aside_after=99)
    assert set(draw(cur, 20)) == {hard}


def test_everything_set_aside_still_draws_and_state_round_trips():
    cur = Curriculum(ROWS[:2], CurriculumSection(readmit_after=100), seed=0)
    a, b = cur.ids
    cur.observe([a] * 2 + [b] * 2, [1, 1, 0, 0], 2)
    assert set(cur.aside) == {a, b}
    first = cur.ids[cur.next_index()]  # the one due first comes back rather than stalling the trainer
    assert first in (a, b)
    clone = Curriculum(ROWS[:2], CurriculumSection(readmit_after=100), seed=0)
    clone.load(json.loads(json.dumps(cur.state())))
    assert draw(clone, 10) == draw(cur, 10) and clone.counts == cur.counts


def test_earlier_stages_all_alike_prompts_start_aside():
    rates = PassRates()
    rates.add_group(prompt_id(ROWS[0]["prompt"]), [1.0] * 8, 0, "dry_run")
    cur = Curriculum(ROWS, CurriculumSection(readmit_after=7), seed=0, rates=rates)
    assert cur.ids[0] not in draw(cur, 100)
    cur.step = 7
    assert cur.ids[0] in draw(cur, 3000)


# -- the guard's findings --------------------------------------------------------------------------
GUARD = GuardSection()
RISING = [(10, 0.2), (20, 0.25), (30, 0.5), (40, 0.6)]  # sampled training reward +0.33
FLAT_PROBE = [(0, 0.40), (40, 0.40)]


def test_the_guard_tells_hacking_overfitting_and_sharpening_apart():
    evidence = guard_in_training(RISING, FLAT_PROBE, GUARD)
    assert evidence is not None
    # hacking: the greedy reward on training prompts rose with the sampled one, greedy accuracy flat
    assert finding(evidence, [(0, 0.4, 0.3), (40, 0.4, 0.9)], GUARD) == HACKING
    # overfitting: greedy accuracy on training prompts rose, held-out did not
    assert finding(evidence, [(0, 0.4, 0.4), (40, 0.7, 0.7)], GUARD) == OVERFITTING
    # sharpening: greedy already scored ~0.6 before training; sampling climbs toward it, both flat
    assert finding(evidence, [(0, 0.6, 0.6), (40, 0.6, 0.61)], GUARD) == SHARPENING
    # ... but a sampled reward well past the greedy level is not sharpening
    assert finding({**evidence, "train_reward_now": 0.9}, [(0, 0.6, 0.6), (40, 0.6, 0.61)], GUARD) == HACKING
    # no training-prompt probe: it cannot tell, and says hacking (the old, cautious reading)
    assert finding(evidence, [], GUARD) == HACKING
    assert stops(HACKING, GUARD) and not stops(OVERFITTING, GUARD) and not stops(SHARPENING, GUARD)
    assert stops(OVERFITTING, GuardSection(on_overfitting="stop")) and not stops(HACKING, GuardSection(action="warn"))


def test_the_verdict_after_a_round_follows_its_finding():
    cfg = CycleSection(max_cycles=1, guard=GUARD)
    history = [Evaluation(1, 0, 0.5), Evaluation(1, 1, 0.5, train_reward=0.8, train_reward_first=0.3)]
    assert decide(history, cfg).verdict == "reward-hacking-suspected"
    sharp = history[:1] + [Evaluation(1, 1, 0.5, 0.8, 0.3, finding=SHARPENING)]
    d = decide(sharp, cfg)
    assert d.verdict != "reward-hacking-suspected" and "sharpening" in d.warning
    over = history[:1] + [Evaluation(1, 1, 0.5, 0.8, 0.3, finding=OVERFITTING)]
    assert "overfitting" in decide(over, cfg).warning
    assert (
        decide(over, CycleSection(max_cycles=1, guard=GuardSection(on_overfitting="stop"))).verdict
        == "overfitting-suspected"
    )


def test_the_probe_names_and_stops_only_on_hacking():
    from regimen.stages.training.probe import HeldoutProbe

    recipe = SimpleNamespace(cycle=SimpleNamespace(guard=GUARD), probe=SimpleNamespace(steps=10, keep="last"))
    probe = HeldoutProbe.__new__(HeldoutProbe)
    probe.recipe, probe.fired, probe.noted, probe.warning = recipe, None, None, None

    def history(train_probe):
        log = [{"step": s, "reward": r} for s, r in RISING]
        for (s, acc), (_, ta, tr) in zip([(0, 0.4), (30, 0.4), (40, 0.4)], train_probe):
            log.append({"step": s, "heldout_probe": acc, "train_probe": ta, "train_probe_reward": tr})
        return SimpleNamespace(log_history=log)

    probe.recheck(history([(0, 0.6, 0.6), (30, 0.6, 0.6), (40, 0.6, 0.62)]))
    assert probe.fired is None and probe.noted["finding"] == SHARPENING and not probe.fired_and_stopped()
    probe.recheck(history([(0, 0.3, 0.2), (30, 0.3, 0.6), (40, 0.3, 0.9)]))
    assert probe.fired["finding"] == HACKING and probe.fired_and_stopped()


def test_alike_again_waits_twice_as_long():
    cur = Curriculum(ROWS, CurriculumSection(readmit_after=10), seed=0)
    pid = cur.ids[5]
    cur.observe([pid] * 4, [1.0] * 4, 4)
    assert cur.aside[pid] == 10
    cur.step = 10
    assert cur.active(pid)
    cur.observe([pid] * 4, [1.0] * 4, 4)
    assert cur.aside[pid] == 10 + 20


# -- a shrunken run -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_shrunken_run_shows_the_curriculum_in_its_manifest_and_resumes_with_it(tmp_path, tiny_recipe, monkeypatch):
    """The tiny recipe with a curriculum that sets prompts aside quickly: the manifest counts the bands,
    set-asides and skipped groups; the pass-rate tables of the dry run, GRPO and evaluation are stored;
    the log carries the bands beside frac_reward_zero_std; a crash mid-GRPO resumes with the curriculum's
    state from the checkpoint."""
    from conftest import run_flow

    from regimen.stages.core.errors import RegimenError
    from regimen.stages.store import Store

    overrides = {
        "curriculum.enabled": True,
        "grpo.max_steps": 12,
        "grpo.save_steps": 4,
        "grpo.logging_steps": 2,
        "curriculum.readmit_after": 3,
        "data.train_size": 60,
        "probe.steps": 4,
        "probe.prompts": 8,
        "probe.train_prompts": 8,
    }
    monkeypatch.setenv("REGIMEN_FAULT", "grpo@5")
    with pytest.raises(RegimenError):
        run_flow(tiny_recipe, tmp_path, overrides=overrides)
    work = next((tmp_path / "tiny-test" / "grpo" / "work").iterdir())
    saved = json.loads((work / "checkpoint-4" / "curriculum.json").read_text())
    assert saved["step"] >= 3 and saved["counts"]["draws"] > 0
    monkeypatch.delenv("REGIMEN_FAULT")
    results = run_flow(tiny_recipe, tmp_path, overrides=overrides)
    grpo = next(r for r in results if r["stage"] == "grpo")
    assert grpo["resumed_from_step"] == 4
    m = Store(tmp_path).scan("tiny-test", "grpo")[0][-1]
    cur = m["curriculum"]
    assert set(cur["bands"]) == {"easy", "normal", "hard", "set_aside"} and sum(cur["bands"].values()) > 0
    assert cur["set_aside"] > 0 and cur["readmitted"] > 0 and cur["groups_skipped"] > 0
    assert cur["draws"] > saved["counts"]["draws"]  # it went on from the saved state, not from scratch
    assert m["metrics"]["curriculum_set_aside"] == cur["set_aside"]
    exp = tmp_path / "tiny-test"
    for stage in ("reward-dry-run", "grpo", "eval"):
        rows = [json.loads(line) for line in (exp / stage / "v1" / "pass_rates.jsonl").read_text().splitlines()]
        assert rows and {"prompt_id", "attempts", "mean_reward", "last_seen"} <= set(rows[0]), stage
    log = [json.loads(line) for line in (exp / "grpo" / "v1" / "train_log.jsonl").read_text().splitlines()]
    assert any("curriculum/set_aside" in h and "frac_reward_zero_std" in h for h in log)
    assert any("train_probe" in h and "train_probe_reward" in h for h in log)
    assert m["torch_cpu_capability"]


def test_a_reward_that_pays_wrong_answers_is_hacking_even_when_greedy_already_collected_it():
    """configs/hackable.yaml: greedy decoding already wrote digits (digits reward 1.0, every answer wrong);
    the sampled reward climbs to it. Without the precision it would read as sharpening."""
    from regimen.stages.training.probe import precision

    evidence = guard_in_training(RISING, FLAT_PROBE, GUARD)
    flat_greedy = [(0, 0.0, 1.0), (40, 0.0, 1.0)]
    assert finding(evidence, flat_greedy, GUARD) == SHARPENING  # the old reading, without precision
    paid = precision([0.0] * 8, [1.0] * 8)
    assert paid == 0.0
    assert finding(evidence, [(0, 0.0, 1.0, paid), (40, 0.0, 1.0, paid)], GUARD) == HACKING
    # an honest reward pays right answers: sharpening stays sharpening
    right = precision([1.0, 1.0, 0.0, None], [1.1, 1.1, 0.1, 0.0])
    assert right == 1.0
    assert finding(evidence, [(0, 0.6, 0.6, right), (40, 0.6, 0.61, right)], GUARD) == SHARPENING
    assert precision([0.0, 1.0], [0.0, 0.0]) is None  # nothing paid: no opinion


def test_weights_are_per_prompt_so_a_small_band_is_not_drawn_over_and_over():
    """Six normal prompts among many easy ones: with per-prompt weights 0.1 / 0.7 the normal band gets its
    share by its size (7 x 6 against 1 x 14 here: 42 / 56 of the draws), not 70% of every draw."""
    cfg = CurriculumSection(weights={"easy": 0.1, "normal": 0.7, "hard": 0.2}, set_aside_after=1, readmit_after=10**6)
    cur = Curriculum(ROWS, cfg, seed=0)
    for pid in cur.ids[6:]:
        cur.observe([pid] * 4, [1, 1, 1, 0.9], 4)  # mean 0.975: easy (varied, so never set aside)
    assert cur.summary()["bands"] == {"easy": 14, "normal": 6, "hard": 0, "set_aside": 0}
    got = draw(cur, 5600)
    normal = sum(1 for pid in got if pid in set(cur.ids[:6]))
    assert 0.68 < normal / len(got) < 0.82, normal / len(got)  # 42 / 56 = 0.75
    cur.observe([cur.ids[0]] * 4, [1, 1, 1, 0.9], 4)  # one normal prompt becomes easy: the shares follow at once
    cur.observe([cur.ids[1]] * 4, [0.5] * 4, 4)  # another scores all alike (half its tests, every attempt): aside
    assert cur.summary()["bands"] == {"easy": 15, "normal": 4, "hard": 0, "set_aside": 1}
    got = draw(cur, 2000)
    # TRL's own shuffle would have drawn it: groups skipped
    assert cur.ids[1] not in got and cur.counts["groups_skipped"] > 0
    # 4 x 0.7 against 15 x 0.1: 2.8 / 4.3 = 0.65
    assert 0.55 < sum(1 for pid in got if pid in set(cur.ids[2:6])) / len(got) < 0.75
