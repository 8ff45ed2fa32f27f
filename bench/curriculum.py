"""The pass-rate curriculum against TRL's own sampler on `tiny-code`, per data seed, in one invocation.

    python bench/curriculum.py [--seeds 0 1 2] [--config configs/tiny-code.yaml] [--set KEY=VALUE ...]

Per seed, one experiment: the recipe with `curriculum.enabled=false` (the baseline, measured in the same
run), then with the curriculum; SFT, the dry run and the smoke test are the same stages and are reused,
so the two runs differ only in how GRPO picks its prompts (both start from the base model's SFT:
`cycle.start_from=base`). Printed per seed:

- `t_base_s`: GRPO wall time at which the baseline's held-out probe first reached its own final value;
  `t_cur_s`: when the curriculum's probe first reached that same value (None: never); `time_ratio`
  = t_cur / t_base (aim <= 0.7);
- `zero_std_base` / `zero_std_cur`: mean `frac_reward_zero_std` over training (aim: at least halved);
- `pass1_base` / `pass1_cur`: final held-out pass@1 from evaluation (aim: not lower);
- the curriculum's bands at the end and the groups it skipped.
Then the medians over seeds. Wall times are GRPO's own (`wall_s` of the probe entries), so the shared
stages and Prefect's start do not count.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

from common import curve, first_reach, header, manifests, regimen, scratch, table


def one(store: str, config: str, seed: int, extra: list[str]) -> dict:
    exp = f"curriculum-s{seed}"
    common = [
        "--store",
        store,
        "--experiment",
        exp,
        "--set",
        f"data.seed={seed}",
        "--set",
        "cycle.start_from=base",
        "--set",
        "promote.enabled=false",
        *[a for s in extra for a in ("--set", s)],
    ]
    out = {"seed": seed}
    for label, on in (("base", "false"), ("cur", "true")):
        r = regimen("run", config, *common, "--set", f"curriculum.enabled={on}", check=False)
        grpo = manifests(store, exp, "grpo")[-1]
        ev = manifests(store, exp, "eval")[-1]
        out[f"rc_{label}"] = r["rc"]
        out[f"log_{label}"] = curve(store, exp, grpo["version"])
        out[f"zero_std_{label}"] = grpo["metrics"].get("frac_reward_zero_std_mean")
        out[f"pass1_{label}"] = ev["metrics"]["heldout_accuracy"]
        out[f"grpo_s_{label}"] = grpo["metrics"].get("train_s")
        if on == "true":
            out["curriculum"] = grpo.get("curriculum")
    probes = [h["heldout_probe"] for h in out["log_base"] if "heldout_probe" in h]
    target = probes[-1] if probes else 0.0
    out["target_probe"] = target
    out["t_base_s"] = first_reach(out["log_base"], target)
    out["t_cur_s"] = first_reach(out["log_cur"], target)
    out["time_ratio"] = out["t_cur_s"] / out["t_base_s"] if out["t_cur_s"] is not None and out["t_base_s"] else None
    zb, zc = out["zero_std_base"], out["zero_std_cur"]
    out["zero_std_ratio"] = zc / zb if zb else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--config", default="configs/tiny-code.yaml")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--store", default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    header(f"curriculum vs TRL's sampler: {args.config}, seeds {args.seeds}")
    store = args.store or scratch("regimen-bench-curriculum-")
    rows = []
    for seed in args.seeds:
        r = one(store, args.config, seed, args.sets)
        c = r.get("curriculum") or {}
        rows.append(
            {
                "seed": seed,
                "rc": f"{r['rc_base']}/{r['rc_cur']}",
                "target_probe": r["target_probe"],
                "t_base_s": r["t_base_s"],
                "t_cur_s": r["t_cur_s"],
                "time_ratio": r["time_ratio"],
                "zero_std_base": r["zero_std_base"],
                "zero_std_cur": r["zero_std_cur"],
                "zero_std_ratio": r["zero_std_ratio"],
                "pass1_base": r["pass1_base"],
                "pass1_cur": r["pass1_cur"],
                "grpo_s_base": r["grpo_s_base"],
                "grpo_s_cur": r["grpo_s_cur"],
                "bands_end": json.dumps(c.get("bands")),
                "skipped": c.get("groups_skipped"),
            }
        )
        print(table(rows[-1:], list(rows[-1])), flush=True)
    print(table(rows, list(rows[0])))

    def med(key, never=None):
        vals = [r[key] if r[key] is not None else never for r in rows]
        vals = [v for v in vals if v is not None]
        return round(statistics.median(vals), 3) if vals else None

    ratio = med("time_ratio", never=math.inf)  # a seed that never reached the target counts as the slowest
    gain = statistics.median(r["pass1_cur"] - r["pass1_base"] for r in rows)
    print(
        f"medians over {len(rows)} seeds: time ratio {'never' if ratio == math.inf else ratio} (aim <= 0.7; seeds "
        f"never reaching the "
        f"target, counted as slowest: {sum(r['time_ratio'] is None for r in rows)}), frac_reward_zero_std "
        f"{med('zero_std_base')} -> "
        f"{med('zero_std_cur')} (ratio {med('zero_std_ratio')}, aim <= 0.5), held-out pass@1 {med('pass1_base')} -> "
        f"{med('pass1_cur')}, paired gain {gain:+.3f} (aim: not lower)"
    )


if __name__ == "__main__":
    main()
