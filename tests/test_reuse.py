"""The screen's answers reused as the first attempts of their group (`curriculum.screen_reuse`,
`stages/training/reuse.py`, through TRL's `rollout_func`): on a real tiny policy and a real `GRPOTrainer`, the kept
answers come back first and the rest of the group is sampled, with the prompt tokenized exactly as TRL tokenizes it
and each completion cut after its end-of-sequence token; answers too old are dropped and their group generated whole;
reuse is off where TRL would not take the answers back."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, TINY

from regimen.stages.recipe import load_recipe
from regimen.stages.training import reuse

A, B = "3+4=", "11+2="


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from regimen.stages.tasks.registry import load_task
    from regimen.stages.training import sampler, trajectories
    from regimen.stages.training.grpo_trainer import build_trainer
    from regimen.stages.training.model import build_tiny_model
    from regimen.stages.training.pass_rates import PassRates

    tmp = tmp_path_factory.mktemp("reuse")
    recipe = load_recipe(TINY, overrides={"curriculum.skip_all_alike": True, "curriculum.screen_samples": 2})
    policy = str(build_tiny_model(recipe.model.tiny.model_dump(), tmp / "model"))
    recorder = trajectories.Recorder()
    task = load_task(recipe.data, None)
    prompts = sampler.build(recipe, task, task.train, PassRates.read(None), recorder)
    trainer, _ = build_trainer(recipe, policy, tmp / "out", recorder, sampler=prompts, alike=True)
    assert prompts.rollout is not None and trainer.rollout_func is prompts.rollout
    assert prompts.screen.answers is prompts.rollout and prompts.rollout.trainer is trainer
    assert "its answers are the first attempts of the group" in prompts.reason
    return trainer, prompts.rollout


def fresh(answers: reuse.Answers) -> reuse.Answers:
    out = reuse.Answers()
    out.trainer = answers.trainer
    return out


def test_kept_answers_come_first_and_the_rest_is_sampled_as_trl_samples(built):
    trainer, answers = built
    answers = fresh(answers)
    g = trainer.num_generations
    tok = trainer.processing_class
    trainer.state.global_step = 3
    kept = [tok("7", add_special_tokens=False)["input_ids"], tok("8", add_special_tokens=False)["input_ids"]]
    answers.keep(A, kept, step=2)
    out = answers([A] * g + [B] * g, trainer)
    # TRL's own tokenization of the same prompts is the reference (read from its method, in this test only)
    trl_ids = trainer._tokenize_prompts([A, B])[0]
    assert out["prompt_ids"] == [trl_ids[0]] * g + [trl_ids[1]] * g
    assert out["completion_ids"][:2] == kept and len(out["completion_ids"]) == 2 * g and out["logprobs"] is None
    eos = set(trainer.eos_token_ids)
    for c in out["completion_ids"][2:]:
        assert 0 < len(c) <= trainer.max_completion_length
        assert not eos & set(c[:-1])  # cut after the first end-of-sequence token, as TRL cuts
    assert answers.summary() == {"reused": 2, "generated": 2 * g - 2, "dropped_old": 0, "mean_age": 1.0}
    assert answers.kept == {}  # handed back once


def test_answers_too_old_are_dropped_and_their_group_generated_whole(built):
    trainer, answers = built
    answers = fresh(answers)
    g = trainer.num_generations
    answers.keep(A, [[5], [6]], step=0)
    trainer.state.global_step = reuse.MAX_AGE + 1
    out = answers([A] * g, trainer)
    assert [5] not in out["completion_ids"] and len(out["completion_ids"]) == g
    assert answers.summary()["dropped_old"] == 1 and answers.summary()["reused"] == 0


def test_the_screen_keeps_the_answers_of_what_it_admits_sampled_through_the_trainer(built):
    trainer, answers = built
    answers = fresh(answers)
    from regimen.stages.training.screen import Rows, Screen

    recipe = load_recipe(TINY, overrides={"curriculum.skip_all_alike": True, "curriculum.screen_samples": 2})
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(8) for b in range(8)]

    def scorer(prompts, completions, cols):  # the untrained policy fails every prompt: half its groups scored as varied
        return SimpleNamespace(totals=[float(i % 2 and int(p.split("+")[0]) % 2) for i, p in enumerate(prompts)])

    screen = Screen(recipe, Rows(rows, seed=0), scorer=scorer)
    screen.model, screen.tokenizer, screen.answers = trainer.model, trainer.processing_class, answers
    admitted = screen.screen(rows[:32])
    kept = sum(len(q) for q in answers.kept.values())
    assert len(admitted) == 16, screen.counts
    assert kept == len(admitted) == screen.counts["admitted"]
    for c in admitted:  # each admitted candidate's kept answers are its two screening answers, as token ids
        [(step, ids)] = answers.kept[reuse.key(c["prompt"])]
        assert len(ids) == 2 and all(isinstance(t, int) for i in ids for t in i)


def test_reuse_is_off_where_trl_would_not_hand_the_answers_back():
    on = load_recipe(TINY, check_trl=False, overrides={"curriculum.skip_all_alike": True})
    assert reuse.possible(on) == (True, "")
    off = load_recipe(
        TINY, check_trl=False, overrides={"curriculum.skip_all_alike": True, "curriculum.screen_reuse": False}
    )
    assert reuse.possible(off)[0] is False
    env = load_recipe(Path(ROOT / "configs" / "tiny-env.yaml"), check_trl=False)
    ok, why = reuse.possible(env)
    assert not ok and why.startswith("environment:")


def test_kept_answers_survive_the_checkpoint_state():
    import json

    answers = reuse.Answers()
    answers.keep(A, [[1, 2], [3]], step=4)
    answers.keep([{"role": "user", "content": B}], [[9]], step=5)
    again = reuse.Answers()
    again.load(json.loads(json.dumps(answers.state())))
    assert again.take(A, 5, 8) == [[1, 2], [3]]
    assert again.take([{"role": "user", "content": B}], 5, 8) == [[9]] and again.kept == {}


def test_a_malformed_kept_state_raises_and_keeps_what_was_there():
    answers = reuse.Answers()
    answers.keep(A, [[1]], step=0)
    with pytest.raises((ValueError, TypeError)):
        answers.load([[A, 0, [[2]]], ["broken"]])
    assert answers.take(A, 0, 8) == [[1]]
