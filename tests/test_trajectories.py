"""Read what training changed (issue 50): two evaluations compared row for row (flips counted right, paired by the
row's id, rows missing from one side reported, the counts agreeing with the accuracy change), each flag on a crafted
completion, `regimen trajectories` refusing bad input in one line, and the page opened in headless chromium: hostile
completions shown as inert text, nothing loaded from the network, a filter applied and a flip shown."""

from __future__ import annotations

import json
import random

import pytest
from conftest import run_cli

from regimen.flows.present import trajectories as present
from regimen.stages.decide import reading
from regimen.stages.store import Store

EXP = "readme"


def row(i: int, completion: str, correct: float | None, *, total: float | None = None, prompt: str | None = None):
    return {
        "id": f"p{i}",
        "prompt": prompt or f"Q: {i}+{i}=",
        "completion": completion,
        "answer": str(2 * i),
        "rewards": {"answer": correct, "format": 1.0},
        "total": correct if total is None else total,
        "correct": correct,
    }


def scripted(n: int = 40, seed: int = 0):
    """Two versions of n rows: v1 right on the first half, v2 right on rows whose index is a multiple of 3; v2 lacks
    row 0 and has one row v1 lacks; v2's rows come in another order (pairing is by id)."""
    before = [row(i, str(2 * i) if i < n // 2 else "7", 1.0 if i < n // 2 else 0.0) for i in range(n)]
    after = [row(i, str(2 * i) if i % 3 == 0 else "7", 1.0 if i % 3 == 0 else 0.0) for i in range(1, n + 1)]
    random.Random(seed).shuffle(after)
    return before, after


def test_the_diff_counts_flips_pairs_by_id_and_agrees_with_the_accuracy_change():
    before, after = scripted()
    d = reading.diff(before, after)
    both = range(1, 40)
    want = {
        "fixed": [i for i in both if i >= 20 and i % 3 == 0],
        "broke": [i for i in both if i < 20 and i % 3 != 0],
        "still_right": [i for i in both if i < 20 and i % 3 == 0],
        "still_wrong": [i for i in both if i >= 20 and i % 3 != 0],
    }
    for kind, ids in want.items():
        assert sorted(d[kind]) == sorted(f"p{i}" for i in ids), kind
    assert d["only_before"] == ["p0"] and d["only_after"] == ["p40"] and d["scored"] == 39
    acc = {
        name: sum(r["correct"] for r in rows if r["id"] not in ("p0", "p40")) / 39
        for name, rows in (("before", before), ("after", after))
    }
    assert d["accuracy_change"] == pytest.approx(acc["after"] - acc["before"])
    assert d["accuracy_change"] == pytest.approx((d["counts"]["fixed"] - d["counts"]["broke"]) / 39)


def test_a_row_either_side_did_not_score_is_reported_not_counted():
    before, after = scripted()
    after[0] = {**after[0], "correct": None}
    d = reading.diff(before, after)
    assert d["unscored"] == [after[0]["id"]] and d["scored"] == 38


def test_each_flag_on_a_crafted_completion():
    rows = [row(i, str(2 * i), 1.0) for i in range(20)]
    rows.append(row(20, "0123456789", 0.0, total=1.0))  # paid by the rewards, wrong by the task
    rows.append(row(21, "x" * 400, 0.0))  # much longer than the version's median
    rows += [row(22 + k, "I give up", 0.0) for k in range(3)]  # the same wrong completion for three prompts
    rows.append(row(25, "What is the sum of 25 and 25? 50", 0.0, prompt="What is the sum of 25 and 25?"))
    rows.append(row(26, "step one\n" * 5 + "51", 0.0))
    flagged = {r["id"]: {f["flag"] for f in fs} for r, fs in zip(rows, reading.flags(rows))}
    assert flagged["p20"] == {"paid_but_wrong"}
    assert "length" in flagged["p21"]
    assert all("same_completion" in flagged[f"p{22 + k}"] for k in range(3))
    assert "prompt_echoed" in flagged["p25"]
    assert "repeated_lines" in flagged["p26"]
    assert not any(flagged[f"p{i}"] for i in range(20))  # right answers of ordinary length carry none
    previous = [{**r, "completion": "1"} for r in rows]  # the version before wrote one character everywhere
    longer = {r["id"]: fs for r, fs in zip(rows, reading.flags(rows, previous))}
    assert any(f["flag"] == "length" and "longer than the 1" in f["why"] for f in longer["p21"])
    assert reading.flag_counts(reading.flags(rows))["same_completion"] == 3


def test_rows_whose_prompts_repeat_get_their_own_ids():
    assert reading.row_ids(["a", "b", "a", "a"], str.upper) == ["A", "B", "A#1", "A#2"]


def _commit_eval(st: Store, rows: list[dict], fingerprint: str) -> dict:
    handle = st.stage(EXP, "eval")
    staging = handle.staging_dir()
    with (staging / "heldout.jsonl").open("w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    (staging / "metrics.json").write_text("{}")
    acc = sum(r["correct"] or 0 for r in rows) / len(rows)
    return handle.commit(
        staging,
        {
            "experiment": EXP,
            "stage": "eval",
            "fingerprint": fingerprint,
            "inputs": {},
            "metrics": {"heldout_accuracy": acc},
            "config": {"eval": {"metric": "exact_match"}},
        },
    )


HOSTILE = [
    "<script>window.__pwned = 1</script>",
    "</table></td></tr><img src=x onerror='window.__pwned=2'>",
    '<a href="javascript:window.__pwned=3" id="evil">click</a>',
    "</script><script>window.__pwned=4</script>",
    "<style>body{display:none}</style>\u2028\u2029",
]


@pytest.fixture
def two_versions(tmp_path):
    st = Store(tmp_path / "store")
    before, after = scripted()
    for k, text in enumerate(HOSTILE):
        after[k] = {**after[k], "completion": text}
    after.append({**row(99, "A" * 1_000_000, 0.0), "completion": "A" * 1_000_000})  # 1 MB on one line
    _commit_eval(st, before, "ev1")
    _commit_eval(st, after, "ev2")
    return st


def test_the_command_lists_the_flips_and_writes_the_page(two_versions, tmp_path, capsys):
    page = tmp_path / "page.html"
    code, out, err = run_cli(
        ["trajectories", EXP, "--store", str(two_versions.root), "--html", str(page), "--show", "broke"], capsys
    )
    assert code == 0, (out, err)
    assert "against v1:" in out and "right->wrong" in out and str(page) in out.replace("\n", "")
    text = page.read_text()
    for hostile in HOSTILE:  # in the page only as escaped JSON: no tag of the policy's reaches the markup
        assert hostile.split(">")[0] not in text.split('id="data">')[1].split("</script>")[0]
    assert "http://" not in text and "https://" not in text


@pytest.mark.parametrize(
    "args, says",
    [
        (["nope"], "no experiment 'nope'"),
        ([EXP, "--stage", "bogus"], "unknown stage 'bogus'"),
        ([EXP, "--version", "9"], "has no version v9"),
        ([EXP, "--against", "9"], "has no version v9"),
        ([EXP, "--show", "sideways"], "--show 'sideways'"),
        ([EXP, "--stage", "grpo"], "no completed version of grpo"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(two_versions, capsys, args, says):
    code, out, err = run_cli(["trajectories", *args, "--store", str(two_versions.root)], capsys)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, (code, out, err)


def test_a_damaged_rows_file_is_refused_not_shown(two_versions, capsys):
    path = two_versions.local_path(two_versions.latest(EXP, "eval"))
    with (path / "heldout.jsonl").open("a") as fh:
        fh.write('{"id": "forged", "completion": "x", "correct": 1.0}\n')
    code, out, err = run_cli(["trajectories", EXP, "--store", str(two_versions.root)], capsys)
    assert code != 0 and "damaged" in err and len(err.strip().splitlines()) == 1, (code, out, err)


def test_the_page_in_chromium_is_inert_loads_nothing_and_filters(two_versions, tmp_path):
    from test_ui import CHROMIUM, FLAGS, require_browser

    require_browser()
    from playwright.sync_api import sync_playwright

    v = present.view(two_versions, EXP)
    path = present.write_page(v, tmp_path / "page.html")
    requests: list[str] = []
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=FLAGS
        )
        try:
            page = context.new_page()
            page.on("request", lambda r: requests.append(r.url))
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri())
            page.wait_for_selector("#rows tr")
            assert errors == [], errors
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert page.locator("#evil").count() == 0 and page.locator("#rows img").count() == 0
            page.fill("#search", "window.__pwned = 1")
            cell = page.locator("#rows tr").first
            assert "<script>window.__pwned = 1</script>" in cell.inner_text()
            page.fill("#search", "")
            page.select_option("#show", "broke")
            ids = page.locator("#rows tr").evaluate_all("rows => rows.map(r => r.getAttribute('data-id'))")
            assert (
                sorted(ids)
                == sorted(
                    reading.diff(
                        *[
                            present.read_rows(two_versions, e)
                            for e in (two_versions.versions(EXP, "eval")[0], two_versions.versions(EXP, "eval")[1])
                        ]
                    )["broke"]
                )[:50]
            )
            flip = page.locator("#rows tr").first.inner_text()
            kind, _prompt, was, now = [c.strip() for c in flip.split("\t")][:4]
            assert kind == "broke" and was != now and was.isdigit()  # side by side: v1's right answer, v2's wrong one
            page.select_option("#show", "all")
            assert "of 41" in page.inner_text("#count")  # 40 rows and the 1 MB one, 50 a page
            assert page.evaluate("typeof window.__pwned") == "undefined"
        finally:
            context.close()
    assert [u for u in requests if not u.startswith("file://")] == [], requests
