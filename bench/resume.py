"""Resume after a crash: SIGKILL the run at a known GRPO step (REGIMEN_KILL=grpo@K), rerun, and compare
the resume's time with what the remaining steps take in an uninterrupted run measured in the same run.

    python bench/resume.py [--kill-at 350] [--config configs/default.yaml] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import header, manifests, regimen, scratch, table  # noqa: E402


def wall_at(log: list[dict], step: int) -> float:
    """Seconds of training when `step` was logged (train_log's wall_s, from this process's start)."""
    return max(h["wall_s"] for h in log if "wall_s" in h and h.get("step", 0) <= step) if step > 0 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--kill-at", type=int, default=350)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()
    sets = sum((["--set", s] for s in ["cycle.max_cycles=1", *args.sets]), [])
    header(f"resume after SIGKILL at GRPO step {args.kill_at}")
    tmp = Path(scratch("regimen-bench-resume-"))

    full = regimen("run", args.config, "--store", str(tmp / "full"), *sets)
    exp = next(line.split()[1] for line in full["out"].splitlines() if line.startswith("experiment "))
    [g_full] = manifests(tmp / "full", exp, "grpo")
    log_full = [
        json.loads(x) for x in (tmp / "full" / exp / "grpo" / "v1" / "train_log.jsonl").read_text().splitlines()
    ]
    max_steps = int(g_full["metrics"]["steps"])

    killed = regimen(
        "run",
        args.config,
        "--store",
        str(tmp / "crash"),
        *sets,
        extra_env={"REGIMEN_KILL": f"grpo@{args.kill_at}"},
        check=False,
    )
    assert killed["rc"] == -9, f"expected the run to be SIGKILLed, got exit {killed['rc']}"
    half_written = [p for p in (tmp / "crash" / exp / "grpo").glob("v*")]
    before = {
        s: [(m["version"], m["files"]) for m in manifests(tmp / "crash", exp, s)]
        for s in ("sft", "reward-dry-run", "grpo-smoke")
    }
    resumed = regimen("run", args.config, "--store", str(tmp / "crash"), *sets)
    after = {s: [(m["version"], m["files"]) for m in manifests(tmp / "crash", exp, s)] for s in before}
    [g_res] = manifests(tmp / "crash", exp, "grpo")
    start = int(g_res["resumed_from_step"])
    redone = args.kill_at - start
    remaining_uninterrupted = wall_at(log_full, max_steps) - wall_at(log_full, args.kill_at)
    resume_train = float(g_res["metrics"]["train_s"])
    rows = [
        {
            "what": "uninterrupted: steps after the kill point",
            "steps": max_steps - args.kill_at,
            "seconds": remaining_uninterrupted,
        },
        {"what": "resume: GRPO training after restart", "steps": max_steps - start, "seconds": resume_train},
        {
            "what": "resume: GRPO stage (load, train, save)",
            "steps": max_steps - start,
            "seconds": float(g_res["wall_s"]),
        },
        {"what": "resume: whole rerun (reuse + GRPO + eval)", "steps": max_steps - start, "seconds": resumed["wall_s"]},
    ]
    print(table(rows, ["what", "steps", "seconds"]))
    print(
        f"\nresumed_from_step {start}; steps redone {redone} (save_steps "
        f"{g_full['config']['grpo'].get('save_steps')}); "
        f"no half-written GRPO version after the kill: {not half_written}; earlier stages untouched: {before == after}"
    )
    print(
        f"ratio resume training / uninterrupted remaining: {resume_train / remaining_uninterrupted:.3f}; "
        f"GRPO stage: {float(g_res['wall_s']) / remaining_uninterrupted:.3f}; whole rerun: "
        f"{resumed['wall_s'] / remaining_uninterrupted:.3f}"
    )


if __name__ == "__main__":
    main()
