"""The experiment's memory (issue 29): a person's move is never lost to a decision made on a stale read, a
frozen held-out set is never silently remade, and the commands a person types fail in one line.

The experiment here is built in the store by hand (grpo versions with a small model folder, their
evaluations on one frozen set with per-prompt outcomes): what the records' rules read, without training.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, TINY, run_cli

from regimen.flows.pipeline import champion
from regimen.stages.core.errors import RegimenError, StoreError
from regimen.stages.records import datasets as data_records
from regimen.stages.store import Store
from regimen.stages.training.policy import policy_from_ref

EXP = "rec"
N = 20
OUTCOMES = {1: [1] * 5 + [0] * 15, 2: [1] * 10 + [0] * 10, 3: [1] * 18 + [0] * 2}  # v3 > v2 > v1, each gain significant


def build(root: Path, exp: str = EXP) -> Store:
    """A store with a frozen set of N prompts, a data version, and grpo v1..v3 each evaluated on the set."""
    st = Store(root)
    heldout = data_records.freeze(
        st,
        exp,
        [{"prompt": f"what is {i}+{i}?", "answer": str(2 * i)} for i in range(N)],
        by="flow",
        reason="first run",
    )
    data_records.record_training_data(
        st, exp, [{"prompt": f"what is {i}+1?", "answer": str(i + 1)} for i in range(30)], 0
    )
    for v, correct in OUTCOMES.items():
        staging = st._workspace.staging_dir(exp, "grpo")
        (staging / "model").mkdir()
        (staging / "model" / "weights.bin").write_bytes(bytes([v]) * 64)
        st._catalog.commit(
            staging, {"experiment": exp, "stage": "grpo", "fingerprint": f"fp{v}", "inputs": {}, "metrics": {}}
        )
        ref = policy_from_ref(st, exp, {"stage": "grpo", "fingerprint": f"fp{v}"})
        staging = st._workspace.staging_dir(exp, "eval")
        (staging / "correct.json").write_text(json.dumps(correct))
        st._catalog.commit(
            staging,
            {
                "experiment": exp,
                "stage": "eval",
                "fingerprint": f"ev{v}",
                "metrics": {"heldout_accuracy": sum(correct) / N},
                "inputs": {
                    "policy": {k: ref[k] for k in ("stage", "version", "fingerprint", "content")},
                    "heldout": dict(heldout),
                },
            },
        )
    return st


def recipe(exp: str = EXP) -> SimpleNamespace:
    return SimpleNamespace(
        experiment=exp, rewards=[], promote=SimpleNamespace(min_gain=0.02, confidence=0.9, enabled=True)
    )


def challenger(st: Store, v: int, exp: str = EXP):
    heldout = data_records.current(st, exp)
    policy = policy_from_ref(st, exp, {"stage": "grpo", "fingerprint": f"fp{v}"})
    return champion.measured(policy, champion.evaluation_of(st, exp, policy, heldout), heldout)


def evaluate(st: Store, exp: str = EXP):
    """The flow's champion evaluation (a judge stage call in a real run: here the evaluation in the store)."""

    def run(ref):
        return champion.evaluation_of(st, exp, policy_from_ref(st, exp, ref), data_records.current(st, exp))

    return run


def conclude(st: Store, v: int, champion_eval=None, exp: str = EXP) -> dict:
    return champion.conclude(
        st,
        recipe(exp),
        exp,
        challenger=challenger(st, v, exp),
        champion_eval=champion_eval or evaluate(st, exp),
        stopped=None,
        trained_from=None,
        data_digest=None,
    )


def events(st: Store, exp: str = EXP) -> list[tuple[str, str, str]]:
    rec = champion.record(st, exp)
    return [(h["event"], h["by"], h.get("policy", "")) for h in rec["history"]]


# -- a person's move races the flow's decision ------------------------------------------------------


def test_a_rollback_landing_while_the_flow_decides_stands_and_the_flow_decides_again_on_it(tmp_path):
    st = build(tmp_path / "store")
    conclude(st, 1)
    conclude(st, 2)  # champion v2

    # the flow has read the record (champion v2) and evaluates it; a person rolls back meanwhile
    def champion_eval(ref):
        if not any(e[1] == "person" for e in events(st)):
            champion.person_rolls_back(st, EXP, "v2 misbehaves in production")
        return evaluate(st)(ref)

    line = conclude(st, 3, champion_eval)
    assert events(st) == [
        ("promoted", "flow", "grpo v1"),
        ("promoted", "flow", "grpo v2"),
        ("rolled-back", "person", "grpo v1"),
        ("promoted", "flow", "grpo v3"),
    ]
    # decided against the champion the person chose
    assert line["redone"] == 1 and line["figures"]["champion"]["policy"] == "grpo v1"
    rec = champion.record(st, EXP)
    assert rec["revision"] == len(rec["history"]) == 4


def test_a_veto_made_while_the_flow_decides_holds(tmp_path):
    """Champion v2; the flow's challenger is v3. While it evaluates v2, a person promotes v3 and rolls it
    back (a veto on v3). On its stale read the flow would promote v3 and drop both lines; it decides again."""
    st = build(tmp_path / "store")
    conclude(st, 1)
    conclude(st, 2)

    def champion_eval(ref):
        if not any(e[1] == "person" for e in events(st)):
            champion.person_promotes(st, EXP, "grpo/v3", "try it")
            champion.person_rolls_back(st, EXP, "v3 is wrong in ways the set does not show")
        return evaluate(st)(ref)

    line = conclude(st, 3, champion_eval)
    assert events(st)[2:] == [
        ("promoted", "person", "grpo v3"),
        ("rolled-back", "person", "grpo v2"),
        ("kept", "flow", "grpo v3"),
    ]
    assert "rolled back from" in line["reason"] and line["redone"] == 1
    assert champion.record(st, EXP)["champion"]["policy"] == "grpo v2"


def test_a_persons_move_before_or_after_the_decision_is_kept_with_its_veto(tmp_path):
    st = build(tmp_path / "store")
    conclude(st, 1)
    champion.person_promotes(st, EXP, "3", "")  # before the flow reads
    champion.person_rolls_back(st, EXP, "")
    line = conclude(st, 3)
    assert "redone" not in line and line["event"] == "kept" and "rolled back from" in line["reason"]
    conclude(st, 2)  # v2 vs the champion v1: promoted
    champion.person_rolls_back(st, EXP, "after the flow wrote")  # after the flow wrote
    assert [e[:2] for e in events(st)] == [
        ("promoted", "flow"),
        ("promoted", "person"),
        ("rolled-back", "person"),
        ("kept", "flow"),
        ("promoted", "flow"),
        ("rolled-back", "person"),
    ]
    assert champion.record(st, EXP)["champion"]["policy"] == "grpo v1"


def _hammer(root: str, who: str, moves: int, out: str) -> None:
    """One process's moves (a person's promotes, or the flow's decisions with a slow champion evaluation);
    writes how many it recorded."""
    st = Store(root)
    done = 0
    for i in range(moves):
        if who == "flow":

            def slow(ref):
                time.sleep(0.02)  # the window a person's move lands in
                return evaluate(st)(ref)

            try:
                conclude(st, 3, slow)
                done += 1
            except StoreError:  # the record kept changing under it: nothing recorded by the flow, said so
                pass
        else:
            champion.person_promotes(st, EXP, f"grpo/v{1 + (i % 2)}", f"{who} {i}")
            done += 1
        time.sleep(0.005)
    Path(out).write_text(str(done))


def test_concurrent_people_and_a_flow_lose_no_line(tmp_path):
    """Three processes at once on one record: two people promoting and the flow deciding. Every move each
    process recorded is in the history, and the record's revision counts them all (no lost update)."""
    st = build(tmp_path / "store")
    conclude(st, 1)
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_hammer, args=(str(tmp_path / "store"), who, 12, str(tmp_path / f"{who}.n")))
        for who in ("alice", "bob", "flow")
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    counts = {who: int((tmp_path / f"{who}.n").read_text()) for who in ("alice", "bob", "flow")}
    rec = champion.record(st, EXP)
    history = rec["history"][1:]
    assert counts["alice"] == counts["bob"] == 12 and counts["flow"] >= 1
    assert (
        sum(1 for h in history if h["reason"].startswith("alice")) == 12
        and sum(1 for h in history if h["reason"].startswith("bob")) == 12
    )
    assert sum(1 for h in history if h["by"] == "flow") == counts["flow"]
    assert rec["revision"] == len(rec["history"]) == 1 + sum(counts.values())


def test_an_unreadable_champion_record_stops_its_readers_instead_of_starting_a_new_history(tmp_path):
    st = build(tmp_path / "store")
    conclude(st, 1)
    path = tmp_path / "store" / EXP / "champion.json"
    path.write_text(path.read_text()[:40])  # torn by hand
    with pytest.raises(StoreError, match="champion.json: unreadable"):
        conclude(st, 2)
    with pytest.raises(StoreError, match="champion.json: unreadable"):
        champion.person_promotes(st, EXP, "2", "")
    assert len(path.read_text()) == 40  # nothing written over it


# -- frozen means frozen ------------------------------------------------------------------------------


def _tiny_experiment(root: Path) -> Store:
    """The tiny recipe's experiment as a first run leaves its records: the frozen set from its data and a
    data version (no training needed to test what happens before any stage)."""
    from regimen.stages.recipe import load_recipe
    from regimen.stages.tasks.registry import load_task

    r = load_recipe(TINY, {"store": str(root)})
    st = Store(root)
    data_records.resolve(st, r.experiment, load_task(r.data).heldout)
    task = load_task(r.data, data_records.current(st, r.experiment))
    data_records.record_training_data(st, r.experiment, task.train, task.dropped_heldout)
    return st


@pytest.mark.parametrize("damage", ["edited", "deleted-file", "deleted-set", "manifest"])
def test_a_damaged_or_missing_frozen_set_stops_the_run_naming_the_file_and_the_way_out(damage, tmp_path, capsys):
    from conftest import run_flow

    store = tmp_path / "store"
    _tiny_experiment(store)
    st = Store(store)  # a champion measured on set v1 (its record names the set)
    st.update_record(
        "tiny-test",
        "champion.json",
        lambda _: {"champion": None, "history": [{"event": "kept", "by": "flow", "reason": "-", "heldout_set": 1}]},
    )
    v1 = store / "tiny-test" / "heldout" / "v1"
    rows = v1 / "rows.jsonl"
    if damage == "edited":
        lines = rows.read_text().splitlines()
        rows.write_text("\n".join(lines[1:]) + "\n")  # one prompt fewer: the set quietly changed
    elif damage == "deleted-file":
        rows.unlink()
    elif damage == "deleted-set":
        shutil.rmtree(v1)
    else:
        (v1 / "manifest.json").write_text("{not json")
    before = sorted(
        p.relative_to(store).as_posix() for p in store.rglob("*") if ".lock" not in p.name and ".owner" not in p.name
    )
    with pytest.raises(RegimenError) as exc:
        run_flow(TINY, store)
    message = str(exc.value)
    assert exc.value.exit_code == 1 and "frozen held-out set" in message and "regimen heldout refresh" in message, (
        message
    )
    assert ("rows.jsonl" in message) if damage in ("edited", "deleted-file") else ("heldout" in message), message
    after = sorted(
        p.relative_to(store).as_posix() for p in store.rglob("*") if ".lock" not in p.name and ".owner" not in p.name
    )
    assert [
        p for p in after if p not in before and "/failed/" not in p and not p.endswith("/failed")
    ] == []  # no new set, nothing trained
    code, out, _ = run_cli(["status", "tiny-test", "--store", str(store)], capsys)
    assert code == 0 and "DAMAGED" in out and "heldout refresh" in out, out

    # the one way out: a person's refresh makes v2 (recorded as theirs), and runs use it from then on
    code, out, err = run_cli(
        ["heldout", "refresh", str(TINY), "--reason", "rows.jsonl was edited by hand", "--store", str(store)], capsys
    )
    assert code == 0, err
    st = Store(store)
    ref = data_records.current(st, "tiny-test")
    assert ref["version"] == 2
    manifest = st.versions("tiny-test", "heldout")[-1]
    assert manifest["by"] == "person" and manifest["reason"] == "rows.jsonl was edited by hand"


def test_restoring_an_older_set_does_not_switch_back_silently(tmp_path):
    st = _tiny_experiment(tmp_path / "store")
    rows = tmp_path / "store" / "tiny-test" / "heldout" / "v1" / "rows.jsonl"
    data_records.refresh(
        st,
        "tiny-test",
        [json.loads(x) for x in rows.read_text().splitlines()][:5] + [{"prompt": "new?", "answer": "1"}],
        reason="a person's new set",
    )
    assert data_records.current(st, "tiny-test")["version"] == 2
    (tmp_path / "store" / "tiny-test" / "heldout" / "v2" / "rows.jsonl").write_text("")
    with pytest.raises(data_records.HeldoutDamaged, match="set v2"):
        data_records.current(st, "tiny-test")  # v1 is intact, and still not used in v2's place


def test_a_refreshed_set_leaves_out_every_prompt_the_experiment_trained_on(tmp_path):
    st = build(tmp_path / "store")
    # case differs: the same prompt after normalisation
    trained = [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in range(5)]
    data_records.record_training_data(
        st, EXP, [{"prompt": f"what is {i}+1?", "answer": str(i + 1)} for i in range(30, 40)], 0
    )
    fresh = [{"prompt": f"what is {i}*3?", "answer": str(3 * i)} for i in range(7)]
    ref = data_records.refresh(
        st, EXP, trained + fresh + [{"prompt": "what is 35+1?", "answer": "36"}], reason="a wider set"
    )
    assert ref["excluded_trained"] == 6 and ref["rows"] == 7
    manifest = st.versions(EXP, "heldout")[-1]
    assert manifest["excluded_trained"] == 6 and manifest["by"] == "person"
    kept = [json.loads(x)["prompt"] for x in (Path(ref["path"]) / "rows.jsonl").read_text().splitlines()]
    assert kept == [r["prompt"] for r in fresh]
    with pytest.raises(RegimenError, match="all 5 held-out prompts"):
        data_records.refresh(st, EXP, trained, reason="only trained prompts")


# -- a person's commands -------------------------------------------------------------------------------


def _commands():
    from regimen.flows.cli import app

    names = [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands]
    groups = [(g.name, g.typer_instance) for g in app.registered_groups]
    out = [[n] for n in names]
    for name, sub in groups:
        out += [[name, c.name or c.callback.__name__] for c in sub.registered_commands]
    return out


def test_every_command_is_in_the_misuse_table():
    assert sorted(" ".join(c) for c in _commands()) == sorted(MISUSE)


MISUSE = {  # command -> (args that miss a required argument or None when it has none, a bad value)
    "run": ([], ["configs/default.yaml", "--set"]),
    "check": ([], ["tests/tiny.yaml", "--set"]),
    "reward-check": ([], ["--samples"]),
    "status": ([], ["x", "--store"]),
    "trajectories": ([], ["x", "--limit", "many"]),
    "sweep": ([], ["tests/tiny.yaml", "--store"]),
    "report": ([], ["x", "--store"]),
    "serve": ([], ["configs/default.yaml", "--max-steps", "-3"]),
    "make-model": ([], ["out", "--layers", "two"]),
    "champion": ([], ["x", "--store"]),
    "promote": (["x"], ["x", "3", "--reason"]),
    "rollback": ([], ["x", "--reason"]),
    "export": (["x"], ["x", "out", "--store"]),
    "gc": ([], ["x", "--keep-last", "zero"]),
    "reindex": ([], ["x", "--store"]),
    "heldout refresh": (["tests/tiny.yaml"], ["tests/tiny.yaml", "--reason"]),
    "pool setup": ([], ["--store", "s3://bucket/p", "--max-steps", "-1"]),
}


@pytest.mark.parametrize("command", sorted(MISUSE))
@pytest.mark.parametrize("misuse", ["missing-argument", "unknown-option", "bad-value"])
def test_every_cli_misuse_is_one_line_and_exit_2(command, misuse, capsys):
    words = command.split()
    missing, bad = MISUSE[command]
    args = {
        "missing-argument": words + missing,
        "unknown-option": words + ["--no-such-option"],
        "bad-value": words + bad,
    }[misuse]
    code, out, err = run_cli(args, capsys)
    assert code == 2, (args, out, err)
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in out + err, (args, err)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--hidden-size", "0"], "--hidden-size 0"),
        (["--hidden-size", "-5"], "--hidden-size -5"),
        (["--hidden-size", "99999999"], "--hidden-size 99999999"),
        (["--hidden-size", "20"], "--hidden-size 20"),
        (["--layers", "0"], "--layers 0"),
    ],
)
def test_make_model_refuses_sizes_no_model_has_in_one_line_and_writes_nothing(args, says, tmp_path, capsys):
    # --hidden-size 0 was a ZeroDivisionError traceback, 99999999 one from huggingface_hub's validation
    code, out, err = run_cli(["make-model", str(tmp_path / "m"), *args], capsys)
    assert code == 2 and err.strip().splitlines() == [err.strip()] and says in err, (out, err)
    assert not (tmp_path / "m").exists()


def test_export_is_atomic_refuses_links_and_files_and_leaves_nothing_on_failure(tmp_path, capsys, monkeypatch):
    st = build(tmp_path / "store")
    conclude(st, 2)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a-file").write_text("mine")
    (out / "link").symlink_to(tmp_path / "elsewhere")
    for target in ("a-file", "link"):
        code, _, err = run_cli(["export", EXP, str(out / target), "--store", str(tmp_path / "store")], capsys)
        # (an earlier in-process flow's log handler may add noise)
        said = [x for x in err.splitlines() if x.startswith(("error:", "stopped:"))]
        assert code == 2 and len(said) == 1 and target.replace("a-file", "file") in said[0], err
    assert not (tmp_path / "elsewhere").exists() and (out / "a-file").read_text() == "mine"

    real_copy = shutil.copy2

    def full_disk(src, dst, *a, **k):  # the disk fills up half-way through the copy
        if Path(src).name == "weights.bin":
            raise OSError(28, "No space left on device", str(dst))
        return real_copy(src, dst, *a, **k)

    real_copytree = shutil.copytree
    monkeypatch.setattr(
        shutil, "copytree", lambda src, dst, **k: real_copytree(src, dst, **{**k, "copy_function": full_disk})
    )
    code, _, err = run_cli(["export", EXP, str(out / "model"), "--store", str(tmp_path / "store")], capsys)
    said = [x for x in err.splitlines() if x.startswith(("error:", "stopped:"))]
    assert code == 1 and len(said) == 1 and "No space left" in said[0], err
    assert sorted(p.name for p in out.iterdir()) == ["a-file", "link"]  # nothing half-written, no hidden partial copy
    monkeypatch.undo()

    code, stdout, err = run_cli(["export", EXP, str(out / "model"), "--store", str(tmp_path / "store")], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["a-file", "link", "model"]
    assert (out / "model" / "weights.bin").read_bytes() == bytes([2]) * 64
    assert json.loads((out / "model" / "regimen_champion.json").read_text())["policy"] == "grpo v2"


def test_promote_and_rollback_with_prefect_down_write_the_record_and_say_so_in_one_line(tmp_path):
    from prefect_ops import free_port

    build(tmp_path / "store")
    conclude(Store(tmp_path / "store"), 1)
    env = {**os.environ, "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}  # nothing listens there
    for args in (["promote", EXP, "grpo/v3", "--reason", "by hand"], ["rollback", EXP]):
        r = subprocess.run(
            [str(Path(sys.executable).parent / "regimen"), *args, "--store", str(tmp_path / "store")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        text = r.stdout + r.stderr
        assert r.returncode == 0, text
        assert text.count("not announced to Prefect") == 1 and "Traceback" not in text and "ConnectError" not in text, (
            text
        )
    assert [e[:2] for e in events(Store(tmp_path / "store"))] == [
        ("promoted", "flow"),
        ("promoted", "person"),
        ("rolled-back", "person"),
    ]


def test_the_guard_is_the_operators_policy_not_a_ui_parameter_unless_serve_allows_it():
    from regimen.flows.serving.boundary import check_overrides
    from regimen.stages.core.errors import InputError

    for key, value in (
        ("cycle.guard.action", "warn"),
        ("cycle.guard.train_rise", 1e3),
        ("cycle.guard", {"action": "warn"}),
    ):
        with pytest.raises(InputError, match="operator's policy"):
            check_overrides({key: value}, [])
    assert check_overrides({"cycle.guard.action": "warn"}, ["cycle.guard.*"]) == {"cycle.guard.action": "warn"}
    # the rest of cycle.* stays a UI parameter
    assert check_overrides({"cycle.max_cycles": 3}, []) == {"cycle.max_cycles": 3}


@pytest.mark.parametrize(
    "args",
    [["sweep", str(TINY), "--set", "grpo.num_generations=2,4"], ["heldout", "refresh", str(TINY), "--reason", "r"]],
)
def test_a_bad_experiment_name_is_refused_before_anything_is_written(args, tmp_path, capsys):
    """--experiment is data of the command (not put into the recipe): still checked first, exit 2, one line."""
    code, out, err = run_cli([*args, "--store", str(tmp_path / "store"), "--experiment", "../x"], capsys)
    said = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(said) == 1 and "experiment '../x'" in said[0], err
    assert not (tmp_path / "store").exists() and not (tmp_path / "x").exists()


def test_a_write_whose_revision_was_claimed_meanwhile_is_refused_and_reads_roll_forward(tmp_path):
    """The fence at the write (issue 42): a writer whose next revision was claimed by another (who took the lock
    while this one was paused) is refused by its claim, writes nothing, and every reader sees the other's
    revision even before the record file itself was rewritten."""
    from regimen.stages.store import StaleRecord
    from regimen.stages.store.lock import exclusive_create

    st = build(tmp_path / "store")
    conclude(st, 1)
    before = st.read_record(EXP, "champion.json")
    rev = before["revision"]

    def change(current):
        other = {"revision": rev + 1, "set": {"note": "the other writer"}, "removed": [], "history_added": ["theirs"]}
        assert exclusive_create(
            st.fs, st._ledger.revision_path(EXP, "champion.json", rev + 1), json.dumps(other).encode()
        )
        return {**current, "history": [*current["history"], "mine"]}

    with pytest.raises(StaleRecord, match=f"revision {rev + 1} was written meanwhile"):
        st.update_record(EXP, "champion.json", change)
    on_disk = json.loads((tmp_path / "store" / EXP / "champion.json").read_text())
    assert on_disk["revision"] == rev  # nothing of the refused write
    now = st.read_record(EXP, "champion.json")  # rolled forward through the other's claim
    assert now["revision"] == rev + 1 and now["note"] == "the other writer" and now["history"][-1] == "theirs"
    assert "mine" not in now["history"]
    nxt = st.update_record(EXP, "champion.json", lambda cur: {**cur, "history": [*cur["history"], "next"]})
    assert nxt["revision"] == rev + 2 and nxt["history"][-2:] == ["theirs", "next"]
    claims = sorted(p.name for p in (tmp_path / "store" / EXP / "revisions" / "champion.json").iterdir())
    assert claims == [f"r{i:08d}.json" for i in range(1, rev + 3)]
