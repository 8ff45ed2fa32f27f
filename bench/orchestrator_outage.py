"""Training does not depend on the orchestrator being up: GRPO steps/s with the Prefect server killed
mid-run against with it up, and the time from SIGTERM to exit in both cases. One invocation.

A real `prefect server start` on 127.0.0.1 (a temporary PREFECT_HOME) and `regimen run tests/tiny.yaml`
against it (PREFECT_API_URL), GRPO long enough to kill the server in its middle:

- up:    the server stays up; GRPO's steps/s after checkpoint K (from its own train_log.jsonl)
- down:  the server is SIGKILLed when checkpoint K is written; the same steps/s; the run's exit code and
         the seconds from GRPO's last step to the process's exit
- SIGTERM, up / down: a run signalled at checkpoint K (and, down, 2 s after the server was killed):
         seconds from the signal to the exit, and the exit code (143)

Usage: python bench/orchestrator_outage.py [--steps 1500] [--at 300]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import PY, ROOT, env, header, scratch, table  # noqa: E402

EXP = "tiny-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(home: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    e = {k: v for k, v in env().items() if not k.startswith("PREFECT_API")}
    e.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    from regimen.flows.serving.server import start_server as start

    return start(port, e, home / "server.log")


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def start_run(store: Path, url: str, home: Path, steps: int, log: Path) -> subprocess.Popen:
    e = env(PREFECT_API_URL=url, PREFECT_HOME=str(home), OMP_NUM_THREADS="1", REGIMEN_MACHINE_SLOTS="0")
    return subprocess.Popen(
        [
            PY,
            "-m",
            "regimen.flows.cli",
            "run",
            "tests/tiny.yaml",
            "--store",
            str(store),
            "--set",
            f"grpo.max_steps={steps}",
            "--set",
            "grpo.save_steps=100",
            "--set",
            "grpo.logging_steps=10",
        ],
        cwd=ROOT,
        env=e,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_checkpoint(store: Path, step: int, proc: subprocess.Popen, timeout: float = 600) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list((store / EXP / "grpo" / "work").glob(f"*/checkpoint-{step}/regimen_complete")):
            return time.monotonic()
        if proc.poll() is not None:
            raise SystemExit(f"the run exited ({proc.returncode}) before GRPO's checkpoint {step}")
        time.sleep(0.05)
    raise SystemExit(f"no checkpoint {step} after {timeout}s")


def steps_per_s(store: Path, after: int) -> float:
    rows = [
        json.loads(line)
        for line in (next((store / EXP / "grpo").glob("v*")) / "train_log.jsonl").read_text().splitlines()
        if line.strip()
    ]
    rows = [r for r in rows if "wall_s" in r and "step" in r and r["step"] >= after]
    return (rows[-1]["step"] - rows[0]["step"]) / (rows[-1]["wall_s"] - rows[0]["wall_s"])


def training_run(base: Path, name: str, steps: int, at: int, kill_server: bool) -> dict:
    home, store, log = base / f"home-{name}", base / f"store-{name}", base / f"{name}.log"
    home.mkdir()
    server, url = start_server(home)
    try:
        proc = start_run(store, url, home, steps, log)
        wait_checkpoint(store, at, proc)
        if kill_server:
            kill(server)
        t_end = None
        while proc.poll() is None:
            if t_end is None and list((store / EXP / "grpo").glob("v*/manifest.json")):
                t_end = time.monotonic()
            time.sleep(0.1)
        exited = time.monotonic()
        rc = proc.returncode
    finally:
        kill(server)
        if proc.poll() is None:
            kill(proc)
    out = log.read_text(errors="replace")
    return {
        "case": name,
        "rc": rc,
        "steps_per_s": steps_per_s(store, at) if rc == 0 else float("nan"),
        "grpo_commit_to_exit_s": (exited - t_end) if t_end else float("nan"),
        "terminal_lines": len(out.splitlines()),
        "log": str(log),
    }


def sigterm_run(base: Path, name: str, steps: int, at: int, kill_server: bool) -> dict:
    home, store, log = base / f"home-{name}", base / f"store-{name}", base / f"{name}.log"
    home.mkdir()
    server, url = start_server(home)
    try:
        proc = start_run(store, url, home, steps, log)
        wait_checkpoint(store, at, proc)
        if kill_server:
            kill(server)
            time.sleep(2)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            kill(proc)
        took = time.monotonic() - t0
    finally:
        kill(server)
    out = log.read_text(errors="replace")
    return {
        "case": name,
        "rc": proc.returncode,
        "sigterm_to_exit_s": took,
        "terminal_lines": len(out.splitlines()),
        "says_interrupted": "interrupted by SIGTERM" in out,
        "log": str(log),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500, help="GRPO steps of the tiny recipe")
    ap.add_argument(
        "--at", type=int, default=300, help="the GRPO checkpoint at which the server is killed (or SIGTERM sent)"
    )
    args = ap.parse_args()
    base = Path(os.environ.get("OUTAGE_DIR") or scratch("regimen-bench-outage-"))
    base.mkdir(parents=True, exist_ok=True)
    header(f"orchestrator outage: tiny GRPO {args.steps} steps, Prefect server killed at checkpoint {args.at}")
    up = training_run(base, "up", args.steps, args.at, kill_server=False)
    down = training_run(base, "down", args.steps, args.at, kill_server=True)
    print(table([up, down], ["case", "rc", "steps_per_s", "grpo_commit_to_exit_s", "terminal_lines"]))
    print(f"steps/s with the server killed / with it up: {down['steps_per_s'] / up['steps_per_s']:.2f} (aim >= 0.9)")
    t_up = sigterm_run(base, "sigterm-up", args.steps, args.at, kill_server=False)
    t_down = sigterm_run(base, "sigterm-down", args.steps, args.at, kill_server=True)
    print(table([t_up, t_down], ["case", "rc", "sigterm_to_exit_s", "says_interrupted", "terminal_lines"]))
    print(
        f"SIGTERM to exit: {t_up['sigterm_to_exit_s']:.1f} s with the server up, {t_down['sigterm_to_exit_s']:.1f} s "
        f"with it killed (aim <= 10 s)"
    )
    if os.environ.get("KEEP"):
        print("logs:", up["log"], down["log"], t_up["log"], t_down["log"])


if __name__ == "__main__":
    main()
