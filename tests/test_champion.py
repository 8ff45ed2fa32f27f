"""The champion rule and the experiment's data records, on made-up figures and small stores: the paired
test, the decision's every branch, a frozen held-out set that new rows never enter, duplicates that stay on
one side of a split, and data versions that count what is new."""

from __future__ import annotations

import json

import pytest

from regimen.stages.decide import promotion as rule
from regimen.stages.records import datasets as data_records
from regimen.stages.store import Store
from regimen.stages.tasks import Task, normalized_prompt, seeded_split, with_frozen_heldout


def m(version: int, acc_vector: list[int], heldout_set: int = 1, stage: str = "grpo") -> rule.Measured:
    return rule.Measured(
        policy={"stage": stage, "version": version, "fingerprint": f"fp{version}"},
        eval_version=version,
        heldout_set=heldout_set,
        accuracy=sum(acc_vector) / len(acc_vector),
        correct=[float(x) for x in acc_vector],
    )


def test_mcnemar_is_the_exact_binomial_tail_over_discordant_prompts():
    t = rule.mcnemar([1, 1, 1, 1, 0, 1], [0, 0, 0, 0, 0, 1])
    assert (t["only_challenger"], t["only_champion"]) == (4, 0) and t["p_value"] == pytest.approx(1 / 16)
    t = rule.mcnemar([1, 0, None], [0, 1, 1])  # unscored prompts are left out of the pairs
    assert t["paired"] == 2 and t["p_value"] == pytest.approx(0.75)
    assert rule.mcnemar([1, 1], [1, 1])["p_value"] == 1.0  # no disagreement: no evidence


def test_wilson_interval_brackets_the_proportion():
    low, high = rule.wilson(45, 50)
    assert low < 0.9 < high and 0.78 < low and high < 0.96
    assert rule.wilson(0, 0) == (0.0, 1.0)


def test_decisions_promote_only_a_better_honest_challenger():
    champ = m(1, [1] * 30 + [0] * 20)
    better = m(2, [1] * 45 + [0] * 5)  # 15 prompts only it solves, none only the champion
    assert rule.decide(m(1, [1, 0]), None, min_gain=0.02, confidence=0.9).promote  # the first champion
    d = rule.decide(better, champ, min_gain=0.02, confidence=0.9)
    assert d.promote and d.figures["mcnemar"]["only_challenger"] == 15
    assert not rule.decide(better, champ, min_gain=0.02, confidence=0.9, stopped="reward-hacking-suspected").promote
    small = m(3, [1] * 31 + [0] * 19)
    d = rule.decide(small, champ, min_gain=0.03, confidence=0.9)
    assert not d.promote and "below promote.min_gain" in d.reason
    lucky = m(4, [1] * 30 + [1, 1, 1] + [0] * 17)  # three more solved: gain 0.06, p = 1/8
    d = rule.decide(lucky, champ, min_gain=0.02, confidence=0.9)
    assert not d.promote and "could be luck" in d.reason
    assert not rule.decide(
        m(1, [1] * 50), champ, min_gain=0.0, confidence=0.5
    ).promote  # the same policy is not a challenger
    other_set = m(5, [1] * 50, heldout_set=2)
    assert "not comparable" in rule.decide(other_set, champ, min_gain=0.0, confidence=0.5).reason


def test_a_split_keeps_copies_of_a_row_on_one_side():
    rows = [{"prompt": f"Q{i % 7}", "answer": str(i % 7)} for i in range(70)]  # ten copies of each of seven prompts
    train, held = seeded_split(rows, 0.1, seed=0, source="rows")
    held_keys = {normalized_prompt(r["prompt"]) for r in held}
    assert held and not held_keys & {normalized_prompt(r["prompt"]) for r in train}
    assert len(held) == len(held_keys)  # one row per held-out prompt


def test_a_frozen_set_drops_training_rows_equal_to_its_prompts_and_counts_them():
    task = Task(
        train=[{"prompt": " q1 ", "answer": "1"}, {"prompt": "Q2", "answer": "2"}, {"prompt": "Q3", "answer": "3"}],
        heldout=[{"prompt": "other", "answer": "x"}],
        name="t",
    )
    frozen = with_frozen_heldout(task, [{"prompt": "Q1", "answer": "1"}])
    assert [r["prompt"] for r in frozen.train] == ["Q2", "Q3"] and frozen.dropped_heldout == 1
    assert frozen.heldout == [{"prompt": "Q1", "answer": "1"}]


def test_the_frozen_set_is_written_once_and_data_versions_count_what_is_new(tmp_path):
    st = Store(tmp_path / "store")
    held = [{"prompt": f"H{i}", "answer": str(i)} for i in range(5)]
    ref, now = data_records.resolve(st, "exp", held)
    assert now and ref["version"] == 1 and ref["rows"] == 5
    # another night's data: the set stays
    ref2, now2 = data_records.resolve(st, "exp", [{"prompt": "different", "answer": "0"}])
    assert not now2 and ref2["fingerprint"] == ref["fingerprint"]
    from regimen.stages.tasks.registry import frozen_rows

    assert frozen_rows(ref2) == held
    night1 = [{"prompt": f"T{i}", "answer": str(i)} for i in range(10)]
    d1 = data_records.record_training_data(st, "exp", night1, 0)
    assert d1["changed"] and (d1["rows"], d1["new"], d1["gone"]) == (10, 10, 0)
    assert not data_records.record_training_data(st, "exp", night1, 0)["changed"]  # unchanged: nothing written
    d2 = data_records.record_training_data(st, "exp", night1[2:] + [{"prompt": "T10", "answer": "10"}], 1)
    assert (
        d2["changed"]
        and (d2["rows"], d2["new"], d2["gone"], d2["dropped_heldout"]) == (9, 1, 2, 1)
        and d2["version"] == 2
    )
    refreshed = data_records.freeze(st, "exp", [{"prompt": "N", "answer": "1"}], by="person", reason="new set")
    assert refreshed["version"] == 2 and data_records.current(st, "exp")["version"] == 2
    manifest = json.loads((tmp_path / "store" / "exp" / "heldout" / "v2" / "manifest.json").read_text())
    assert manifest["by"] == "person" and manifest["reason"] == "new set"


def test_the_documented_automation_is_one_prefect_accepts():
    """The automation the nightly how-to documents for `regimen.model.kept` is valid for Prefect's own model."""
    import re
    import uuid
    from pathlib import Path

    import yaml
    from prefect.events.schemas.automations import AutomationCore

    page = (Path(__file__).resolve().parent.parent / "docs" / "how-to" / "nightly.md").read_text()
    block = re.search(r"cat > kept.yaml <<'YAML'\n(.*?)\n\s*YAML\n", page, re.S)
    assert block, "the nightly how-to's automation example is gone"
    text = "\n".join(line[2:] for line in block.group(1).splitlines()).replace(
        "<your notification block's id>", str(uuid.uuid4())
    )
    automation = AutomationCore.model_validate(yaml.safe_load(text))
    assert automation.trigger.expect == {"regimen.model.kept"}
    assert automation.trigger.match.model_dump()  # matches our resource id
    assert automation.actions[0].type == "send-notification"
