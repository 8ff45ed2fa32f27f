"""Why not just SFT longer? At equal wall-clock on this machine, in one invocation, on the weak-teacher
code task: (a) SFT only on the teacher's traces, (b) GRPO only from the base policy, (c) Regimen's cycle
(SFT -> dry run -> smoke -> GRPO -> eval). Prints held-out pass@1 for each, the teacher's own, and the
wall time each got.

    python bench/why_rl.py [--recipe configs/tiny-code-weak-teacher.yaml] [--json]

(c) runs first (`regimen run`), and its wall time T is the budget; (a) and (b) are calibrated on two
short runs of their own (k and 2k steps: the difference is the cost of k steps, the rest of the first is
the stage's fixed cost: model load, traces, held-out eval), then given the number of steps that fills T.
(a) and (b) call the stages directly through the runner (the same code the flow runs), in fresh stores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from common import ROOT, regimen, stage_run, steps_for


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="configs/tiny-code-weak-teacher.yaml")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from regimen.stages.recipe import load_recipe
    from regimen.stages.store import Store
    from regimen.stages.training.policy import base_policy

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # (c) Regimen's cycle, through the CLI, as a user runs it
        res = regimen("run", args.recipe, "--store", str(tmp / "cycle"), "--experiment", "cycle", check=False)
        budget = res["wall_s"]
        st = Store(tmp / "cycle")
        evals = st.versions("cycle", "eval")
        sft = st.versions("cycle", "sft")
        out["cycle"] = {
            "wall_s": budget,
            "exit": res["rc"],
            "heldout_pass@1": evals[-1]["metrics"]["heldout_accuracy"] if evals else None,
            "sft_pass@1": sft[0]["metrics"]["heldout_accuracy"] if sft else None,
            "teacher_pass@1": sft[0]["metrics"].get("teacher_heldout_accuracy") if sft else None,
        }

        # (a) SFT only: calibrate (fixed cost and cost per step), then fill the budget
        s_store = Store(tmp / "sft-only")
        policy = base_policy(load_recipe(ROOT / args.recipe), s_store)  # the same base model for every run
        walls = []
        for k in (60, 120):
            cal = load_recipe(ROOT / args.recipe, {"sft.max_steps": k, "experiment": f"calib-sft-{k}"})
            walls.append(stage_run(cal, "sft", {"policy": policy, "cycle": 1}, s_store)[1])
        steps, per_step, fixed = steps_for(budget, walls[0], walls[1], 60)
        out["calibration"] = {"sft": {"per_step_s": per_step, "fixed_s": fixed}}
        sft_only = load_recipe(ROOT / args.recipe, {"sft.max_steps": steps, "experiment": "sft-only"})
        r, wall = stage_run(sft_only, "sft", {"policy": policy, "cycle": 1}, s_store)
        out["sft_only"] = {"wall_s": wall, "steps": steps, "heldout_pass@1": r.manifest["metrics"]["heldout_accuracy"]}

        # (b) GRPO only, from the base policy
        g_store = Store(tmp / "grpo-only")
        policy = base_policy(load_recipe(ROOT / args.recipe), g_store)
        walls = []
        for k in (10, 20):  # with the probe, as the run itself; its eval is part of the path's time
            cal = load_recipe(ROOT / args.recipe, {"grpo.max_steps": k, "experiment": f"calib-grpo-{k}"})
            r, wall = stage_run(cal, "grpo", {"policy": policy}, g_store)
            walls.append(wall + stage_run(cal, "eval", {"policy": r.ref}, g_store)[1])
        steps, per_step, fixed = steps_for(budget, walls[0], walls[1], 10)
        out["calibration"]["grpo"] = {"per_step_s": per_step, "fixed_s": fixed}
        grpo_only = load_recipe(ROOT / args.recipe, {"grpo.max_steps": steps, "experiment": "grpo-only"})
        r, wall_g = stage_run(grpo_only, "grpo", {"policy": policy}, g_store)
        ev, wall_e = stage_run(grpo_only, "eval", {"policy": r.ref}, g_store)
        out["grpo_only"] = {
            "wall_s": wall_g + wall_e,
            "steps": steps,
            "heldout_pass@1": ev.manifest["metrics"]["heldout_accuracy"],
        }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(
        f"budget: Regimen's cycle took {out['cycle']['wall_s']:.0f}s (exit {out['cycle']['exit']}); teacher's own "
        f"held-out pass@1 {out['cycle']['teacher_pass@1']}"
    )
    for name, c in out["calibration"].items():
        print(f"calibration {name}: {c['per_step_s']:.3f} s a step, {c['fixed_s']:.1f} s fixed")
    print(f"{'path':<12} {'wall s':>8} {'steps':>7} {'held-out pass@1':>16}")
    for name in ("sft_only", "grpo_only", "cycle"):
        row = out[name]
        print(f"{name:<12} {row['wall_s']:>8.0f} {str(row.get('steps', '-')):>7} {row['heldout_pass@1']:>16.3f}")


if __name__ == "__main__":
    sys.exit(main())
