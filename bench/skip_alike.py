"""Groups that teach: plain GRPO vs the pass-rate curriculum vs `curriculum.skip_all_alike` (the screen in front of
the curriculum, and all-alike groups out of the loss), per recipe and data seed, in one invocation.

    python bench/skip_alike.py [--configs configs/default.yaml ...] [--seeds 0 1 2] [--steps N] [--set KEY=VALUE]

Per recipe and seed, one experiment: SFT, the dry run and the smoke test are the same stages for every arm and are
reused (the arms differ only in GRPO's part of the recipe; `cycle.start_from=base`, one cycle, one round, the same
`grpo.max_steps`). Arms:

- `plain`: `curriculum.enabled=false` (TRL's own sampler);
- `curriculum`: the pass-rate curriculum as it is (history: set aside what was all alike);
- `skip`: the curriculum with `skip_all_alike` (its screen asks the policy before a prompt enters the batch; all-alike
  groups give no gradient). Against `curriculum`, this measures the screen's gain, not the curriculum's;
- `skip-noreuse` (only with `--arms`): `skip` with `curriculum.screen_reuse=false`, the screen's answers spent on top
  of the group's (the behaviour of every `skip` row before 2026-12-07's reuse);
- `skip-8` (only with `--arms`): `skip` with `curriculum.screen_batch=8` (the default before 2026-12-07: the screen's
  candidates asked in more, smaller generate calls). Rows of 2026-12-07 named `skip-wide` are `skip` with
  `screen_batch=64` against a `skip` at 8.

Per run: `t_s`, GRPO's wall time (its own `wall_s`, the probe entries') until the held-out probe first reaches the
plain run's final probe accuracy (None: never); `time_ratio` against plain's; `heldout`: the evaluation's held-out
accuracy; `alike_share`: the mean share of generated groups whose attempts all scored alike (TRL's
`frac_reward_zero_std`; with skip these groups are also out of the loss, so among trained groups it is 0 by
construction); `generated`: completions generated, screening ones included (a reused answer counted once); `reused`:
the screen's answers handed back to their groups; `screen_s`: the part of GRPO's time
spent screening. Rows go to `bench/results/skip_alike.jsonl` with the date, machine, commit and the float-kernel family
(`cpu_capability`; set `ATEN_CPU_CAPABILITY` to change it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, curve, first_reach, header, manifests, regimen, scratch, table

RESULTS = ROOT / "bench" / "results" / "skip_alike.jsonl"
ARMS = {
    "plain": ["curriculum.enabled=false"],
    "curriculum": ["curriculum.enabled=true"],
    "skip": ["curriculum.enabled=true", "curriculum.skip_all_alike=true"],
    # the screen's answers spent on top of the group's (before 2026-12-07's reuse); run with --arms ... skip-noreuse
    "skip-noreuse": ["curriculum.enabled=true", "curriculum.skip_all_alike=true", "curriculum.screen_reuse=false"],
    # the screen asking 8 candidates per generate call, its default before 2026-12-07 (on a short completion it pays
    # for its calls more than for its samples); run with --arms ... skip-8
    "skip-8": ["curriculum.enabled=true", "curriculum.skip_all_alike=true", "curriculum.screen_batch=8"],
}
DEFAULT_ARMS = ["plain", "curriculum", "skip"]


def arm(store: str, config: str, seed: int, name: str, steps: int, extra: list[str]) -> dict:
    exp = f"{Path(config).stem}-s{seed}"
    sets = [
        f"data.seed={seed}",
        "cycle.start_from=base",
        "cycle.max_cycles=1",
        "cycle.max_rounds=1",
        "promote.enabled=false",
        "probe.stop_at_target=false",
        f"grpo.max_steps={steps}",
        *ARMS[name],
        *extra,
    ]
    flags = [a for s in sets for a in ("--set", s)]
    r = regimen("run", config, "--store", store, "--experiment", exp, *flags, check=False)
    if not manifests(store, exp, "grpo"):  # the run ended before GRPO (its gates, or a failure): said, not crashed
        said = [line for line in r["out"].splitlines() if line.strip()]
        return {"recipe": Path(config).stem, "seed": seed, "arm": name, "rc": r["rc"], "log": [], "no_grpo": said[-3:]}
    grpo = manifests(store, exp, "grpo")[-1]
    ev = manifests(store, exp, "eval")[-1]
    m, screen = grpo["metrics"], (grpo.get("curriculum") or {}).get("screen") or {}
    log = curve(store, exp, grpo["version"])
    reused = (screen.get("reuse") or {}).get("reused", 0)
    per_step = grpo["config"]["grpo"].get("per_device_train_batch_size") or 0
    return {
        "recipe": Path(config).stem,
        "seed": seed,
        "arm": name,
        "rc": r["rc"],
        "log": log,
        "heldout": ev["metrics"]["heldout_accuracy"],
        "probe_final": next((h["heldout_probe"] for h in reversed(log) if "heldout_probe" in h), None),
        "alike_share": _round(m.get("frac_reward_zero_std_mean"), 3),
        # the groups' completions less the screen's answers reused in them, plus every screening answer
        "generated": int(m.get("steps", 0) * per_step + screen.get("samples", 0) - reused),
        "reused": reused,
        **({"note": "screen_reuse on: the screen's answers are the first attempts of their groups"} if reused else {}),
        "screen_samples": screen.get("samples", 0),
        "screened_out": screen.get("skipped", 0),
        "grpo_s": _round(m.get("train_s"), 1),
        "screen_s": _round(screen.get("seconds"), 1),  # of grpo_s: generating and scoring the screen's answers
    }


def _round(v, digits: int):
    return None if v is None else round(v, digits)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", default=["configs/default.yaml"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, choices=list(ARMS))
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--store", default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from regimen.stages.core.fingerprint import cpu_capability

    header(f"groups that teach: {args.arms} on {args.configs}, seeds {args.seeds}, {args.steps} GRPO steps")
    store = args.store or scratch("regimen-bench-skip-")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    stamp = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "commit": commit.stdout.strip(),
        "kernels": cpu_capability() or os.environ.get("ATEN_CPU_CAPABILITY", "?"),
        "steps": args.steps,
    }
    rows: list[dict] = []
    for config in args.configs:
        for seed in args.seeds:
            runs = {name: arm(store, config, seed, name, args.steps, args.sets) for name in args.arms}
            plain = runs.get("plain")
            target = plain.get("probe_final") if plain else None
            t_plain = first_reach(plain["log"], target) if plain and target is not None else None
            for r in runs.values():
                r["target_probe"] = target
                r["t_s"] = first_reach(r.pop("log"), target) if target is not None else None
                r["time_ratio"] = round(r["t_s"] / t_plain, 3) if r["t_s"] is not None and t_plain else None
                rows.append({**r, **stamp})
            print(table(rows[-len(runs) :], [k for k in rows[-1] if k not in stamp]), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    for config in args.configs:
        for name in args.arms:
            mine = [r for r in rows if r["recipe"] == Path(config).stem and r["arm"] == name]
            ratios = [r["time_ratio"] for r in mine if r["time_ratio"] is not None]
            print(
                f"{Path(config).stem} {name}: median time ratio "
                f"{statistics.median(ratios) if ratios else None} (never reached: "
                f"{sum(r['time_ratio'] is None for r in mine)}), held-out {[r.get('heldout') for r in mine]}, "
                f"all-alike {[r.get('alike_share') for r in mine]}, generated {[r.get('generated') for r in mine]}"
            )


if __name__ == "__main__":
    main()
