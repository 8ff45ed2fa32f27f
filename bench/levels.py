"""`curriculum.kind: levels` against its two baselines (issue 44): GRPO's prompts generated at a level that rises with
the pass rate (adaptive), at the top level from the start (fixed), and at a level drawn uniformly (uniform), after
the same SFT (one SFT per seed, reused by all three arms: the curriculum is not part of SFT's fingerprint), with the
same GRPO step budget. The held-out set is the top level only (`data.heldout_levels: [TOP]`), so the probe inside
GRPO measures the top level: the time to its target is read off the probe curve (`wall_s` of the first probe at or
above it), and `frac_reward_zero_std` (GRPO's groups that taught nothing) off the training log.

    .venv/bin/python bench/levels.py [--seeds 0 1 2] [--task spell_backward] [--top 2] [--target 0.5]

Results go to bench/results/levels.jsonl (date, machine, commit on every row); ratios are against `fixed` in the
same seed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

from common import ROOT, header, manifests, regimen, scratch, table

RESULTS = ROOT / "bench" / "results" / "levels.jsonl"
RECIPE = ROOT / "configs" / "rg-spell-backward.yaml"


def curve(store: str, exp: str, version: int) -> list[dict]:
    path = Path(store) / exp / "grpo" / f"v{version}" / "train_log.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def arm(store: str, seed: int, mode: str, top: int, task: str, steps: int, target: float) -> dict:
    exp = f"levels-{task}-s{seed}"
    start = top if mode == "fixed" else 0
    args = [
        "run",
        str(RECIPE),
        "--store",
        store,
        "--experiment",
        exp,
        "--set",
        f"data.name={task}",
        "--set",
        "data.config={}",
        "--set",
        f"data.seed={seed}",
        "--set",
        f"data.heldout_levels=[{top}]",
        "--set",
        "data.level=0",
        "--set",
        f"curriculum={{kind: levels, levels: {{mode: {mode}, start: {start}, top: {top}}}}}",
        "--set",
        f"grpo.max_steps={steps}",
        "--set",
        "grpo.max_completion_length=12",  # the recipe's 6 tokens fit 5 letters: the top level's words are longer
        "--set",
        "probe.stop_at_target=false",
        "--set",
        f"cycle.target={target}",
        "--set",
        "dry_run={min_mean_reward: 0.0, max_mean_reward: 1.0, max_frac_zero_std: 1.0}",
    ]
    r = regimen(*args, check=False)
    grpo = manifests(store, exp, "grpo")
    g = grpo[-1] if grpo else {}
    log = curve(store, exp, g["version"]) if g else []
    reached = next((h for h in log if h.get("heldout_probe", -1) >= target - 1e-9), None)
    zero = [h["frac_reward_zero_std"] for h in log if "frac_reward_zero_std" in h]
    ev = manifests(store, exp, "eval")
    return {
        "seed": seed,
        "mode": mode,
        "rc": r["rc"],
        "sft": (manifests(store, exp, "sft") or [{}])[-1].get("metrics", {}).get("heldout_accuracy"),
        "eval_top": ev[-1]["metrics"]["heldout_accuracy"] if ev else None,
        "to_target_s": reached.get("wall_s") if reached else None,
        "frac_zero_std": round(statistics.fmean(zero), 4) if zero else None,
        "final_level": (g.get("curriculum") or {}).get("level"),
        "grpo_s": g.get("metrics", {}).get("train_s"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--task", default="spell_backward")
    ap.add_argument("--top", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--target", type=float, default=0.5)
    args = ap.parse_args()
    header(f"levels vs fixed-top vs uniform: {args.task}, top level {args.top}, {args.steps} GRPO steps")
    store = scratch("regimen-bench-levels-")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    stamp = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "commit": commit,
        "task": args.task,
        "top": args.top,
        "steps": args.steps,
        "target": args.target,
    }
    rows = []
    for seed in args.seeds:
        for mode in ("fixed", "uniform", "adaptive"):
            rows.append({**arm(store, seed, mode, args.top, args.task, args.steps, args.target), **stamp})
            print(table([rows[-1]], list(rows[-1])[:9]), flush=True)
    for row in rows:
        base = next(r for r in rows if r["seed"] == row["seed"] and r["mode"] == "fixed")
        row["to_target_ratio"] = (
            round(row["to_target_s"] / base["to_target_s"], 2) if row["to_target_s"] and base["to_target_s"] else None
        )
        row["zero_std_ratio"] = (
            round(row["frac_zero_std"] / base["frac_zero_std"], 2)
            if row["frac_zero_std"] and base["frac_zero_std"]
            else None
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    print(
        table(
            rows,
            [
                "seed",
                "mode",
                "rc",
                "sft",
                "eval_top",
                "to_target_s",
                "to_target_ratio",
                "frac_zero_std",
                "zero_std_ratio",
                "final_level",
            ],
        )
    )


if __name__ == "__main__":
    main()
