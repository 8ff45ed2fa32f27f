"""The probe inside GRPO keeps the best-probing weights (ties: the later step), restores them, and the
guard's in-training verdict reaches the stage; on a shrunken hackable run the stage stops early."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY, run_cli

from regimen.stages.recipe import load_recipe
from regimen.stages.training.probe import HeldoutProbe, restore_best


class Scripted(HeldoutProbe):
    def __init__(self, recipe, work, accuracies):
        super().__init__(recipe, rows=[], tokenizer=None, work_dir=work)
        self.accuracies = list(accuracies)

    def measure(self, model):
        return self.accuracies.pop(0)


def test_best_checkpoint_selection_keeps_the_best_step_ties_to_the_later_one(tmp_path):
    recipe = load_recipe(TINY, check_trl=False)
    probe = Scripted(recipe, tmp_path, [0.10, 0.50, 0.30, 0.50, 0.20])
    model = torch.nn.Linear(2, 2)
    state = SimpleNamespace(global_step=0, log_history=[])
    weights = {}
    for step in (0, 10, 20, 30, 40):
        with torch.no_grad():
            model.weight.fill_(float(step))
        weights[step] = model.weight.clone()
        state.global_step = step
        probe._probe(state, model)
    assert probe.best() == {"step": 30, "heldout_accuracy": 0.5}
    assert [h["heldout_probe"] for h in state.log_history] == [0.10, 0.50, 0.30, 0.50, 0.20]
    assert HeldoutProbe.curve(state.log_history)[-1] == {"step": 40, "heldout_accuracy": 0.2}
    restored = torch.nn.Linear(2, 2)
    assert restore_best(restored, probe.best_dir) == {"step": 30, "heldout_accuracy": 0.5}
    assert torch.equal(restored.weight, weights[30])
    assert not list(tmp_path.glob(".best-*"))  # earlier bests replaced whole, none left half-written


def test_keep_last_saves_no_best(tmp_path):
    recipe = load_recipe(TINY, ["probe.keep=last"], check_trl=False)
    probe = Scripted(recipe, tmp_path, [0.1, 0.9])
    state = SimpleNamespace(global_step=0, log_history=[])
    for step in (0, 10):
        state.global_step = step
        probe._probe(state, torch.nn.Linear(2, 2))
    assert probe.best() is None


def test_the_guard_fires_in_the_probe_and_says_so_in_warn_mode(tmp_path):
    recipe = load_recipe(TINY, ["cycle.guard.action=warn"], check_trl=False)
    probe = Scripted(recipe, tmp_path, [0.1, 0.1, 0.1])
    state = SimpleNamespace(global_step=0, log_history=[])
    probe._probe(state, torch.nn.Linear(2, 2))
    state.log_history += [{"step": 2, "reward": 0.2}, {"step": 4, "reward": 0.7}]
    state.global_step = 4
    probe._probe(state, torch.nn.Linear(2, 2))
    assert probe.fired is None  # the rule holds at one probe: not yet (a noisy probe never ends a run alone)
    state.log_history += [{"step": 6, "reward": 0.8}, {"step": 8, "reward": 0.9}]
    state.global_step = 8
    probe._probe(state, torch.nn.Linear(2, 2))
    assert probe.warned["step"] == 8 and probe.warned["train_reward_rise"] == pytest.approx(0.85 - 0.45)
    assert "guard (warn): hacking" in probe.warning and probe.fired is None and not probe.fired_and_stopped()


def test_the_guard_is_re_read_from_a_restored_history(tmp_path):
    """A resumed (or already finished) run re-reads its curves: a stop recorded before the kill holds."""
    recipe = load_recipe(TINY, check_trl=False)
    probe = Scripted(recipe, tmp_path, [])
    history = [
        {"step": 0, "heldout_probe": 0.1},
        {"step": 2, "reward": 0.2},
        {"step": 4, "reward": 0.5},
        {"step": 4, "heldout_probe": 0.1},
        {"step": 6, "reward": 0.8},
        {"step": 8, "reward": 0.9},
        {"step": 8, "heldout_probe": 0.1},
    ]
    probe.recheck(SimpleNamespace(global_step=8, log_history=history))
    assert probe.fired_and_stopped() and probe.fired["step"] == 8


HACKABLE_TINY = [
    "rewards=[{name: digits}, {name: answer, weight: 0}]",
    "sft.max_steps=24",
    "grpo.max_steps=60",
    "grpo.learning_rate=2e-3",
    "grpo.per_device_train_batch_size=64",
    "grpo.num_generations=8",
    "grpo.save_steps=100",
    "probe.steps=5",
    "probe.prompts=40",
    "grpo.logging_steps=5",
    "dry_run.gameable=warn",  # the audit names digits gameable; trained on anyway, for the guard
]


@pytest.mark.slow
def test_a_shrunken_hackable_run_stops_early_with_the_evidence(tmp_path, capsys):
    store = tmp_path / "store"
    code, out, err = run_cli(
        [
            "run",
            str(TINY),
            "--store",
            str(store),
            "--experiment",
            "hack",
            *sum((["--set", s] for s in HACKABLE_TINY), []),
        ],
        capsys,
    )
    assert code == 1, (out, err)
    assert "reward-hacking-suspected" in err and "grpo" in err
    [attempt] = list((store / "hack" / "grpo" / "failed").iterdir())
    record = json.loads((attempt / "error.json").read_text())
    assert record["guard_fired_at_step"] < 60, record["guard_fired_at_step"]  # stopped early, before its 60 steps
    evidence = record["guard_evidence"]
    assert evidence["train_reward_rise"] >= 0.2 and evidence["heldout_gain"] < 0.02
    assert record["heldout_probe"][0]["step"] == 0
    rows = [json.loads(line) for line in (attempt / "trajectories.jsonl").read_text().splitlines()]
    # the monitor is logged beside the trained reward
    assert rows and all(set(r["rewards"]) == {"digits", "answer"} for r in rows)
    log = [json.loads(line) for line in (attempt / "train_log.jsonl").read_text().splitlines()]
    assert any("rewards/answer/mean" in h for h in log) and any("heldout_probe" in h for h in log)
