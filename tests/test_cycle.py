"""The cycle decision, every branch, without training anything."""

import pytest

from regimen.stages.decide.verdicts import (
    BACK_TO_SFT,
    BUDGET_SPENT,
    CONTINUE,
    REWARD_HACKING,
    STALLED,
    TARGET_REACHED,
    Evaluation,
    decide,
    hacking_evidence,
)
from regimen.stages.recipe.schema import CycleSection, GuardSection


def cfg(**kw):
    guard = kw.pop("guard", {})
    return CycleSection(
        **{"max_cycles": 3, "max_rounds": 3, "target": 0.95, "min_delta": 0.02, "patience": 1, **kw},
        guard=GuardSection(**guard),
    )


def sft(cycle, acc):
    return Evaluation(cycle, 0, acc)


def grpo(cycle, rnd, acc, train=0.5, first=0.45):
    return Evaluation(cycle, rnd, acc, train, first)


def test_target_reached():
    assert decide([sft(1, 0.5), grpo(1, 1, 0.96)], cfg()).verdict == TARGET_REACHED


def test_continue_when_the_round_gained():
    d = decide([sft(1, 0.5), grpo(1, 1, 0.6)], cfg())
    assert d.verdict == CONTINUE and d.evidence["gain"] == pytest.approx(0.1)


def test_back_to_sft_when_stalled_and_cycles_remain():
    assert decide([sft(1, 0.5), grpo(1, 1, 0.51)], cfg()).verdict == BACK_TO_SFT


def test_patience_allows_rounds_without_gain():
    h = [sft(1, 0.5), grpo(1, 1, 0.6), grpo(1, 2, 0.605)]
    assert decide(h, cfg(patience=2)).verdict == CONTINUE
    h.append(grpo(1, 3, 0.61))
    assert decide(h, cfg(patience=2, max_rounds=5)).verdict == BACK_TO_SFT


def test_out_of_rounds_goes_back_to_sft_then_budget_spent():
    h = [sft(1, 0.3), grpo(1, 1, 0.5)]
    assert decide(h, cfg(max_rounds=1)).verdict == BACK_TO_SFT
    assert decide(h, cfg(max_rounds=1, max_cycles=1)).verdict == BUDGET_SPENT


def test_stalled_in_last_cycle():
    h = [sft(1, 0.5), grpo(1, 1, 0.7), sft(2, 0.7), grpo(2, 2 - 1, 0.7)]
    assert decide(h, cfg(max_cycles=2)).verdict == STALLED


def test_stall_count_is_per_cycle():
    # cycle 1 stalled; cycle 2's first round gained, so it continues
    h = [sft(1, 0.5), grpo(1, 1, 0.5), sft(2, 0.55), grpo(2, 1, 0.7)]
    assert decide(h, cfg()).verdict == CONTINUE


def test_reward_hacking_stops_and_warn_mode_continues():
    h = [sft(1, 0.40), grpo(1, 1, 0.41, train=0.95, first=0.30)]
    d = decide(h, cfg())
    assert d.verdict == REWARD_HACKING
    assert d.evidence["train_reward_rise"] == pytest.approx(0.65) and d.evidence["heldout_gain"] == pytest.approx(0.01)
    w = decide(h, cfg(guard={"action": "warn"}))
    assert w.verdict == BACK_TO_SFT and "learning to please the reward" in w.warning


def test_rising_reward_with_rising_heldout_is_not_hacking():
    h = [sft(1, 0.40), grpo(1, 1, 0.70, train=0.9, first=0.3)]
    assert hacking_evidence(h, GuardSection()) is None
    assert decide(h, cfg()).verdict == CONTINUE


def test_guard_measures_from_the_cycles_first_round():
    h = [sft(1, 0.40), grpo(1, 1, 0.45, train=0.45, first=0.30), grpo(1, 2, 0.42, train=0.60, first=0.45)]
    ev = hacking_evidence(h, GuardSection(train_rise=0.2, heldout_gain=0.05))
    assert ev is not None and ev["train_reward_start"] == 0.30 and ev["train_reward_rise"] == pytest.approx(0.30)


def test_hacking_takes_precedence_over_target():
    h = [sft(1, 0.96), grpo(1, 1, 0.96, train=0.9, first=0.1)]
    assert decide(h, cfg()).verdict == REWARD_HACKING


@pytest.mark.parametrize("acc,expected", [(0.95, TARGET_REACHED), (0.949, BUDGET_SPENT)])
def test_target_boundary(acc, expected):
    assert decide([sft(1, 0.5), grpo(1, 1, acc)], cfg(max_cycles=1, max_rounds=1)).verdict == expected


def test_empty_history_is_an_error():
    with pytest.raises(ValueError):
        decide([], cfg())


# -- the guard while GRPO trains -------------------------------------------------------------------

from regimen.stages.decide.verdicts import guard_in_training  # noqa: E402


def test_guard_fires_when_training_reward_climbs_and_the_probe_does_not():
    train = [(10, 0.30), (20, 0.45), (30, 0.62)]
    probe = [(0, 0.10), (25, 0.11)]
    ev = guard_in_training(train, probe, GuardSection())
    assert ev is not None
    assert ev["train_reward_rise"] == pytest.approx(0.32) and ev["heldout_gain"] == pytest.approx(0.01)
    assert ev["probe_step"] == 25 and ev["train_reward_curve"][-1] == [30, 0.62]


def test_guard_does_not_fire_when_the_probe_rises_with_the_reward():
    assert guard_in_training([(10, 0.30), (30, 0.62)], [(0, 0.10), (25, 0.30)], GuardSection()) is None


def test_guard_does_not_fire_on_a_small_rise_or_before_two_probes():
    # rise 0.15 < 0.2
    assert guard_in_training([(10, 0.30), (30, 0.45)], [(0, 0.10), (25, 0.10)], GuardSection()) is None
    # no probe after training began
    assert guard_in_training([(10, 0.30), (30, 0.90)], [(0, 0.10)], GuardSection()) is None
    assert guard_in_training([], [(0, 0.1), (10, 0.1)], GuardSection()) is None


def test_guard_thresholds_come_from_the_recipe_and_warn_is_the_callers_choice():
    train, probe = [(10, 0.30), (30, 0.45)], [(0, 0.10), (25, 0.10)]
    assert guard_in_training(train, probe, GuardSection(train_rise=0.1)) is not None
    assert guard_in_training([(10, 0.3), (30, 0.9)], [(0, 0.1), (25, 0.2)], GuardSection(heldout_gain=0.2)) is not None
    # the rule is the same in warn mode; the stage decides to stop or to record a warning
    assert guard_in_training(train, probe, GuardSection(train_rise=0.1, action="warn")) is not None
