"""Shared helpers for the benchmarks: run the CLI or a Python snippet in a fresh process, time it,
read its peak RSS, and print results as a table. Each benchmark measures its baseline in the same run."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def scratch(prefix: str) -> str:
    """A temp folder for this benchmark, removed when it ends (also after a failure)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path


_PREFECT_HOME = scratch("regimen-bench-prefect-")  # one per benchmark: its database is created once,
# as on a user's machine, where ~/.prefect persists between runs


def env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PREFECT_HOME": _PREFECT_HOME,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **extra,
    }


def run(cmd: list[str], *, extra_env: dict[str, str] | None = None, check: bool = True, quiet: bool = True) -> dict:
    """Run `cmd` in its own session; returns wall time, exit code, peak RSS (MiB) and output tail."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a killed run's orphans may hold a pipe open
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env(**(extra_env or {})),
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        proc.wait()
        wall = time.perf_counter() - t0
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the run left (e.g. Prefect's temporary server)
        except ProcessLookupError:
            pass
        log.seek(0)
        out = log.read()
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{out[-3000:]}")
    return {"wall_s": wall, "rc": proc.returncode, "out": out}


def regimen(*args: str, **kw) -> dict:
    return run([PY, "-m", "regimen.flows.cli", *args], **kw)


def peak_rss_mib(cmd: list[str], extra_env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(wall s, peak RSS of the process in MiB, exit code), measured with wait4's rusage."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env(**(extra_env or {})),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def manifests(store: Path, experiment: str, stage: str) -> list[dict]:
    d = Path(store) / experiment / stage
    out = [json.loads((v / "manifest.json").read_text()) for v in d.glob("v*") if (v / "manifest.json").exists()]
    return sorted(out, key=lambda m: m["version"])


def table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    widths = [max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in cols]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(fmt(r.get(c, "")).ljust(w) for c, w in zip(cols, widths)) for r in rows]
    return "\n".join(lines)


def header(title: str) -> None:
    print(f"# {title}  ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores)")


def stage_run(recipe, name: str, inputs: dict, store):
    """One stage through the runner (the code the flow runs); (its result, wall seconds)."""
    from regimen.stages.run.runner import StageCall, execute

    t0 = time.perf_counter()
    result = execute(StageCall(name, recipe, inputs, experiment=recipe.experiment), store)
    return result, time.perf_counter() - t0


def steps_for(budget: float, short: float, long: float, k: int) -> tuple[int, float, float]:
    """Steps that fill `budget`, from the wall times of a k-step and a 2k-step run: (steps, per step, fixed)."""
    per_step = (long - short) / k
    if per_step <= 0:  # noise larger than k steps' cost: charge everything to the steps
        per_step = long / (2 * k)
    fixed = max(0.0, short - k * per_step)
    return max(k, int((budget - fixed) / per_step)), per_step, fixed


def curve(store: str, exp: str, version: int) -> list[dict]:
    """A GRPO version's training log (`train_log.jsonl`): the Trainer's entries and the probe's."""
    path = Path(store) / exp / "grpo" / f"v{version}" / "train_log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def first_reach(log: list[dict], target: float) -> float | None:
    """GRPO's own wall time (the probe entry's `wall_s`) when the held-out probe first reached `target`."""
    for h in log:
        if "heldout_probe" in h and h["heldout_probe"] >= target - 1e-9:
            return h.get("wall_s")
    return None
