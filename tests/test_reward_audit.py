"""The reward audit as an adversary (issue 52): a search for an answer-blind completion the task calls wrong that
the recipe's rewards pay, with its minimal witness. Rewards written the way people write them (tests/reward_corpus.py,
nothing of Regimen imported): every gameable one caught, every honest one passed, randomly drawn gameable ones caught
at least 90% of the time, the same seed the same report, a reward that drifts with its calls named stateful."""

from __future__ import annotations

import json
import operator

import pytest
import reward_corpus as corpus
from conftest import ROOT, run_cli

from regimen.stages.recipe import load_recipe
from regimen.stages.rewards.audit import ABSTAIN, FORMAT, audit
from regimen.stages.tasks.registry import load_task


@pytest.fixture(scope="module")
def task():
    return load_task(load_recipe(str(ROOT / "configs" / "default.yaml"), check_trl=False).data)


def audited(task, spec, **kw):
    fns, weights = corpus.instances(spec)
    return audit(fns, weights, task.train[:40], task.reference, **kw)


@pytest.mark.parametrize("name", sorted(corpus.GAMEABLE))
def test_every_gameable_reward_of_the_corpus_is_caught_with_a_witness(task, name):
    spec, learns = corpus.GAMEABLE[name]
    report = audited(task, spec)
    assert report["findings"], (name, learns, report["paid"])
    f = report["findings"][0]
    assert f["message"] and f["row"] and f["kind"] in ("blind", "wrong", "stateful"), f
    if f["kind"] != "stateful":
        assert f["completion"] is not None and f["paid"] is not None and f["reference_paid"] is not None, f
    assert report["search"]["tried"] >= f.get("tried", 0) >= 0


@pytest.mark.parametrize("name", sorted(corpus.HONEST))
def test_every_honest_reward_of_the_corpus_passes(task, name):
    spec, learns = corpus.HONEST[name]
    report = audited(task, spec)
    assert report["findings"] == [], (name, learns, report["findings"])
    assert report["search"]["tried"] > 1000  # the search ran its budget and found nothing


def test_randomly_drawn_gameable_rewards_are_caught_nine_times_in_ten(task):
    """100 draws over the shapes with random thresholds, positions, separators and bonus sizes; the audit holds no
    probe for any of them (no '10', no 'over 200 characters', no 'call 200')."""
    draws = corpus.generated(seed=7, n=100)
    missed = [(name, line) for name, spec, line in draws if not audited(task, spec)["findings"]]
    assert len(missed) <= 10, missed


def test_the_audit_is_told_no_listed_reward():
    """The search's fixed building blocks are abstentions and format tokens, never a listed reward's trigger: no
    constant '10' or '0123456789', no comparison with 200 or 300 (characters, calls)."""
    import ast
    import inspect

    from regimen.stages.rewards import audit as module

    tree = ast.parse(inspect.getsource(module))
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not strings & {"10", "0123456789"}
    compared = {
        c.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Compare)
        for c in [n.left, *n.comparators]
        if isinstance(c, ast.Constant)
    }
    assert not compared & {200, 300}, compared
    assert "I don't know" in ABSTAIN and "</think>" in FORMAT


def test_the_same_seed_gives_the_same_report_and_another_seed_searches_elsewhere(task):
    spec, _ = corpus.GAMEABLE["first_line_numbers"]
    one, two = audited(task, spec, seed=3), audited(task, spec, seed=3)
    assert json.dumps(one, sort_keys=True, default=str) == json.dumps(two, sort_keys=True, default=str)
    honest, _ = corpus.HONEST["exact_match"]
    assert audited(task, honest, seed=3)["search"] == {**audited(task, honest, seed=3)["search"]}


def test_a_reward_that_drifts_with_its_calls_or_its_batch_is_named_stateful(task):
    def by_batch(prompts, completions, answer=None, **kwargs):
        """Pays the lone completion (a batch of one), as no batch in training is."""
        return [1.0 if len(completions) == 1 else corpus._exact(c, a) for c, a in zip(completions, answer)]

    report = audit({"by_batch": by_batch}, {"by_batch": 1.0}, task.train[:40], task.reference, budget=0)
    assert [f["kind"] for f in report["findings"]] == ["stateful"], report["findings"]
    assert "not a function of its completion" in report["findings"][0]["message"]


def test_an_abstention_finding_is_a_warning_when_the_recipe_wants_abstention(task):
    spec, _ = corpus.GAMEABLE["plus_minus"]
    stop = audited(task, spec)
    assert stop["findings"] and stop["findings"][0]["abstention"]
    wanted = audited(task, spec, abstention=True)
    assert wanted["findings"] == [] and wanted["warnings"] and wanted["warnings"][0]["completion"].strip() == ""


def test_a_reward_with_no_opinion_on_the_answers_is_searched_alone(task):
    fns, weights = corpus.instances([(corpus.think_only, 1.0)])
    report = audit(fns, weights, task.train[:40], task.reference)
    assert report["gameable"] == ["think_only"] and "</think>" in report["findings"][0]["completion"]


def test_reward_check_exits_non_zero_on_a_finding_and_names_the_witness(tmp_path, capsys):
    samples = tmp_path / "s.jsonl"
    samples.write_text(
        "".join(
            json.dumps({"prompt": f"Q: {i}+{i}=", "completion": str(2 * i), "answer": str(2 * i)}) + "\n"
            for i in range(12)
        )
    )
    code, out, err = run_cli(
        ["reward-check", "--samples", str(samples), "--reward", "reward_corpus:first_line_numbers"], capsys
    )
    assert code == 1 and "GAMEABLE" in out and "witness" in out, (out, err)
    code, out, err = run_cli(
        ["reward-check", "--samples", str(samples), "--reward", "reward_corpus:exact_match"], capsys
    )
    assert code == 0 and "GAMEABLE" not in out, (out, err)


ISSUE_LIST = [  # the gameable rewards issue 52 lists, each as people wrote them
    "idk_bonus",
    "first_line_numbers",
    "three_lines_numbers",
    "one_line_anywhere",
    "first_line_partial",
    "show_your_work",
    "long_is_good",
    "all_ten_digits",
    "echo_prompt",
    "common_value",
    "trojan",
    "think_only",
]


@pytest.mark.parametrize("name", ISSUE_LIST)
def test_the_dry_run_stops_on_them_with_the_witness_in_its_diagnosis_and_its_artifact(name):
    """As the dry run calls it (`dry_run._audit`, the recipe's own fields and verdict): the diagnosis that stops the
    run and the Prefect artifact both name the witness."""
    from regimen.flows.pipeline.publish import audit_markdown
    from regimen.stages.dry_run import _audit, _gameable_diagnosis
    from regimen.stages.tasks import shuffled

    rewards = [{"name": f"reward_corpus:{fn.__name__}"} for fn, _ in corpus.GAMEABLE[name][0]]
    recipe = load_recipe(str(ROOT / "configs" / "default.yaml"), {"rewards": rewards}, check_trl=False)
    task = load_task(recipe.data)
    report = _audit(recipe, shuffled(task.train, seed=1), task.reference)
    assert report["findings"], report
    diagnosis = _gameable_diagnosis(report)
    witness = report["findings"][0]["completion"]
    assert "witness" in diagnosis and "dry_run.gameable: warn" in diagnosis
    if witness is not None:
        assert repr(str(witness)[:40])[1:-1][:20] in diagnosis
        assert "GAMEABLE" in audit_markdown(report, "audit")


def test_a_reward_that_raises_on_some_blind_text_makes_no_finding_of_the_others_alone(task):
    """Review finding: once a reward raised in the search, later examples were scored without it while the
    baselines still had it, and a format reward alone looked like it paid without the answer."""

    def fussy(prompts, completions, answer=None, **kwargs):
        if any(len(c) > 500 for c in completions):
            raise ValueError("too long to judge")
        return [corpus._exact(c, a) for c, a in zip(completions, answer)]

    def flat(prompts, completions, **kwargs):
        return [0.2] * len(completions)

    report = audit({"fussy": fussy, "flat": flat}, {"fussy": 1.0, "flat": 1.0}, task.train[:40], task.reference)
    assert report["findings"] == [] and "fussy" in report["raised"], report["findings"]


def test_a_budget_of_zero_runs_the_fixed_probes_only(task):
    spec, _ = corpus.HONEST["exact_match"]
    assert audited(task, spec, budget=0)["search"]["tried"] == 0


def _chat_rows(task, n=40):
    """The default task's rows as a chat recipe's: the prompt a list of messages (TRL's conversational format)."""
    return [
        {**r, "prompt": [{"role": "system", "content": "Answer."}, {"role": "user", "content": r["prompt"]}]}
        for r in task.train[:n]
    ]


ANSWER = operator.itemgetter("answer")  # the row's answer (the task's solver reads a text prompt)


def _content(completion):
    """open-r1's way of reading a completion: `completion[0]["content"]` (a string would raise TypeError)."""
    return completion[0]["content"]


def open_r1_accuracy(prompts, completions, answer=None, **kwargs):
    return [corpus._exact(_content(c), a) for c, a in zip(completions, answer)]


def open_r1_tag_count(prompts, completions, **kwargs):
    return [0.25 * sum(t in _content(c) for t in ("<think>", "</think>", "<answer>", "</answer>")) for c in completions]


def test_on_a_chat_recipe_the_audit_hands_rewards_the_assistant_messages_trl_hands_them(task):
    """Completions in the recipe's shape (issue 52 item 1): after a chat prompt, `[{"role": "assistant", ...}]`, as
    GRPOTrainer passes them; rewards written for it (open-r1's) are scored, not refused, and judged as on text."""
    rows = _chat_rows(task)
    seen = []

    def shape_spy(prompts, completions, **kwargs):
        seen.extend(completions)
        return open_r1_accuracy(prompts, completions, **kwargs)

    honest = audit({"acc": shape_spy}, {"acc": 1.0}, rows, ANSWER)
    assert honest["findings"] == [] and honest["raised"] == {}, honest
    assert seen and all(isinstance(c, list) and c[0]["role"] == "assistant" for c in seen), seen[:3]
    alone = audit({"tags": open_r1_tag_count}, {"tags": 1.0}, rows, ANSWER)
    assert alone["gameable"] == ["tags"] and alone["raised"] == {}, alone
    beside = audit(
        {"acc": open_r1_accuracy, "tags": open_r1_tag_count}, {"acc": 1.0, "tags": 1.0}, rows, task.reference
    )
    assert beside["findings"] == [], beside["findings"]  # a format reward beside correctness: dressed baselines
    text = audit({"tags": open_r1_tag_count}, {"tags": 1.0}, task.train[:40], ANSWER)
    assert text["gameable"] == [] and "tags" in text["raised"]  # on text prompts the same reward cannot score text
