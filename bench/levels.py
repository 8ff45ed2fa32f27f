"""`curriculum.kind: levels` against its two baselines (issues 44 and 49): GRPO's prompts generated at a level that
rises with the pass rate (`adaptive`), at the top level from the start (`fixed`), at a level drawn uniformly
(`uniform`), and the adaptive level with the screen in front of it (`adaptive-skip`: `curriculum.skip_all_alike`, a
level is a pool whose pass rates say when to rise and whose all-alike prompts are skipped before generation).

The question it asks must be answerable: SFT trains on the level below the top (`data.level`) and levels are
inclusive (`data.level_range: inclusive`: spell_backward's level 2 is words of 3 to 7 letters, level 1 of 3 to 5), so
the policy starts with a partial grip on the top level. With `upper_bound` levels (5-letter words alone at level 1,
7-letter words alone at level 2) the tiny model's SFT scored 0.000 at the top: it does not carry a reversal to a
longer word, and no GRPO arm had a group to learn from. The held-out set is the top level only
(`data.heldout_levels: [TOP]`), and the target is what `fixed` reached: each arm's time is GRPO's wall time until its
held-out probe first reaches the `fixed` arm's final probe accuracy in the same seed (`--target X` for a fixed target
instead). One SFT per seed, reused by every arm (the curriculum is not part of SFT's fingerprint), and the same GRPO
step budget. `frac_reward_zero_std` (GRPO's generated groups that taught nothing) comes off the training log.

    .venv/bin/python bench/levels.py [--seeds 0 1 2] [--task spell_backward] [--top 2] [--steps 300]

Results go to bench/results/levels.jsonl (date, machine, commit, float-kernel family on every row); ratios are against
`fixed` in the same seed.
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

from common import ROOT, curve, first_reach, header, manifests, regimen, scratch, table

RESULTS = ROOT / "bench" / "results" / "levels.jsonl"
RECIPE = ROOT / "configs" / "rg-spell-backward.yaml"


ARMS = ("fixed", "uniform", "adaptive", "adaptive-skip")


def arm(store: str, seed: int, mode: str, top: int, task: str, steps: int, level_range: str) -> dict:
    exp = f"levels-{task}-s{seed}"
    below = max(0, top - 1)  # SFT's level, where the adaptive and uniform arms start
    start = top if mode == "fixed" else below
    skip = ", skip_all_alike: true" if mode == "adaptive-skip" else ""
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
        f"data.level={below}",
        "--set",
        f"data.level_range={level_range}",
        "--set",
        f"curriculum={{kind: levels, levels: {{mode: {mode.split('-')[0]}, start: {start}, top: {top}}}{skip}}}",
        "--set",
        f"grpo.max_steps={steps}",
        "--set",
        "grpo.max_completion_length=12",  # the recipe's 6 tokens fit 5 letters: the top level's words are longer
        "--set",
        "probe.stop_at_target=false",
        "--set",
        "dry_run={min_mean_reward: 0.0, max_mean_reward: 1.0, max_frac_zero_std: 1.0}",
    ]
    r = regimen(*args, check=False)
    grpo = manifests(store, exp, "grpo")
    g = grpo[-1] if grpo else {}
    log = curve(store, exp, g["version"]) if g else []
    probes = [h["heldout_probe"] for h in log if "heldout_probe" in h]
    zero = [h["frac_reward_zero_std"] for h in log if "frac_reward_zero_std" in h]
    ev = manifests(store, exp, "eval")
    by_len: dict[int, list[int]] = {}  # held-out rows by the answer's length (spell_backward: the word's)
    held = Path(store) / exp / "eval" / f"v{ev[-1]['version']}" / "heldout.jsonl" if ev else None
    for line in held.read_text().splitlines() if held and held.is_file() else []:
        t = json.loads(line)
        n = by_len.setdefault(len(str(t.get("answer", ""))), [0, 0])
        n[0], n[1] = n[0] + int(t.get("correct") == 1.0), n[1] + 1
    return {
        "seed": seed,
        "mode": mode,
        "rc": r["rc"],
        "sft": (manifests(store, exp, "sft") or [{}])[-1].get("metrics", {}).get("heldout_accuracy"),
        "eval_top": ev[-1]["metrics"]["heldout_accuracy"] if ev else None,
        "probe_final": probes[-1] if probes else None,
        "eval_by_answer_len": {str(k): v for k, v in sorted(by_len.items())},  # [correct, rows]
        "probes": [[h.get("step"), h["heldout_probe"]] for h in log if "heldout_probe" in h],  # (step, accuracy)
        "log": log,
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
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--level-range", default="inclusive", choices=("inclusive", "upper_bound"))
    ap.add_argument("--target", type=float, default=None, help="a fixed probe target (default: fixed's final probe)")
    args = ap.parse_args()
    if "fixed" not in args.arms:
        ap.error("--arms: the fixed arm is the baseline every ratio is taken against")
    below = max(0, args.top - 1)
    header(f"levels: {args.arms} on {args.task}, SFT at level {below}, top {args.top}, {args.steps} GRPO steps")
    store = scratch("regimen-bench-levels-")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    from regimen.stages.core.fingerprint import cpu_capability

    stamp = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "commit": commit,
        "kernels": cpu_capability() or os.environ.get("ATEN_CPU_CAPABILITY", "?"),
        "task": args.task,
        "top": args.top,
        "sft_level": max(0, args.top - 1),
        "level_range": args.level_range,
        "steps": args.steps,
    }
    rows = []
    for seed in args.seeds:
        runs = [
            {**arm(store, seed, mode, args.top, args.task, args.steps, args.level_range), **stamp} for mode in args.arms
        ]
        base = next(r for r in runs if r["mode"] == "fixed")
        target = args.target if args.target is not None else base["probe_final"]
        for row in runs:
            log = row.pop("log")
            row["target"] = target
            row["to_target_s"] = first_reach(log, target) if target is not None else None
            row["to_target_ratio"] = (
                round(row["to_target_s"] / base["to_target_s"], 3)
                if row["to_target_s"] is not None and base["to_target_s"]
                else None
            )
            row["zero_std_ratio"] = (
                round(row["frac_zero_std"] / base["frac_zero_std"], 2)
                if row["frac_zero_std"] is not None and base["frac_zero_std"]
                else None
            )
            rows.append(row)
        with RESULTS.open("a") as fh:  # per seed, so that a later seed's failure keeps this one's rows
            for row in runs:
                fh.write(json.dumps(row) + "\n")
        print(table(runs, COLUMNS), flush=True)
    print(table(rows, COLUMNS))
    ratios = [r["to_target_ratio"] for r in rows if r["mode"] == "adaptive" and r["to_target_ratio"] is not None]
    if ratios:
        print(f"adaptive's time to fixed's final probe, median over seeds: {statistics.median(ratios):.3f}x")


COLUMNS = [
    "seed",
    "mode",
    "rc",
    "sft",
    "eval_top",
    "probe_final",
    "target",
    "to_target_s",
    "to_target_ratio",
    "frac_zero_std",
    "zero_std_ratio",
    "final_level",
    "grpo_s",
]


if __name__ == "__main__":
    main()
