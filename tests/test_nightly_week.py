"""A simulated week of nightly retraining through a real Prefect server and `regimen serve`
(`bench/nightly_week.py`): the champion's accuracy on the frozen set never falls by the flow's doing, a
better challenger is promoted, a night without new data reuses every stage and promotes nothing, poisoned
rows and a gameable reward yield challengers that are not promoted (with the reason in the record, the
artifact and the event), a night killed mid-GRPO resumes on the next trigger, a person's rollback holds;
the UI shows the champion's history; `regimen export` gives a model that scores the recorded accuracy."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.nightly_week import EXP, simulate  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def week(tmp_path_factory):
    w = simulate(tmp_path_factory.mktemp("week"))
    yield w
    w.close()


def test_the_week_goes_as_the_rule_says(week):
    n = {x["night"]: x for x in week.nights}
    summary = "\n".join(str(x) for x in week.nights)
    assert n[1]["state"] == "COMPLETED" and n[1]["event"] == "promoted" and "first champion" in n[1]["reason"], summary
    # a better challenger on the grown data
    assert n[2]["state"] == "COMPLETED" and n[2]["event"] == "promoted", summary
    assert n[2]["champion_acc"] >= n[1]["champion_acc"] + 0.02, summary
    # every stage reused
    assert n[3]["state"] == "COMPLETED" and n[3]["versions_written"] == 0 and n[3]["event"] == "kept", summary
    assert "nothing new was trained" in n[3]["reason"], summary
    assert n[4]["event"] == "kept" and n[4]["champion"] == n[3]["champion"], summary  # poisoned rows: not promoted
    assert n[4]["challenger_acc"] < n[3]["champion_acc"], summary
    assert n[5]["event"] == "kept" and "gameable" in n[5]["reason"], summary
    assert n[6]["state"] == "CRASHED", summary  # killed mid-GRPO
    assert n[7]["state"] == "COMPLETED" and (n[7]["resumed_from_step"] or 0) > 0, summary  # resumed from its checkpoint
    # the flow never lowers the champion: every promotion by the flow is at least as good as the champion before it
    history = week.champion()["history"]
    flow_champions = [h["heldout_accuracy"] for h in history if h["event"] == "promoted" and h["by"] == "flow"]
    assert flow_champions == sorted(flow_champions), history
    # a person's rollback holds until a better challenger arrives
    rolled = next(h for h in history if h["event"] == "rolled-back")
    after = n[8]
    assert after["champion"] == rolled["policy"] or (
        after["event"] == "promoted"
        and after["challenger"] != rolled["from"]
        and after["challenger_acc"] >= rolled["heldout_accuracy"] + 0.02
    ), summary
    if after["challenger"] == rolled["from"]:
        assert after["event"] == "kept" and "rolled back from" in after["reason"], summary


def test_the_reasons_are_in_the_events_and_the_artifact(week):
    events = week.events()
    names = [e["event"] for e in events]
    assert "regimen.model.promoted" in names and "regimen.model.kept" in names, names
    kept = [e for e in events if e["event"] == "regimen.model.kept"]
    assert any("gameable" in e["payload"]["reason"] for e in kept) and all(e["payload"]["reason"] for e in kept)
    r = week.call("POST", "/artifacts/filter", json={"artifacts": {"key": {"any_": [f"{EXP}-champion"]}}})
    r.raise_for_status()
    versions = r.json()
    assert len(versions) >= 7  # one per night that decided: the UI's artifact history is the champion history
    newest = max(versions, key=lambda a: a["created"])
    table = json.loads(newest["data"]) if isinstance(newest["data"], str) else newest["data"]
    assert any(row["event"] == "rolled-back" for row in table) and any(
        "gameable" in (row["reason"] or "") for row in table
    )


def test_the_ui_shows_the_champion_and_its_history(week, tmp_path):
    chromium = os.environ.get("REGIMEN_CHROMIUM", "/usr/bin/chromium")
    if not (os.path.exists(chromium) or shutil.which(chromium)):
        pytest.skip(f"chromium not found at {chromium}")
    from playwright.sync_api import sync_playwright

    champion = week.champion()["champion"]["policy"]
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    ]
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=chromium,
            headless=True,
            args=flags,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            page = context.new_page()
            page.set_default_timeout(45_000)
            # the latest champion artifact's own page renders its table (the history, newest first)
            found = week.call(
                "POST",
                "/artifacts/filter",
                json={"artifacts": {"key": {"any_": [f"{EXP}-champion"]}}, "sort": "CREATED_DESC"},
            ).json()
            assert len(found) >= 2, found  # one per night that decided: the key's history is the champion history
            page.goto(f"{week.url}/artifacts/artifact/{found[0]['id']}")
            page.get_by_text("rolled-back").first.wait_for()
            body = page.inner_text("body")
            assert champion in body and "promoted" in body and "kept" in body, body[:2000]
            page.screenshot(path=str(tmp_path / "champion.png"), full_page=True)
            page.goto(f"{week.url}/artifacts/key/{EXP}-champion")  # the key's page: its versions over the week
            page.get_by_text(f"{EXP}-champion").first.wait_for()
        finally:
            context.close()


def test_export_gives_a_model_that_scores_the_recorded_accuracy(week, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from regimen.stages.recipe import load_recipe
    from regimen.stages.records import datasets as data_records
    from regimen.stages.store import Store
    from regimen.stages.tasks.registry import frozen_rows
    from regimen.stages.training.heldout import heldout_eval

    out = tmp_path / "exported"
    week.person("export", EXP, str(out))
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.padding_side = "left"
    recipe = load_recipe(week.configs / "week.yaml", {"store": str(week.store)})
    rows = frozen_rows(data_records.current(Store(week.store), EXP))
    metrics, _ = heldout_eval(model, tokenizer, recipe, rows)
    recorded = week.champion()["champion"]["heldout_accuracy"]
    assert metrics["heldout_accuracy"] == pytest.approx(recorded, abs=1e-4)
    assert json.loads((out / "regimen_champion.json").read_text())["policy"] == week.champion()["champion"]["policy"]
