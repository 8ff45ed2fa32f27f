"""One notion of "correct" (`rewards/scoring.py`): the probe inside GRPO and the evaluation stage score a checkpoint's
held-out set alike, row for row, including completions on which the two exact matches Regimen used to have (the
`evaluate` module on raw completions, the `answer` reward on a completion's text) disagreed; the weighted total's one
None rule; the shipped `evaluate` module judges as the scoring module does."""

from __future__ import annotations

import math

import pytest
from conftest import ROOT, TINY

from regimen.stages.recipe import load_recipe
from regimen.stages.rewards import first_line, normalize_answer
from regimen.stages.rewards.scoring import Scorer, as_trained, exact_correct, passes, weighted_total


def old_evaluate_match(pred, ref) -> float | None:
    """The held-out accuracy's rule before the scoring module (evaluate's exact_match on the raw completion, its
    reference turned into text with `str`), kept here only to show that the rows below are ones it got wrong. None:
    it could not judge at all (`evaluate` refused a chat completion: "Predictions ... don't match the expected
    format", so a chat recipe with exact_match could not be evaluated)."""
    if not isinstance(pred, str):
        return None
    want = normalize_answer(str(ref))
    return float(want is not None and normalize_answer(first_line(pred or "")) == want)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from regimen.stages.training.model import build_tiny_model, load_policy

    recipe = load_recipe(TINY, check_trl=False)
    folder = build_tiny_model(recipe.model.tiny.model_dump(), tmp_path_factory.mktemp("ckpt") / "model")
    model, tokenizer = load_policy(str(folder), recipe)
    return recipe, model, tokenizer


def test_the_probe_and_the_evaluation_agree_row_for_row(checkpoint, tmp_path, monkeypatch):
    from regimen.stages.tasks.registry import load_task
    from regimen.stages.training import episodes, heldout
    from regimen.stages.training import probe as probing
    from regimen.stages.training.heldout import heldout_eval
    from regimen.stages.training.probe import HeldoutProbe

    recipe, model, tokenizer = checkpoint
    rows = [dict(r) for r in load_task(recipe.data).heldout[:10]]
    rows[3] = {**rows[3], "answer": None}  # a row without a reference: evaluate read it as the text "None"
    real = episodes.complete
    scripted = {  # by prompt: what the model "said" on a few rows, the rest is the checkpoint's own greedy output
        rows[0]["prompt"]: f"{rows[0]['answer']}\nand more",  # right (first line), both rules agree
        rows[1]["prompt"]: [{"role": "assistant", "content": str(rows[1]["answer"])}],  # right, as a chat completion
        rows[2]["prompt"]: f"  {rows[2]['answer']}  ",  # right after normalisation
        rows[3]["prompt"]: "None",  # no reference: wrong, whatever is said
    }

    def complete(model, tokenizer, recipe, rows, **kw):
        outs, envs = real(model, tokenizer, recipe, rows, **kw)
        return [[scripted.get(r["prompt"], o[0])] for r, o in zip(rows, outs)], envs

    for where in (heldout, probing):  # the evaluation's and the probe's own name for it
        monkeypatch.setattr(where, "complete", complete)
    metrics, traj = heldout_eval(model, tokenizer, recipe, rows)
    probe = HeldoutProbe(recipe, rows, tokenizer, tmp_path)
    per_row = [probe.measure(model, [r]) for r in rows]
    evaluation = [t["correct"] for t in traj]
    assert per_row == evaluation
    assert probe.measure(model) == metrics["heldout_accuracy"] == sum(evaluation) / len(rows)
    assert evaluation[:4] == [1.0, 1.0, 1.0, 0.0]
    old = [old_evaluate_match(scripted[r["prompt"]], r["answer"]) for r in rows[:4]]
    assert old == [1.0, None, 1.0, 1.0]  # rows 1 and 3: where the old held-out accuracy disagreed (or failed)


def test_the_shipped_evaluate_module_judges_as_the_scoring_module():
    import evaluate

    from regimen.stages.training import metrics

    module = evaluate.load(str(metrics.__path__[0] + "/exact_match"))
    preds = ["7", " 7 \nx", "8", "None", "07"]
    refs = ["7", "7", "7", "", "7"]
    want = sum(exact_correct(p, r) for p, r in zip(preds, refs)) / len(preds)
    assert module.compute(predictions=preds, references=refs)["exact_match"] == pytest.approx(want) == 0.6


def test_the_weighted_total_has_one_none_rule():
    values = {"answer": [1.0, None, None, 0.0, math.nan], "format": [1.0, 1.0, None, None, 1.0], "mon": [5, 5, 5, 5, 5]}
    weights = {"answer": 1.0, "format": 0.5, "mon": 0.0}
    totals = weighted_total(values, weights)
    assert totals[:2] == [1.5, 0.5] and math.isnan(totals[2]) and totals[3:] == [0.0, 0.5]
    assert as_trained(totals) == [1.5, 0.5, 0.0, 0.0, 0.5]  # TRL's nansum: nothing scored trains as 0
    assert [passes(v) for v in (1.0, 0.99, None, math.nan, 2.0)] == [1.0, 0.0, None, None, 1.0]


def test_a_reward_metric_leaves_unscored_rows_out():
    recipe = load_recipe(TINY, check_trl=False, overrides={"eval.metric": "answer"})
    scores = Scorer(recipe)(["a", "b", "c"], ["1", "2", "3"], {"answer": ["1", None, "4"]})
    assert scores.correct == [1.0, None, 0.0] and scores.accuracy == 0.5 and scores.unscored == 1


def test_one_rule_says_which_sampler_picks_grpos_prompts_and_why():
    """`training/sampler.choose` is the only "which sampler?" rule: the recipe's curriculum when it can run here (one
    process, a step budget), else the rows, each with the reason the GRPO manifest records."""
    from regimen.stages.training import sampler

    def kind(**over):
        return sampler.choose(load_recipe(TINY, check_trl=False, overrides=over))

    assert kind() == ("rows", "no curriculum: TRL's sampler shuffles the training rows")
    assert kind(**{"curriculum.enabled": True})[0] == "pass_rates"
    levels = load_recipe(ROOT / "tests" / "rg-tiny.yaml", check_trl=False, overrides={"curriculum.kind": "levels"})
    assert sampler.choose(levels)[0] == "levels"
    off = kind(**{"curriculum.enabled": True, "grpo.max_steps": -1, "grpo.num_train_epochs": 1})
    assert off[0] == "rows" and "grpo.max_steps" in off[1]
    assert sampler.config(load_recipe(TINY, check_trl=False)) is None
    assert sampler.reads_pass_rates(load_recipe(TINY, check_trl=False, overrides={"curriculum.enabled": True}))


def test_scoring_with_no_reward_in_scope_still_judges_every_row():
    """SFT with the task's teacher measures only the metric: with exact_match that is no reward at all."""
    recipe = load_recipe(TINY, check_trl=False)
    scores = Scorer(recipe, only=["exact_match"])(["a", "b"], ["1", "3"], {"answer": ["1", "2"]})
    assert scores.values == {} and len(scores.totals) == 2 and all(math.isnan(t) for t in scores.totals)
    assert scores.correct == [1.0, 0.0]
