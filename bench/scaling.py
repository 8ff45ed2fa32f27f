"""Scaling on CPU: wall time with 1 vs 2 processes (launcher: accelerate), and how stage times grow with
model size (hidden 128 -> 256) and with num_generations (completions per step held fixed). Short runs
(--steps per training stage) keep it inside minutes; the first row of each group is its baseline.

    python bench/scaling.py [--steps 100]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import header, manifests, regimen, scratch, table  # noqa: E402


def one(tmp: Path, name: str, sets: list[str], steps: int) -> dict:
    store = tmp / name
    base = [
        "cycle.max_cycles=1",
        f"sft.max_steps={steps}",
        f"grpo.max_steps={steps}",
        "dry_run.min_mean_reward=0",
        "dry_run.max_frac_zero_std=1",
        "sft.save_steps=1000",
        "grpo.save_steps=1000",
    ]
    r = regimen("run", "configs/default.yaml", "--store", str(store), *sum((["--set", s] for s in base + sets), []))
    times = {s: manifests(store, "default", s)[-1]["wall_s"] for s in ("sft", "grpo-smoke", "grpo", "eval")}
    return {
        "run": name,
        "wall_s": r["wall_s"],
        "sft_s": times["sft"],
        "smoke_s": times["grpo-smoke"],
        "grpo_s": times["grpo"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    header(f"scaling ({args.steps} SFT and GRPO steps per run)")
    tmp = Path(scratch("regimen-bench-scaling-"))
    groups = {
        "processes": [
            ("1 process", []),
            (
                "2 processes",
                [
                    "launcher=accelerate",
                    "accelerate.num_processes=2",
                    "grpo.per_device_train_batch_size=32",
                    "sft.per_device_train_batch_size=32",
                ],
            ),
        ],
        "model size": [
            ("hidden 128", []),
            ("hidden 256", ["model.tiny.hidden_size=256", "model.tiny.intermediate_size=1024"]),
        ],
        "group size": [
            ("num_generations 4", ["grpo.num_generations=4"]),
            ("num_generations 8", []),
            ("num_generations 16", ["grpo.num_generations=16"]),
        ],
    }
    for group, runs in groups.items():
        rows = [one(tmp, name.replace(" ", "-"), sets, args.steps) for name, sets in runs]
        for r in rows:
            r["x wall"] = r["wall_s"] / rows[0]["wall_s"]
            r["x grpo"] = r["grpo_s"] / rows[0]["grpo_s"]
        print(f"\n## {group}")
        print(table(rows, ["run", "wall_s", "sft_s", "smoke_s", "grpo_s", "x wall", "x grpo"]))
    print(
        "\n2 processes keep the global batch (2 x 32 = 64 completions per step), so the work per step is the same as 1 "
        "x 64."
    )


if __name__ == "__main__":
    main()
