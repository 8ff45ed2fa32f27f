"""The ecosystem's tasks as they are (issue 44): reasoning-gym as a task and a guarded reward, and the reward
audit the dry run and `regimen reward-check` run on every reward with references."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from regimen.stages.core.errors import InputError
from regimen.stages.recipe import load_recipe
from regimen.stages.rewards import from_specs, get_reward
from regimen.stages.tasks import normalized_prompt, shuffled
from regimen.stages.tasks.registry import load_task

RG = ROOT / "tests" / "rg-tiny.yaml"


def rg_recipe(**overrides):
    return load_recipe(str(RG), overrides, check_trl=False)


# -- the task ---------------------------------------------------------------------------------------------


def test_rows_carry_their_scorers_record_and_the_heldout_set_comes_from_its_own_seed():
    r = rg_recipe()
    task = load_task(r.data)
    row = task.heldout[0]
    entry = json.loads(row["rg_entry"])
    assert row["prompt"].endswith("\n") and row["prompt"].rstrip("\n") == entry["question"]  # the separator is ours
    assert row["answer"] == entry["answer"] and row["source_dataset"] == entry["name"] == "chain_sum"
    assert task.reference(row) == row["answer"]  # the oracle teacher writes the item's answer
    held = {normalized_prompt(r["prompt"]) for r in task.heldout}
    assert not any(normalized_prompt(t["prompt"]) in held for t in task.train)  # checked like any held-out set
    again = load_task(rg_recipe(**{"data.train_size": 31}).data)  # another training size: the same held-out set
    assert [r["prompt"] for r in again.heldout] == [r["prompt"] for r in task.heldout]
    other = load_task(rg_recipe(**{"data.seed": 1}).data)
    assert [r["prompt"] for r in other.heldout] != [r["prompt"] for r in task.heldout]


def test_a_mixture_has_every_task_and_a_chat_prompt_for_a_real_model():
    r = rg_recipe(
        **{
            "data.name": [{"name": "chain_sum", "weight": 1}, {"name": "spell_backward", "weight": 1}],
            "data.config": {},
            "data.system_prompt": "default",
        }
    )
    task = load_task(r.data)
    assert {row["source_dataset"] for row in task.heldout} == {"chain_sum", "spell_backward"}
    row = task.train[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and "<answer>" in row["prompt"][0]["content"]
    assert task.reference(row) == f"<answer>{row['answer']}</answer>"
    fn = get_reward("reasoning_gym")
    assert fn(None, [task.reference(row), "<answer>nothing</answer>"], rg_entry=[row["rg_entry"]] * 2) == [1.0, 0.0]


@pytest.mark.parametrize(
    "override, needle",
    [
        ({"data.name": "chain_summ"}, "'chain_summ' is not a reasoning-gym task (did you mean chain_sum?)"),
        ({"data.name": [{"name": "chain_sum"}, {"name": "chain_sum"}], "data.config": {}}, "names each task once"),
    ],
)
def test_bad_options_are_refused_at_the_door_naming_the_field(override, needle):
    with pytest.raises(InputError, match="data|rewards") as info:
        rg_recipe(**override)
    assert needle in str(info.value)


def test_a_task_whose_scorer_fails_its_own_stored_reference_is_refused():
    with pytest.raises(InputError, match="arc_agi's scorer pays its own reference answer"):
        load_task(rg_recipe(**{"data.name": "arc_agi", "data.config": {}, "data.heldout_size": 2}).data)


def test_without_the_extra_the_door_names_it_and_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as if not installed: `import reasoning_gym` fails
    code, out, err = run_cli(["check", str(RG)], capsys)
    assert code == 2 and "pip install 'regimen-rl[reasoning-gym]'" in err, err
    assert "Traceback" not in err


# -- the reward ---------------------------------------------------------------------------------------------


def _entry(name: str, config: dict | None = None, i: int = 0) -> dict:
    import reasoning_gym

    item = reasoning_gym.create_dataset(name, size=i + 1, seed=3, **(config or {}))[i]
    return json.loads(json.dumps({"name": name, "config": config or {}, **item}, default=list))


def test_full_score_only_by_default_and_the_scorers_partial_credit_by_choice():
    entry = _entry("chain_sum")
    raw = json.dumps(entry)
    ref = entry["answer"]
    strict, partial = get_reward("reasoning_gym"), get_reward("reasoning_gym", partial=True)
    completions = [ref, f"{ref} {ref}", "0123456789", ""]
    assert strict(None, completions, rg_entry=[raw] * 4) == [1.0, 0.0, 0.0, 0.0]
    paid = partial(None, completions, rg_entry=[raw] * 4)
    assert paid[0] == 1.0 and 0 < paid[1] < 1 and paid[3] == 0.0  # "16 16" earns the substring's share
    spell = json.dumps(_entry("spell_backward"))
    word = json.loads(spell)["answer"]
    assert strict(None, [word + " and more"], rg_entry=[spell]) == [0.0]
    assert 0 < partial(None, [word + " and more"], rg_entry=[spell])[0] < 1
    assert strict(None, ["x"], rg_entry=[None]) == [None]  # a row the task did not write: no opinion


def test_a_scorer_that_raises_scores_zero_and_is_counted():
    fn = get_reward("reasoning_gym")
    raw = json.dumps(_entry("prime_factorization"))
    before = fn.counts["errors"]
    assert fn(None, ["not a number", json.loads(raw)["answer"]], rg_entry=[raw, raw]) == [0.0, 1.0]
    assert fn.counts["errors"] == before + 1


def test_rewards_by_dotted_path_are_named_by_their_path_or_as():
    r = rg_recipe(
        rewards=[
            {"name": "reasoning_gym"},
            {"name": "rewards_for_tests:reference_anywhere", "weight": 0},
            {"name": "rewards_for_tests:pays_empty", "weight": 0, "as": "empty_pays"},
        ]
    )
    assert list(from_specs(r.rewards)) == ["reasoning_gym", "rewards_for_tests.reference_anywhere", "empty_pays"]


# -- the audit ------------------------------------------------------------------------------------------------


GCD = {"data": {"task": "reasoning_gym", "name": "gcd", "train_size": 200, "heldout_size": 20}}


def _audit(config: str, **overrides) -> dict:
    """The audit as the dry run runs it (the recipe's budget, threshold and verdict)."""
    from regimen.stages.dry_run import _audit as dry_run_audit

    r = load_recipe(config, overrides, check_trl=False)
    task = load_task(r.data)
    report = dry_run_audit(r, shuffled(task.train, seed=1), task.reference)
    return {"gameable": [], **report}


@pytest.mark.parametrize(
    "config, overrides, gameable",
    [
        ("configs/hackable.yaml", {}, ["digits"]),  # digits pays a wrong answer as much as the right one
        ("configs/tiny-code-hackable.yaml", {}, ["code_block"]),
        # chain_sum's partial credit shrinks with the completion's length: a blind list of the answer space earns
        # under 1% of a right answer (issue 52: the audit asks what a policy without the answer can earn)
        (str(RG), {"rewards": [{"name": "reasoning_gym", "args": {"partial": True}}]}, []),
        # gcd's partial credit pays a blind constant half a right answer (count_bits' substring credit pays a digit
        # run 0.10 of it, at the threshold: caught or not by the seed, bench/results/reward_audit.jsonl)
        (str(RG), {**GCD, "rewards": [{"name": "reasoning_gym", "args": {"partial": True}}]}, ["reasoning_gym"]),
        (
            str(RG),
            {"rewards": [{"name": "reasoning_gym"}, {"name": "rewards_for_tests:reference_anywhere"}]},
            ["rewards_for_tests.reference_anywhere"],
        ),
        (
            "configs/default.yaml",
            {"rewards": [{"name": "rewards_for_tests:pays_empty"}]},
            ["rewards_for_tests.pays_empty"],
        ),
        ("configs/default.yaml", {}, []),  # answer
        ("configs/default.yaml", {"rewards": [{"name": "answer"}, {"name": "format", "weight": 0.2}]}, []),
        ("configs/tiny-code.yaml", {}, []),  # unit_tests
        (str(RG), {}, []),  # reasoning_gym, full score only
    ],
)
def test_the_audit_catches_rewards_that_pay_without_the_answer_and_passes_honest_ones(config, overrides, gameable):
    report = _audit(config, **overrides)
    assert report["gameable"] == gameable, report["findings"]
    for f in report["findings"]:
        assert f["completion"] is not None and f["row"] and f["value"] is not None  # the evidence, named


def test_the_audit_of_a_substring_reward_names_the_list_of_candidates_that_paid():
    report = _audit(str(RG), rewards=[{"name": "reasoning_gym"}, {"name": "rewards_for_tests:reference_anywhere"}])
    [finding] = report["findings"]
    assert finding["kind"] == "blind" and len(finding["completion"].split()) > 2 and finding["value"] == 1.0
    assert report["paid"]["wrong"]["rewards_for_tests.reference_anywhere"] == 0.0


def test_every_shipped_recipe_but_the_hackable_ones_passes_the_audit():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        report = _audit(str(path))
        expected = (
            ["digits"] if path.stem == "hackable" else ["code_block"] if path.stem == "tiny-code-hackable" else []
        )
        assert report["gameable"] == expected, (path.name, report["findings"])
        stops = load_recipe(str(path), check_trl=False).dry_run.gameable == "stop"
        assert stops == (not expected), path.name  # the hackable recipes warn, so the guard still shows its catch


@pytest.mark.slow
def test_a_gameable_reward_stops_the_run_at_the_dry_run_naming_the_reward_and_what_paid(tmp_path, capsys):
    store = tmp_path / "store"
    code, out, err = run_cli(
        [
            "run",
            str(ROOT / "tests" / "tiny.yaml"),
            "--store",
            str(store),
            "--set",
            "rewards=[{name: answer}, {name: 'rewards_for_tests:reference_anywhere'}]",
        ],
        capsys,
    )
    assert code == 1, (out, err)
    assert "reward-dry-run" in err and "rewards_for_tests.reference_anywhere" in err and "witness" in err, err
    assert "without knowing the answer" in err
    assert "dry_run.gameable: warn" in err and "Traceback" not in err
    from regimen.stages.store import Store

    [failed] = Store(store).failures("tiny-test", "reward-dry-run")
    assert failed["reward_audit"]["gameable"] == ["rewards_for_tests.reference_anywhere"]
    assert not Store(store).versions("tiny-test", "grpo")  # stopped before GRPO


def test_reward_check_reports_the_audit_on_samples_with_answers(tmp_path, capsys):
    samples = tmp_path / "s.jsonl"
    samples.write_text(
        "".join(
            json.dumps({"prompt": f"Q: {i}+1=", "answer": str(i + 1), "completion": str(i + 1)}) + "\n"
            for i in range(4)
        )
    )
    code, out, err = run_cli(["reward-check", "--samples", str(samples), "--reward", "digits"], capsys)
    assert (  # a finding fails the check (exit 1), so it can sit in a user's CI
        code == 1 and "reward audit over 4 rows" in out and "GAMEABLE" in out and "cannot tell right from wrong" in out
    )
    code, out, err = run_cli(["reward-check", "--samples", str(samples), "--reward", "answer", "--json"], capsys)
    report = json.loads(err.strip().splitlines()[-1])["reward_audit"]
    assert code == 0 and report["gameable"] == [] and report["paid"]["reference"]["answer"] == 1.0


@pytest.mark.slow
def test_a_reasoning_gym_mixture_through_a_real_run_freezes_its_heldout_set_and_reports_each_task(tmp_path, capsys):
    from regimen.stages.records import datasets as data_records
    from regimen.stages.store import Store

    store = tmp_path / "store"
    mixture = (
        "data.name=[{name: chain_sum, config: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2}}, "
        "{name: spell_backward, config: {min_word_len: 3, max_word_len: 4}}]"
    )
    args = ["run", str(RG), "--store", str(store), "--set", mixture, "--set", "data.config={}"]
    code, out, err = run_cli(args, capsys)
    assert code in (0, 1), (out, err)  # 30 SFT steps teach this model little: a gate may stop it after SFT
    st = Store(store)
    [ev] = st.versions("rg-tiny", "sft")  # SFT measures the held-out set as evaluation does
    metrics = ev["metrics"]
    assert {"heldout_accuracy/chain_sum", "heldout_accuracy/spell_backward"} <= set(metrics), metrics
    assert "heldout_accuracy/chain_sum" in out  # the terminal's table shows each task
    shown = [json.loads(x) for x in (st.local_path(ev) / "trajectories.jsonl").read_text().splitlines()]
    held = [t for t in shown if t.get("kind") == "heldout"]
    assert {t["prompt"].split(":")[0] for t in held[:2]} != {held[0]["prompt"].split(":")[0]}, held[:2]  # both tasks
    heldout = data_records.current(st, "rg-tiny")
    frozen = [json.loads(x) for x in (Path(heldout["path"]) / "rows.jsonl").read_text().splitlines()]
    assert {r["source_dataset"] for r in frozen} == {"chain_sum", "spell_backward"}
    # a later night with other training data: evaluated on the same frozen set, its prompts never trained on
    code, out, err = run_cli([*args, "--set", "data.seed=1"], capsys)
    assert data_records.current(st, "rg-tiny")["version"] == heldout["version"]
    data = st.versions("rg-tiny", "data")[-1]
    assert data["metrics"].get("dropped_heldout", 0) >= 0 and code in (0, 1), (out, err)


def test_the_tiny_models_context_must_hold_the_tasks_prompts_named_before_anything_runs(tmp_path, capsys):
    store = tmp_path / "store"
    code, out, err = run_cli(
        ["run", str(RG), "--store", str(store), "--set", "model.tiny.max_position_embeddings=48"], capsys
    )
    assert code == 2 and "model.tiny.max_position_embeddings=48 is too small for this task" in err, err
    assert "set it to at least" in err and "Traceback" not in err
    assert not (store / "rg-tiny").exists()  # nothing written


@pytest.mark.parametrize(
    "setting, why",
    [
        ("data.config.bogus_key=3", "unexpected keyword argument 'bogus_key'"),
        ("data.config.max_digits=-3", "max_digits must be >= min_digits"),
        ("data.config.min_digits=5", "max_digits must be >= min_digits"),
    ],
)
def test_check_refuses_a_reasoning_gym_config_the_run_refuses(setting, why, capsys):
    """Issue 51: `regimen check` said OK (exit 0) to configs the run's preflight refuses."""
    code, out, err = run_cli(["check", str(ROOT / "configs" / "rg-chain-sum.yaml"), "--set", setting], capsys)
    assert code == 2 and "data.config of chain_sum" in err and why in err, (out, err)
    assert len(err.strip().splitlines()) == 1 and "OK" not in out
