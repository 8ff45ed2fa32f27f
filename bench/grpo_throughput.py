"""GRPO throughput: completions per second in Regimen's GRPO stage vs. a bare `GRPOTrainer` script with
identical settings (same policy, data, reward, GRPOConfig), measured in the same run.

    python bench/grpo_throughput.py [--steps 200] [--config configs/default.yaml]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.common import PY, header, run, scratch, table  # noqa: E402


def bare(config: str, policy: str, steps: int, out: str) -> None:
    """What a user would write by hand with TRL, timed from trainer construction to the end of train()."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from regimen.stages.recipe import load_recipe
    from regimen.stages.recipe.trl import for_stage
    from regimen.stages.rewards import from_specs
    from regimen.stages.tasks.registry import load_task
    from regimen.stages.training.model import load_tokenizer

    recipe = load_recipe(config, [f"grpo.max_steps={steps}", "grpo.save_strategy=no"])
    args = for_stage(recipe, "grpo", out)
    fns = from_specs(recipe.rewards)
    t0 = time.perf_counter()
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=list(fns.values()),
        args=args,
        train_dataset=Dataset.from_list(load_task(recipe.data).train),
        processing_class=load_tokenizer(policy),
    )
    t1 = time.perf_counter()
    trainer.train()
    t2 = time.perf_counter()
    print(
        json.dumps(
            {
                "completions": steps * args.generation_batch_size // args.steps_per_generation,
                "train_s": t2 - t1,
                "total_s": t2 - t0,
            }
        )
    )


def stage(config: str, policy: str, steps: int, store: str) -> None:
    from regimen.stages.recipe import load_recipe
    from regimen.stages.run.runner import StageCall, execute
    from regimen.stages.store import Store

    recipe = load_recipe(config, [f"grpo.max_steps={steps}", "grpo.save_strategy=no", f"store={store}"])
    t0 = time.perf_counter()
    res = execute(
        StageCall(
            "grpo",
            recipe,
            {"policy": {"stage": "sft", "fingerprint": "bench", "model": policy}},
            experiment=recipe.experiment,
        ),
        Store(store),
    )
    total = time.perf_counter() - t0
    m = res.manifest["metrics"]
    print(
        json.dumps(
            {
                "completions": int(m["steps"]) * recipe.grpo_settings()["per_device_train_batch_size"],
                "train_s": m["train_s"],
                "total_s": total,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--mode", choices=["bare", "stage"], help=argparse.SUPPRESS)
    ap.add_argument("--policy", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode == "bare":
        return bare(args.config, args.policy, args.steps, args.out)
    if args.mode == "stage":
        return stage(args.config, args.policy, args.steps, args.out)

    header(f"GRPO throughput: stage vs bare GRPOTrainer, {args.steps} steps")
    tmp = Path(scratch("regimen-bench-grpo-"))
    # the policy both start from: the recipe's SFT result
    run(
        [
            PY,
            "-m",
            "regimen.flows.cli",
            "run",
            args.config,
            "--store",
            str(tmp / "sft"),
            "--set",
            "cycle.max_cycles=1",
            "--set",
            "grpo.max_steps=1",
            "--set",
            "smoke.max_steps=1",
        ]
    )
    policy = next((tmp / "sft").glob("*/sft/v1/model"))
    rows = []
    for rep in range(2):  # alternate, so drift in machine load hits both alike
        for mode in ("bare", "stage"):
            r = run(
                [
                    PY,
                    "bench/grpo_throughput.py",
                    "--config",
                    args.config,
                    "--steps",
                    str(args.steps),
                    "--mode",
                    mode,
                    "--policy",
                    str(policy),
                    "--out",
                    str(tmp / f"{mode}{rep}"),
                ]
            )
            d = json.loads(r["out"].strip().splitlines()[-1])
            rows.append(
                {
                    "run": f"{mode} #{rep + 1}",
                    "completions": d["completions"],
                    "train_s": d["train_s"],
                    "total_s": d["total_s"],
                    "completions_per_s(train)": d["completions"] / d["train_s"],
                    "completions_per_s(total)": d["completions"] / d["total_s"],
                }
            )
    print(
        table(
            rows, ["run", "completions", "train_s", "total_s", "completions_per_s(train)", "completions_per_s(total)"]
        )
    )

    def median(mode, key):
        vals = sorted(r[key] for r in rows if r["run"].startswith(mode))
        return (vals[len(vals) // 2] + vals[(len(vals) - 1) // 2]) / 2

    for key in ("completions_per_s(train)", "completions_per_s(total)"):
        print(f"stage / bare {key}: {median('stage', key) / median('bare', key):.3f}")


if __name__ == "__main__":
    main()
