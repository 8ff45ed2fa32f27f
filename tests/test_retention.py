"""Nightly for a year (issue 42): lookups through each stage's index (checked against the manifests, rolled forward
after a crash, rebuilt when damaged), and retention that never removes what the records need and survives a kill.

The experiment is built by hand (as tests/test_records.py does): sft versions, grpo versions trained from them,
their evaluations on one frozen set, champions promoted by the flow's rule; no training.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import run_cli
from test_records import EXP, OUTCOMES, N, conclude

from regimen.stages.records import datasets as data_records
from regimen.stages.store import Store
from regimen.stages.store.index import INDEX, TOMBSTONE
from regimen.stages.store.retention import collect, plan, roots
from regimen.stages.training.limits import folder_bytes
from regimen.stages.training.policy import policy_from_ref

pytest_plugins = ["s3_server"]


def commit(st: Store, stage: str, fingerprint: str, *, inputs=None, size: int = 4096, model: bool = True) -> dict:
    staging = st._workspace.staging_dir(EXP, stage)
    if model:
        (staging / "model").mkdir()
        (staging / "model" / "weights.bin").write_bytes(os.urandom(size))
    (staging / "metrics.json").write_text("{}")
    return st._catalog.commit(
        staging, {"experiment": EXP, "stage": stage, "fingerprint": fingerprint, "inputs": inputs or {}, "metrics": {}}
    )


def ref(st: Store, m: dict) -> dict:
    r = policy_from_ref(st, EXP, {"stage": m["stage"], "fingerprint": m["fingerprint"]})
    return {k: r[k] for k in ("stage", "version", "fingerprint", "content")}


def night(st: Store, i: int, correct: list[int], heldout: dict) -> dict:
    """One night: sft v(i) from the base, grpo v(i) from it, its evaluation; returns the grpo version."""
    sft = commit(st, "sft", f"sft{i}", inputs={"policy": {"stage": "base", "fingerprint": "base"}})
    grpo = commit(st, "grpo", f"fp{i}", inputs={"policy": ref(st, sft)})
    staging = st._workspace.staging_dir(EXP, "eval")
    (staging / "correct.json").write_text(json.dumps(correct))
    st._catalog.commit(
        staging,
        {
            "experiment": EXP,
            "stage": "eval",
            "fingerprint": f"ev{i}",
            "metrics": {"heldout_accuracy": sum(correct) / N},
            "inputs": {"policy": ref(st, grpo), "heldout": dict(heldout)},
        },
    )
    return grpo


def experiment(root) -> Store:
    """Six nights; nights 1 and 3 promote (night 3 best); the rest are weaker and kept out; a dry run each night."""
    st = Store(root)
    heldout = data_records.freeze(
        st, EXP, [{"prompt": f"what is {i}+{i}?", "answer": str(2 * i)} for i in range(N)], by="flow", reason="first"
    )
    data_records.record_training_data(st, EXP, [{"prompt": f"q{i}", "answer": "1"} for i in range(30)], 0)
    outcomes = {1: OUTCOMES[1], 2: [0] * N, 3: OUTCOMES[3], 4: [0] * N, 5: [0] * N, 6: [0] * N}
    for i, correct in outcomes.items():
        night(st, i, correct, heldout)
        commit(st, "reward-dry-run", f"dry{i}", model=False)
    conclude(st, 1)
    conclude(st, 3)  # champion grpo v3; a rollback would return to grpo v1
    return st


def scanned(st: Store, stage: str) -> list[int]:
    return [m["version"] for m in st.scan(EXP, stage)[0]]


def test_the_index_agrees_with_the_manifests_after_every_commit_and_reuse_still_checks_files(tmp_path):
    st = experiment(tmp_path / "store")
    for stage in ("sft", "grpo", "eval", "reward-dry-run", "heldout", "data"):
        assert [e["version"] for e in st.versions(EXP, stage)] == scanned(st, stage), stage
    found, _ = st.stage(EXP, "grpo").find_intact("fp3")
    assert found["version"] == 3 and "files" in found  # the chosen version's own manifest, read
    (tmp_path / "store" / EXP / "grpo" / "v3" / "model" / "weights.bin").write_bytes(b"tampered")
    found, damaged = st.stage(EXP, "grpo").find_intact("fp3")
    assert found is None and damaged[0]["version"] == 3  # found through the index, refused by its files


def test_a_crash_between_the_manifest_and_the_index_hides_nothing_and_invents_nothing(tmp_path):
    st = experiment(tmp_path / "store")
    index = tmp_path / "store" / EXP / "sft" / INDEX
    before = index.read_text()
    commit(st, "sft", "sft-late")  # committed; now put the index back as if the process died before writing it
    index.write_text(before)
    assert [e["version"] for e in st.versions(EXP, "sft")] == scanned(st, "sft") == [1, 2, 3, 4, 5, 6, 7]
    assert json.loads(index.read_text())["next"] == 8  # rolled forward and written back
    index.write_text("{ torn")  # damaged: rebuilt from the manifests
    assert [e["version"] for e in st.versions(EXP, "sft")] == scanned(st, "sft")
    index.unlink()  # missing: rebuilt too
    assert st.next_version(EXP, "sft") == 8


def test_reindex_rebuilds_every_stage_and_status_check_compares(tmp_path, capsys):
    store = tmp_path / "store"
    st = experiment(store)
    (store / EXP / "grpo" / INDEX).write_text(
        json.dumps({"schema": 1, "next": 3, "versions": {}})
    )  # wrong, well-formed
    code, out, _ = run_cli(["status", EXP, "--store", str(store), "--check"], capsys)
    assert code == 0 and "index differed from the manifests" in out and "v1 missing from it" in out, out
    assert [e["version"] for e in st.versions(EXP, "grpo")] == scanned(st, "grpo")
    (store / EXP / "eval" / INDEX).write_text(json.dumps({"schema": 1, "next": 2, "versions": {}}))
    code, out, _ = run_cli(["reindex", EXP, "--store", str(store)], capsys)
    assert code == 0 and "eval: 6 version(s), next v7" in out
    assert [e["version"] for e in st.versions(EXP, "eval")] == scanned(st, "eval")


def test_gc_keeps_the_champions_lineage_rollback_targets_records_and_running_inputs(tmp_path):
    st = experiment(tmp_path / "store")
    with st.stage(EXP, "grpo").running({"inputs": {"policy": {"stage": "sft", "version": 2}}}):
        the_plan = plan(st, EXP, last=1, days=None, roots=roots(st, EXP))
    removed = {(r["stage"], r["version"]) for r in the_plan["remove"]}
    kept = {k for reason in the_plan["kept"].values() for k in reason}
    for must in ("grpo/v3", "sft/v3", "eval/v3", "grpo/v1", "sft/v1", "eval/v1", "sft/v2", "heldout/v1", "data/v1"):
        assert must in kept, (must, the_plan["kept"])  # champion + lineage + crowning eval; rollback target; running
    assert ("grpo", 2) in removed and ("grpo", 4) in removed and ("reward-dry-run", 1) in removed
    assert ("grpo", 6) not in removed and ("eval", 6) not in removed  # the last of each stage, and the newest eval
    assert not any(stage in ("heldout", "data") for stage, _ in removed)


def test_gc_frees_what_it_says_leaves_tombstones_and_the_store_still_reads(tmp_path, capsys):
    store = tmp_path / "store"
    st = experiment(store)
    before = folder_bytes(store / EXP)
    code, out, _ = run_cli(["gc", EXP, "--keep-last", "1", "--dry-run", "--store", str(store)], capsys)
    assert code == 0 and "would remove" in out and folder_bytes(store / EXP) == before  # a dry run removes nothing
    done = collect(st, EXP, last=1, days=None)
    removed_bytes = sum(r["bytes"] for r in done["remove"])
    assert done["freed"] == removed_bytes > 0
    assert before - folder_bytes(store / EXP) >= removed_bytes * 0.9  # (the file system's blocks besides)
    for r in done["remove"]:
        folder = store / EXP / r["stage"] / f"v{r['version']}"
        assert sorted(p.name for p in folder.iterdir()) == [TOMBSTONE]
    assert st.next_version(EXP, "grpo") == 7  # numbers are never given again
    assert policy_from_ref(st, EXP, {"stage": "grpo", "fingerprint": "fp3"})["version"] == 3
    code, out, _ = run_cli(["status", EXP, "--store", str(store), "--check"], capsys)
    assert code == 0 and "index differed" not in out
    code, out, _ = run_cli(["rollback", EXP, "--store", str(store), "--reason", "after gc"], capsys)
    assert code == 0 and "to grpo v1" in out  # the rollback target survived


GC = """
import sys
from regimen.stages.store import Store
from regimen.stages.store.retention import collect
collect(Store(sys.argv[1]), sys.argv[2], last=1, days=None)
"""


@pytest.mark.parametrize("step", ["planned", "unindexed", "manifest", "files", "tombstone"])
def test_a_gc_killed_at_each_step_leaves_a_readable_store_and_the_next_gc_finishes_it(step, tmp_path, capsys):
    store = tmp_path / "store"
    st = experiment(store)
    expected = {(r["stage"], r["version"]) for r in plan(st, EXP, last=1, days=None, roots=roots(st, EXP))["remove"]}
    r = subprocess.run(
        [sys.executable, "-c", GC, str(store), EXP], env={**os.environ, "REGIMEN_KILL": f"gc@{step}"}, timeout=300
    )
    assert r.returncode == -9  # killed there
    for stage in ("sft", "grpo", "eval"):  # every command still reads
        listed = {e["version"] for e in st.versions(EXP, stage)}
        assert all((stage, v) not in expected or step == "planned" for v in listed), (stage, listed)
    assert policy_from_ref(st, EXP, {"stage": "grpo", "fingerprint": "fp3"})["version"] == 3
    code, out, err = run_cli(["status", EXP, "--store", str(store)], capsys)
    assert code == 0, err
    rebuilt = st.rebuild_index(EXP, "grpo")  # a rebuild does not bring back what the plan removes
    assert not {("grpo", int(v)) for v in rebuilt["versions"]} & expected
    done = collect(st, EXP, last=1, days=None)  # the next gc carries out the pending plan first
    assert done["resumed"] > 0 or step == "tombstone" or done["remove"] == []
    for stage, version in expected:
        folder = store / EXP / stage / f"v{version}"
        assert sorted(p.name for p in folder.iterdir()) == [TOMBSTONE], folder
    assert not (store / EXP / "gc-pending.json").exists()


def test_gc_of_a_bucket_store_with_its_index(s3_env, bucket, tmp_path):
    url = f"s3://{bucket}/r"
    st = experiment(url)
    fs = s3_env.client()
    for stage in ("sft", "grpo", "eval"):
        assert [e["version"] for e in st.versions(EXP, stage)] == scanned(st, stage)
    done = collect(st, EXP, last=1, days=None)
    assert done["freed"] == sum(r["bytes"] for r in done["remove"]) > 0
    for r in done["remove"]:
        left = fs.find(f"{bucket}/r/{EXP}/{r['stage']}/v{r['version']}")
        assert [p.rsplit("/", 1)[-1] for p in left] in ([TOMBSTONE], [".claim", TOMBSTONE]), left
    fresh = Store(url, cache_dir=tmp_path / "fresh")
    assert policy_from_ref(fresh, EXP, {"stage": "grpo", "fingerprint": "fp3"})["version"] == 3
    assert [e["version"] for e in fresh.versions(EXP, "grpo")] == scanned(fresh, "grpo")


def promoting_nights(root, nights: int = 4, *, champions: int = 1) -> Store:
    """Nights whose GRPO beats the champion each time (each promotes), each SFT trained from the champion (its inputs
    hold a policy and the held-out set, as a nightly SFT's do) and a gc after each (`--keep-last 1`)."""
    st = Store(root)
    heldout = data_records.freeze(
        st, EXP, [{"prompt": f"what is {i}+{i}?", "answer": str(2 * i)} for i in range(N)], by="flow", reason="first"
    )
    data_records.record_training_data(st, EXP, [{"prompt": f"q{i}", "answer": "1"} for i in range(30)], 0)
    start = {"stage": "base", "fingerprint": "base"}
    for i in range(1, nights + 1):
        sft = commit(st, "sft", f"sft{i}", inputs={"policy": start, "heldout": dict(heldout)})
        grpo = commit(st, "grpo", f"fp{i}", inputs={"policy": ref(st, sft)})
        staging = st._workspace.staging_dir(EXP, "eval")
        correct = [1] * (5 * i - 4) + [0] * (N - 5 * i + 4)
        (staging / "correct.json").write_text(json.dumps(correct))
        st._catalog.commit(
            staging,
            {
                "experiment": EXP,
                "stage": "eval",
                "fingerprint": f"ev{i}",
                "metrics": {"heldout_accuracy": sum(correct) / N},
                "inputs": {"policy": ref(st, grpo), "heldout": dict(heldout)},
            },
        )
        assert conclude(st, i)["event"] == "promoted"
        start = ref(st, grpo)
        collect(st, EXP, last=1, days=None, champions=champions)
    return st


def held(st: Store, stage: str) -> list[int]:
    return [e["version"] for e in st.versions(EXP, stage)]


def test_a_nightly_sft_from_the_champion_is_not_an_evaluation_and_only_k_earlier_champions_stay(
    tmp_path, capsys, monkeypatch
):
    """Issue 51: an SFT whose inputs hold a policy and the held-out set was taken for an evaluation of the champion
    (every night's SFT stayed), and every earlier champion stayed a root. Now only `keep.champions` earlier
    champions stay restorable: after four promoting nights with `--keep-last 1` and one earlier champion kept, each
    stage holds the champion's and the rollback target's versions and no more."""
    store = tmp_path / "store"
    st = promoting_nights(store, 4, champions=1)
    # the champion (grpo v4) and the rollback target (v3), each with its own round (its SFT, its evaluation); the
    # policy each round started from is an earlier night's result, kept by its own standing (v2: none)
    assert held(st, "sft") == [3, 4] and held(st, "grpo") == [3, 4] and held(st, "eval") == [3, 4]
    code, out, err = run_cli(["rollback", EXP, "--store", str(store), "--reason", "one back"], capsys)
    assert code == 0 and "to grpo v3" in out, (out, err)
    from regimen.flows.cli.models import console

    monkeypatch.setattr(console, "width", 400)  # the history table's rows unwrapped
    code, out, _ = run_cli(["champion", EXP, "--store", str(store)], capsys)
    assert code == 0 and "grpo v1 (removed by gc)" in out and "grpo v3 (removed" not in out, out


def test_a_rollback_past_the_retention_depth_is_refused_with_one_line(tmp_path, capsys):
    store = tmp_path / "store"
    st = promoting_nights(store, 3, champions=0)
    assert held(st, "grpo") == [3]  # no earlier champion kept: grpo v2, the rollback target, went
    code, out, err = run_cli(["rollback", EXP, "--store", str(store)], capsys)
    assert code == 2 and "grpo v2 was removed by retention (store.keep.champions" in err, (out, err)
    # one line from the command (the suite's in-process Prefect may print its own logging errors beside it)
    said = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and "removed by retention" in said[0], err


def test_the_recipe_and_the_command_line_keep_two_earlier_champions_by_default():
    from regimen.stages.recipe.schema import KeepSection
    from regimen.stages.store.retention import DEFAULT_CHAMPIONS

    assert KeepSection(last=1).champions == DEFAULT_CHAMPIONS == 2
    import inspect

    from regimen.flows.cli.store import gc

    assert inspect.signature(gc).parameters["keep_champions"].default == DEFAULT_CHAMPIONS


def test_an_evaluation_is_known_by_its_role_not_by_its_inputs():
    from regimen.stages.store.retention import is_evaluation

    shape = {"inputs": {"policy": {"stage": "grpo", "version": 1}, "heldout": {"stage": "heldout", "version": 1}}}
    assert is_evaluation({**shape, "role": "judge"}) and not is_evaluation({**shape, "role": "teach"})
    assert not is_evaluation({**shape, "has_model": True})  # written before roles: a model means it trained
    assert is_evaluation({**shape, "has_model": False}) and not is_evaluation({"inputs": {}, "has_model": False})


@pytest.mark.parametrize("step", ["planned", "unindexed", "manifest"])
def test_after_a_killed_gc_a_dry_run_lists_its_plan_and_status_check_rebuilds_nothing(step, tmp_path, capsys):
    """Issue 51: after a gc killed between its plan and its removals, `gc --dry-run` said "would remove 0" and
    `status --check` said the (correct) index had been rebuilt."""
    store = tmp_path / "store"
    st = experiment(store)
    expected = {(r["stage"], r["version"]) for r in plan(st, EXP, last=1, days=None, roots=roots(st, EXP))["remove"]}
    r = subprocess.run(
        [sys.executable, "-c", GC, str(store), EXP], env={**os.environ, "REGIMEN_KILL": f"gc@{step}"}, timeout=300
    )
    assert r.returncode == -9
    before = {s: (store / EXP / s / INDEX).read_bytes() for s in ("sft", "grpo", "eval")}
    code, out, _ = run_cli(["status", EXP, "--store", str(store), "--check"], capsys)
    assert code == 0 and "index differed" not in out and "rebuilt" not in out, out
    assert "a stopped gc planned to remove" in out, out
    assert {s: (store / EXP / s / INDEX).read_bytes() for s in before} == before  # nothing was rewritten
    code, out, _ = run_cli(["gc", EXP, "--keep-last", "5", "--dry-run", "--store", str(store)], capsys)
    assert code == 0 and f"would remove {len(expected)} version(s)" in out, out
    assert out.count("planned by a gc that was stopped") == len(expected), out
    code, out, _ = run_cli(["gc", EXP, "--keep-last", "5", "--store", str(store)], capsys)
    assert code == 0 and "removed 0 version(s)" in out and "a gc stopped earlier had planned" in out, out
    for stage, version in expected:
        assert sorted(p.name for p in (store / EXP / stage / f"v{version}").iterdir()) == [TOMBSTONE]


def test_the_newest_evaluations_policy_stays_when_a_newer_policy_was_never_evaluated(tmp_path):
    """Review finding: an evaluation's own policy is a measured policy, which the lineage walk does not follow; the
    policy `cycle.start_from: latest` takes must be a root of its own."""
    st = experiment(tmp_path / "store")  # champion grpo v3; the newest evaluation (eval v6) measured grpo v6
    commit(st, "grpo", "fp7", inputs={"policy": ref(st, st.versions(EXP, "sft")[-1])})  # trained, never evaluated
    the_plan = plan(st, EXP, last=1, days=None, roots=roots(st, EXP))
    removed = {(r["stage"], r["version"]) for r in the_plan["remove"]}
    assert ("grpo", 6) not in removed and ("eval", 6) not in removed, the_plan["kept"]
    assert ("grpo", 7) not in removed  # the last of its stage
