"""Failures tell the truth: bad rewards and bad data are refused before anything trains, naming what is
wrong; Ctrl-C, SIGTERM and SIGKILL leave a clear state and no orphans; a full disk, a read-only store, a
malformed manifest and an over-long name give one line, the right exit code, and an intact store."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from conftest import ROOT, TINY, run_cli

from regimen.stages.registry import NAMES
from regimen.stages.store import Store

REGIMEN = str(Path(sys.executable).parent / "regimen")


def intact(store: Path) -> None:
    """Every version of every experiment in the store matches its digests."""
    if not store.exists():
        return
    st = Store(store)
    for exp in [
        p.name for p in store.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
    ]:  # _base: the cache
        for stage in NAMES:
            for m in st.versions(exp, stage):
                assert st.verify(m) == [], (exp, stage, m["version"])


# -- rewards ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reward, needles",
    [
        ("nan_reward", ["'rewards_for_tests.nan_reward'", "row 0", "nan"]),
        ("inf_reward", ["'rewards_for_tests.inf_reward'", "row 3", "inf"]),
        ("string_reward", ["'rewards_for_tests.string_reward'", "row 0", "'1.0'", "str"]),
        ("short_reward", ["'rewards_for_tests.short_reward'", "returned 1 values for 4"]),
        ("raising_reward", ["'rewards_for_tests.raising_reward'", "ZeroDivisionError", "the reward's own bug"]),
    ],
)
def test_a_bad_reward_is_refused_before_anything_trains(reward, needles, tmp_path, capsys):
    store = tmp_path / "store"
    code, out, err = run_cli(
        ["run", str(TINY), "--store", str(store), "--set", f"rewards=[{{name: 'rewards_for_tests:{reward}'}}]"], capsys
    )
    assert code == 2, (out, err)
    for needle in needles:
        assert needle in err, (needle, err)
    assert "Traceback" not in err
    assert not store.exists()  # refused before the store was touched


def test_the_dry_run_diagnoses_a_reward_that_scores_nothing():
    from regimen.stages.dry_run import diagnose, group_stats
    from regimen.stages.recipe.schema import DryRunSection

    stats = group_stats([float("nan")] * 8, 4)
    assert stats["unscored"] == 8 and stats["frac_reward_zero_std"] == 1.0
    assert "no reward scored any" in diagnose(stats, DryRunSection(), prompts=2, group=4, temperature=1.0)
    mixed = group_stats([1.0, float("nan"), 0.0, 1.0], 2)  # NaN never crashes the statistics
    assert mixed["unscored"] == 1 and mixed["mean_reward"] == pytest.approx(2 / 3)


@pytest.mark.slow
def test_a_reward_of_only_none_stops_at_the_dry_run_with_its_diagnosis(tmp_path, capsys):
    store = tmp_path / "store"
    code, out, err = run_cli(
        ["run", str(TINY), "--store", str(store), "--set", "rewards=[{name: 'rewards_for_tests:none_reward'}]"], capsys
    )
    assert code == 1 and "reward-dry-run" in err and "no reward scored any" in err, err
    assert "Traceback" not in err
    intact(store)


# -- data ------------------------------------------------------------------------------------------


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def run_jsonl(tmp_path, capsys, train: Path, heldout: Path | None = None, *more: str):
    store = tmp_path / "store"
    args = [
        "run",
        str(TINY),
        "--store",
        str(store),
        "--set",
        "data={task: jsonl, train_file: " + str(train) + (", heldout_file: " + str(heldout) if heldout else "") + "}",
        *more,
    ]
    code, out, err = run_cli(args, capsys)
    assert "Traceback" not in err
    assert not store.exists()
    return code, err


GOOD = [{"prompt": f"Q: {i}+1=", "answer": str(i + 1)} for i in range(20)]


def test_a_huge_row_is_refused_at_once_not_read_into_memory(tmp_path, capsys):
    from regimen.stages.tasks import InputError, read_jsonl

    train = jsonl(
        tmp_path / "train.jsonl", GOOD[:3] + ['{"prompt": "' + "x" * (50 << 20) + '", "answer": "1"}'] + GOOD[3:]
    )
    code, err = run_jsonl(tmp_path, capsys, train)
    assert code == 2 and f"{train}:4" in err and "over 1024 KiB" in err
    # the reader itself never holds the 50 MiB row: it reads at most the cap and a byte
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r":4: the line is over 1024 KiB"):
            list(read_jsonl(train))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak {peak >> 20} MiB while refusing a 50 MiB row"


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"prompt": None, "answer": "1"}, "'prompt' must be text or a list of chat messages, got null"),
        ({"prompt": 42, "answer": "1"}, "got int"),
        ({"prompt": [{"role": "user"}], "answer": "1"}, "message 0 must be {role: str, content: str}"),
        ({"prompt": "Q: 9+9=", "answer": {"x": 1}}, "'answer' must be text or a number"),
        ({"question": "Q: 9+9=", "answer": "18"}, "missing column 'prompt'"),
        ({"prompt": "x" * 9000, "answer": "1"}, "over data.max_prompt_chars=8000"),
    ],
)
def test_bad_rows_are_refused_naming_file_and_row(bad, needle, tmp_path, capsys):
    train = jsonl(tmp_path / "train.jsonl", GOOD[:5] + [bad] + GOOD[5:])
    code, err = run_jsonl(tmp_path, capsys, train)
    assert code == 2 and str(train) in err and "row 6" in err and needle in err, err


def test_missing_answers_and_overlap_are_named_for_what_they_are(tmp_path, capsys):
    no_answer = jsonl(tmp_path / "heldout.jsonl", [{"prompt": f"Q: {i}+2="} for i in range(5)])
    code, err = run_jsonl(tmp_path, capsys, jsonl(tmp_path / "train.jsonl", GOOD), no_answer)
    assert (
        code == 2
        and "held-out row 1 (prompt 'Q: 0+2=') has no 'answer'" in err
        and "exact_match" in err
        and "min_reward" not in err
    )
    # a training row equal to a held-out prompt (up to whitespace and case) is left out of training and counted, not a
    # refusal
    from regimen.stages.tasks import jsonl as jsonl_task

    overlap = jsonl(tmp_path / "overlap.jsonl", [{"prompt": "  q: 3+1= ", "answer": "4"}])
    task = jsonl_task.load(
        jsonl_task.Options(train_file=str(jsonl(tmp_path / "train.jsonl", GOOD)), heldout_file=str(overlap))
    )
    assert (
        task.dropped_heldout == 1
        and "Q: 3+1=" not in [r["prompt"] for r in task.train]
        and len(task.train) == len(GOOD) - 1
    )
    code, err = run_jsonl(tmp_path, capsys, jsonl(tmp_path / "t.jsonl", GOOD[:1]))
    assert code == 2 and "too few distinct prompts" in err


# -- store faults ------------------------------------------------------------------------------------


def test_an_over_long_or_hostile_experiment_name_is_exit_2(tmp_path, capsys):
    code, _, err = run_cli(["run", str(TINY), "--store", str(tmp_path / "s"), "--experiment", "x" * 300], capsys)
    assert code == 2 and "experiment" in err and "Traceback" not in err and len(err) < 400
    code, _, err = run_cli(["status", "../../etc", "--store", str(tmp_path / "s")], capsys)
    assert code == 2 and "Traceback" not in err
    code, _, err = run_cli(["report", "../outside", "--store", str(tmp_path / "s")], capsys)
    assert code == 2 and not (tmp_path / "outside").exists()
    code, _, err = run_cli(["status", "never-ran", "--store", str(tmp_path / "s")], capsys)
    assert code == 2 and "no experiment 'never-ran'" in err


def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0
    )


@pytest.mark.slow
def test_a_full_disk_is_one_line_exit_1_and_the_real_error_is_kept(tmp_path, capsys):
    store = tmp_path / "full"
    if os.geteuid() != 0 or not _mount_tmpfs(store, "size=600k"):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        code, out, err = run_cli(["run", str(TINY), "--store", str(store)], capsys)
        assert code == 1, (out, err)
        assert "no space left on the device" in err and "Traceback" not in err
        last = err.strip().splitlines()[-1]  # above it: the trainers' progress bars, as in any run
        assert last.startswith("stopped: sft: no space left on the device") and err.count("stopped:") == 1, err
        # the failed attempt could not be written into the full store: it is kept on this host, and says why
        kept = re.search(r"could not record the failed attempt of sft in the store .*; recorded in (\S+?\.json)", err)
        assert kept, err
        assert "o space left" in json.loads(Path(kept.group(1)).read_text())["error"]
    finally:
        subprocess.run(["umount", "-l", str(store)])


@pytest.mark.slow
def test_a_read_only_store_is_one_line_exit_1(tmp_path, capsys):
    store = tmp_path / "ro"
    if os.geteuid() != 0 or not _mount_tmpfs(store, "size=1m,ro"):
        pytest.skip("needs root to mount a read-only tmpfs")
    try:
        code, out, err = run_cli(["run", str(TINY), "--store", str(store)], capsys)
        assert code == 1 and "read-only" in err and "Traceback" not in err, (out, err)
    finally:
        subprocess.run(["umount", "-l", str(store)])


# -- signals ------------------------------------------------------------------------------------------


def _start(store: Path, *more: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "REGIMEN_MACHINE_SLOTS": "0"}
    return subprocess.Popen(
        [REGIMEN, "run", str(TINY), "--store", str(store), *more],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )


def _wait_for(path_glob: Path, pattern: str, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not list(path_glob.glob(pattern)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{pattern} never appeared"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")])
def test_an_interruption_exits_with_its_code_says_what_and_status_says_interrupted(sig, code, word, tmp_path, capsys):
    store = tmp_path / "store"
    proc = _start(store, "--set", "grpo.max_steps=400", "--set", "grpo.save_steps=5")
    try:
        _wait_for(store / "tiny-test" / "grpo" / "work", "*/checkpoint-5/regimen_complete", proc)
        os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, (out, err)
    assert "interrupted" in err and "grpo" in err and word in err and "rerun resumes from step" in err, err
    assert "Traceback" not in err
    rc, out, _ = run_cli(["status", "tiny-test", "--store", str(store)], capsys)
    assert rc == 0 and "grpo" in out and "interrupted" in out
    intact(store)


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


@pytest.mark.slow
def test_no_prefect_server_outlives_a_sigkilled_run(tmp_path, no_shared_api):
    store = tmp_path / "store"
    proc = _start(store)
    try:
        _wait_for(store, "tiny-test/sft/running.json", proc)
        servers = [
            k for k in _children(proc.pid) if b"regimen.flows.serving.server" in Path(f"/proc/{k}/cmdline").read_bytes()
        ]
        assert servers, "the temporary Prefect server should be a child of the run"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while any(
            Path(f"/proc/{k}").exists() and b"regimen.flows.serving.server" in Path(f"/proc/{k}/cmdline").read_bytes()
            for k in servers
        ):
            assert time.monotonic() < deadline, "the temporary Prefect server outlived its SIGKILLed parent"
            time.sleep(0.2)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_process_that_runs_several_flows_keeps_no_idle_server(tmp_path, capsys, no_shared_api):
    """The temporary server of an in-process run stops when the run ends (not at the process's exit): a
    notebook or a test session that runs many flows does not keep one idle server per run."""

    def servers() -> list[int]:
        found = []
        for p in Path("/proc").iterdir():
            try:
                if (
                    p.name.isdigit()
                    and f"regimen.flows.serving.server\x00{os.getpid()}".encode() in (p / "cmdline").read_bytes()
                ):
                    found.append(int(p.name))
            except OSError:
                pass
        return found

    before = servers()
    for i in range(2):
        code, _, err = run_cli(
            [
                "run",
                str(TINY),
                "--store",
                str(tmp_path / "s"),
                "--experiment",
                f"idle-{i}",
                "--set",
                "sft.max_steps=2",
                "--set",
                "grpo.max_steps=2",
                "--set",
                "smoke.max_steps=1",
            ],
            capsys,
        )
        assert code in (0, 1), err
    deadline = time.monotonic() + 10
    while [p for p in servers() if p not in before] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [p for p in servers() if p not in before] == []
