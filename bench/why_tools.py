"""Why tools: the tool-using policy against the same model trained single-turn on the same task (no
tool), at equal wall time, in one invocation.

    python bench/why_tools.py [--seed 0]

1. `configs/tiny-env.yaml` as it is: multi-turn SFT on its weak teacher's traces (the tool on a third of the
   questions, a guess on the rest), GRPO over `probe` episodes; its stages' wall time W.
2. The same questions single-turn (`#<case> f(x)=?` -> the value; a JSONL file written here from the same
   generated rows, train and held-out), the same model, the oracle's answers as SFT traces and GRPO on the
   `answer` reward, with the same SFT steps; its GRPO steps are then raised so that its stages take W too
   (the SFT, dry run and smoke test are reused; only GRPO and evaluation run again). Where the gates stop
   it (no group varies: GRPO would learn nothing), the same time W goes to SFT instead.
Printed: held-out success of both (episode success; exact match), their stages' wall times, and the ratio.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml
from common import ROOT, header, manifests, regimen, scratch, table

STAGES = ("sft", "reward-dry-run", "grpo-smoke", "grpo", "eval")


def stages_wall(store: str, exp: str) -> float:
    return sum(manifests(store, exp, s)[-1]["wall_s"] for s in STAGES if manifests(store, exp, s))


def single_turn_recipe(work: Path, env: dict, seed: int) -> Path:
    import sys

    sys.path.insert(0, str(ROOT))
    from regimen.stages.tasks import tool_probe

    d = env["data"]
    opts = tool_probe.Options(train_size=d["train_size"], heldout_size=d["heldout_size"], seed=seed)
    task = tool_probe.load(opts)
    for name, rows in (("train", task.train), ("heldout", task.heldout)):
        with (work / f"{name}.jsonl").open("w") as fh:
            for r in rows:
                fh.write(json.dumps({"prompt": r["prompt"][0]["content"], "answer": r["answer"]}) + "\n")
    recipe = {
        "experiment": "why-tools-single",
        "model": {"name_or_path": "tiny", "tiny": {k: v for k, v in env["model"]["tiny"].items() if k != "chat"}},
        "data": {"task": "jsonl", "train_file": str(work / "train.jsonl"), "heldout_file": str(work / "heldout.jsonl")},
        "teacher": {**env["teacher"], "kind": "oracle"},  # the true answers (the single-turn task has no weak teacher)
        "rewards": [{"name": "answer", "weight": 1.0}],
        "sft": env["sft"],
        "dry_run": {
            "num_prompts": 16,
            "min_mean_reward": 0.0,
            "max_mean_reward": 1.0,
            "max_frac_zero_std": 1.0,
        },  # the answer is a guess: let it train anyway
        "smoke": env["smoke"],
        "grpo": {**env["grpo"], "max_completion_length": 8},
        "probe": env["probe"],
        "eval": {"batch_size": 256},
        "cycle": {**env["cycle"], "start_from": "base"},
    }
    path = work / "single.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    path.chmod(0o600)
    return path


def _single_turn(work: Path, env: dict, store: str, seed: int, w_env: float) -> tuple[dict, str]:
    """The same task single-turn, given the tool run's wall time: its row, and how the time was spent."""
    single = single_turn_recipe(work, env, seed)
    r1 = regimen("run", str(single), "--store", store, check=False)
    exp = "why-tools-single"
    stop = next((line for line in r1["out"].splitlines() if line.startswith("stopped:")), "")
    if manifests(store, exp, "grpo"):
        # GRPO could run: give it more steps, so the single-turn pipeline takes the tool run's time
        w1 = stages_wall(store, exp)
        g = manifests(store, exp, "grpo")[-1]
        per_step = g["metrics"]["train_s"] / max(g["metrics"]["steps"], 1)
        steps = int(env["grpo"]["max_steps"] + max(0.0, w_env - w1) / per_step)
        r2 = regimen(
            "run",
            str(single),
            "--store",
            store,
            "--set",
            f"grpo.max_steps={steps}",
            "--set",
            "probe.stop_at_target=false",
            check=False,
        )
        ms = {s: manifests(store, exp, s)[-1] for s in STAGES}
        w_single = (
            sum(manifests(store, exp, s)[0]["wall_s"] for s in ("sft", "reward-dry-run", "grpo-smoke"))
            + ms["grpo"]["wall_s"]
            + ms["eval"]["wall_s"]
        )
        single_row = {
            "policy": "single-turn, no tool",
            "rc": r2["rc"],
            "sft_heldout": ms["sft"]["metrics"]["heldout_accuracy"],
            "final_heldout": ms["eval"]["metrics"]["heldout_accuracy"],
            "stages_wall_s": round(w_single, 1),
            "grpo_steps": steps,
        }
        how = f"GRPO given {steps} steps to fill the time"
    else:
        # the gates stopped it: every guess scores 0, no group varies, GRPO has nothing to learn from. The
        # same time goes to SFT instead (more steps on the oracle's answers), measured on the held-out set.
        sft = manifests(store, exp, "sft")[-1]
        per_step = sft["wall_s"] / max(sft["metrics"]["steps"], 1)
        steps = int(max(env["sft"]["max_steps"], w_env / per_step))
        r2 = regimen("run", str(single), "--store", store, "--set", f"sft.max_steps={steps}", check=False)
        sft2 = manifests(store, exp, "sft")[-1]
        single_row = {
            "policy": "single-turn, no tool",
            "rc": r2["rc"],
            "sft_heldout": sft["metrics"]["heldout_accuracy"],
            "final_heldout": sft2["metrics"]["heldout_accuracy"],
            "stages_wall_s": round(sft2["wall_s"], 1),
            "grpo_steps": 0,
        }
        how = f"GRPO never ran ({stop or 'stopped at a gate'}); the time went to SFT instead: {steps} steps"
    return single_row, how


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    header("why tools: tiny-env (probe tool) vs the same task single-turn, equal wall time")
    work = Path(scratch("regimen-bench-why-tools-"))
    store = str(work / "store")
    env = yaml.safe_load((ROOT / "configs" / "tiny-env.yaml").read_text())
    r_env = regimen(
        "run",
        "configs/tiny-env.yaml",
        "--store",
        store,
        "--set",
        f"data.seed={args.seed}",
        "--set",
        "cycle.start_from=base",
        check=False,
    )
    w_env = stages_wall(store, "tiny-env")
    acc_env = (
        manifests(store, "tiny-env", "eval")[-1]["metrics"]["heldout_accuracy"]
        if manifests(store, "tiny-env", "eval")
        else None
    )
    sft_env = manifests(store, "tiny-env", "sft")[-1]["metrics"]["heldout_accuracy"]

    single_row, how = _single_turn(work, env, store, args.seed, w_env)
    rows = [
        {
            "policy": "tool-using (tiny-env)",
            "rc": r_env["rc"],
            "sft_heldout": sft_env,
            "final_heldout": acc_env,
            "stages_wall_s": round(w_env, 1),
            "grpo_steps": env["grpo"]["max_steps"],
        },
        single_row,
    ]
    print(table(rows, list(rows[0])))
    print(f"single-turn: {how}")
    print(
        f"wall ratio single/tool {single_row['stages_wall_s'] / w_env:.2f} (aim 1.0); held-out success with the tool "
        f"{acc_env} vs without {single_row['final_heldout']}"
    )


if __name__ == "__main__":
    main()
