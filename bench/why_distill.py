"""Why distil on-policy? At equal wall time on this machine, in one invocation, over data seeds: the held-out
accuracy of a small student taught by the default's champion in three ways, and the teacher's own.

  (a) SFT on the teacher's traces (rejection sampling from the teacher, one sample for each of --traces
      training prompts, kept when right: distillation-style SFT);
  (b) a short SFT on the same traces (the answer's format), then on-policy distillation from the same
      teacher (`distill`: the student samples, the teacher grades every token, reverse KL);
  (c) (a) followed by GRPO (the pipeline's usual path).

    python bench/why_distill.py [--seeds 0 1 2] [--teacher-store DIR] [--json]

The teacher is the champion of `regimen run configs/default.yaml` (made once in --teacher-store, or a
scratch store). Per seed, (c) runs first: SFT (the recipe's steps) then GRPO (`--grpo-steps`); its wall
time is the budget. (a) and (b) are calibrated on two short runs of their trainer (k and 2k steps: the
difference is the cost of k steps, the rest the stage's fixed cost), then given the steps that fill the
budget. Stages are called through the runner (the code the flow runs), each arm in a fresh store.
(b)'s probe runs on the whole held-out set, so its curve says when it first reached (c)'s final accuracy
(time to (c): the short SFT's wall plus the probe's wall_s at that point).
Aims (issue 31): (b) within 0.03 of the teacher; (b) reaches (c)'s final accuracy in <= 0.5x (c)'s wall.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import ROOT, regimen, stage_run, steps_for

RECIPE = ROOT / "configs" / "tiny-distill.yaml"


def teacher_model(store: Path) -> str:
    """The default's champion model folder in `store` (made by `regimen run configs/default.yaml` if absent)."""
    from regimen.stages.store import Store
    from regimen.stages.training.policy import policy_from_ref

    st = Store(store)
    rec = st.read_record("default", "champion.json") if st.has_experiment("default") else None
    if not (isinstance(rec, dict) and rec.get("champion")):
        res = regimen("run", "configs/default.yaml", "--store", str(store), check=False)
        rec = st.read_record("default", "champion.json")
        if not (isinstance(rec, dict) and rec.get("champion")):
            raise SystemExit(f"the default run made no champion (exit {res['rc']}):\n{res['out'][-2000:]}")
    return policy_from_ref(st, "default", rec["champion"]["policy_ref"])["model"]


def one_seed(seed: int, teacher: str, tmp: Path, grpo_steps: int, calibration: dict, traces: int) -> dict:
    from regimen.stages.recipe import load_recipe
    from regimen.stages.store import Store
    from regimen.stages.training.policy import base_policy

    common = {
        "data.seed": seed,
        "teacher.kind": "model",
        "teacher.name_or_path": teacher,
        "teacher.max_prompts": traces,
        "teacher.samples_per_prompt": 1,
        "distill.teacher_model_name_or_path": teacher,
        "probe.prompts": 200,
    }

    def recipe(name: str, **more):
        return load_recipe(RECIPE, {**common, "experiment": name, **more})

    out: dict = {"seed": seed}
    # (c) SFT on the teacher's traces, then GRPO: the budget
    c_store = Store(tmp / f"c-{seed}")
    r_c = recipe("sft-grpo", **{"grpo.max_steps": grpo_steps})
    base = base_policy(r_c, c_store)
    sft, w_sft = stage_run(r_c, "sft", {"policy": base, "cycle": 1}, c_store)
    grpo, w_grpo = stage_run(r_c, "grpo", {"policy": sft.ref}, c_store)
    ev, w_ev = stage_run(r_c, "eval", {"policy": grpo.ref}, c_store)
    budget = w_sft + w_grpo
    out["c"] = {
        "wall_s": budget,
        "sft_steps": r_c.sft["max_steps"],
        "grpo_steps": grpo_steps,
        "heldout": ev.manifest["metrics"]["heldout_accuracy"],
        "sft_heldout": sft.manifest["metrics"]["heldout_accuracy"],
    }
    out["teacher"] = sft.manifest["metrics"].get("teacher_heldout_accuracy")

    out["a"] = _sft_only(recipe, r_c, tmp, seed, budget, calibration)
    out["b"] = _sft_then_distill(recipe, r_c, tmp, seed, budget, calibration, out["c"]["heldout"])
    return out


def _sft_only(recipe, r_c, tmp: Path, seed: int, budget: float, calibration: dict) -> dict:
    """(a) SFT only, filling the budget."""
    from regimen.stages.store import Store
    from regimen.stages.training.policy import base_policy

    a_store = Store(tmp / f"a-{seed}")
    base = base_policy(r_c, a_store)
    if "sft" not in calibration:
        walls = [
            stage_run(recipe(f"calib-sft-{k}", **{"sft.max_steps": k}), "sft", {"policy": base, "cycle": 1}, a_store)[1]
            for k in (50, 100)
        ]
        calibration["sft"] = dict(zip(("steps", "per_step_s", "fixed_s"), steps_for(budget, walls[0], walls[1], 50)))
    per, fixed = calibration["sft"]["per_step_s"], calibration["sft"]["fixed_s"]
    steps = max(50, int((budget - fixed) / per))
    a, w_a = stage_run(recipe("sft-only", **{"sft.max_steps": steps}), "sft", {"policy": base, "cycle": 1}, a_store)
    return {"wall_s": w_a, "steps": steps, "heldout": a.manifest["metrics"]["heldout_accuracy"]}


def _sft_then_distill(recipe, r_c, tmp: Path, seed: int, budget: float, calibration: dict, target: float) -> dict:
    """(b) a short SFT, then on-policy distillation filling the rest of the budget; when it reached `target`."""
    from regimen.stages.store import Store
    from regimen.stages.training.policy import base_policy

    b_store = Store(tmp / f"b-{seed}")
    base = base_policy(r_c, b_store)
    short_steps = min(100, r_c.sft["max_steps"])
    short, w_short = stage_run(
        recipe("sft-short", **{"sft.max_steps": short_steps}), "sft", {"policy": base, "cycle": 1}, b_store
    )
    if "distill" not in calibration:
        walls = [
            stage_run(
                recipe(f"calib-distill-{k}", **{"distill.max_steps": k, "probe.steps": 0}),
                "distill",
                {"policy": short.ref, "cycle": 1},
                b_store,
            )[1]
            for k in (50, 100)
        ]
        calibration["distill"] = dict(
            zip(("steps", "per_step_s", "fixed_s"), steps_for(budget, walls[0], walls[1], 50))
        )
    per, fixed = calibration["distill"]["per_step_s"], calibration["distill"]["fixed_s"]
    steps = max(50, int((budget - w_short - fixed) / per))
    r_b = recipe("distill", **{"distill.max_steps": steps, "probe.steps": max(10, steps // 10)})
    b, w_b = stage_run(r_b, "distill", {"policy": short.ref, "cycle": 1}, b_store)
    curve = b.manifest.get("heldout_probe") or []
    log = (
        [json.loads(x) for x in (b.path / "train_log.jsonl").read_text().splitlines()]
        if (b.path / "train_log.jsonl").is_file()
        else []
    )
    walls = {h["step"]: h["wall_s"] for h in log if "heldout_probe" in h}
    reach = next((p for p in curve if p["heldout_accuracy"] >= target), None)
    return {
        "wall_s": w_short + w_b,
        "short_sft_steps": short_steps,
        "steps": steps,
        "heldout": b.manifest["metrics"]["heldout_accuracy"],
        "teacher": b.manifest["metrics"].get("teacher_heldout_accuracy"),
        "curve": curve,
        "to_c_s": (w_short + walls[reach["step"]]) if reach and reach["step"] in walls else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--teacher-store", default=None, help="a store holding (or to hold) the default's champion")
    ap.add_argument("--grpo-steps", type=int, default=200)
    ap.add_argument(
        "--traces",
        type=int,
        default=3000,
        help="training prompts the teacher writes a trace for (one sample each, kept when right)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    calibration: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        teacher = teacher_model(Path(args.teacher_store) if args.teacher_store else tmp / "teacher")
        rows = []
        for s in args.seeds:
            rows.append(one_seed(s, teacher, tmp, args.grpo_steps, calibration, args.traces))
            # each seed as it finishes
            print(
                json.dumps(
                    {k: v for k, v in rows[-1].items() if k != "b"}
                    | {"b": {k: v for k, v in rows[-1]["b"].items() if k != "curve"}}
                ),
                file=sys.stderr,
                flush=True,
            )
    if args.json:
        print(json.dumps({"rows": rows, "calibration": calibration}, indent=1))
        return
    print(
        f"teacher: the default's champion ({teacher}); calibration: "
        + "; ".join(f"{k} {v['per_step_s']:.3f} s a step, {v['fixed_s']:.1f} s fixed" for k, v in calibration.items())
    )
    print(
        f"{'seed':>4} {'teacher':>8} {'(a) SFT':>8} {'(b) distill':>12} {'(c) SFT+GRPO':>13} {'wall a/b/c s':>16} "
        f"{'(b) to (c)':>11} {'/ (c) wall':>10}"
    )
    for r in rows:
        to_c = r["b"]["to_c_s"]
        reach = "-" if to_c is None else f"{to_c:.0f} s"
        share = "-" if to_c is None else f"{to_c / r['c']['wall_s']:.2f}"
        print(
            f"{r['seed']:>4} {r['teacher']:>8.3f} {r['a']['heldout']:>8.3f} {r['b']['heldout']:>12.3f} "
            f"{r['c']['heldout']:>13.3f} "
            f"{r['a']['wall_s']:>5.0f}/{r['b']['wall_s']:>4.0f}/{r['c']['wall_s']:>4.0f} {reach:>11} {share:>10}"
        )
    gaps = [r["teacher"] - r["b"]["heldout"] for r in rows]
    ratios = [r["b"]["to_c_s"] / r["c"]["wall_s"] if r["b"]["to_c_s"] is not None else float("inf") for r in rows]
    print(
        f"median teacher - (b): {statistics.median(gaps):+.3f} (aim <= 0.03); median (b)'s time to (c)'s accuracy / "
        f"(c)'s wall: {statistics.median(ratios):.2f} (aim <= 0.5; inf: never reached)"
    )


if __name__ == "__main__":
    sys.exit(main())
