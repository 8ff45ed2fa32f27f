"""The embedded default on several data seeds and both float-kernel families, one run after another.

    python bench/default_seeds.py [--seeds 0 1 2] [--kernels default avx2] [--config configs/default.yaml]

A tiny model's training lands elsewhere on another CPU: its float kernels differ. `ATEN_CPU_CAPABILITY=avx2`
makes a machine with AVX-512 compute as an older CPU does, so both families are measured here. Each run is
a fresh store (nothing reused) and the full `regimen run`; printed per run: the verdict, held-out accuracy
after each evaluation, wall time, and the CPU capability torch reported (recorded in every manifest).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from common import header, manifests, regimen, scratch, table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--kernels", nargs="+", default=["default", "avx2"])
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()
    header(f"{args.config} on seeds {args.seeds} x kernels {args.kernels}")
    rows = []
    for kernel in args.kernels:
        for seed in args.seeds:
            store = scratch("regimen-bench-default-")
            env = {} if kernel == "default" else {"ATEN_CPU_CAPABILITY": kernel}
            r = regimen(
                "run",
                args.config,
                "--store",
                store,
                "--set",
                f"data.seed={seed}",
                *[a for s in args.sets for a in ("--set", s)],
                extra_env=env,
                check=False,
            )
            exp = next(p.name for p in Path(store).iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
            evals = manifests(store, exp, "eval")
            sfts = manifests(store, exp, "sft")
            # named by time: the last is the run's verdict
            decisions = sorted((Path(store) / exp / "decisions").glob("*.json"))
            verdict = json.loads(decisions[-1].read_text())["verdict"] if decisions else "-"
            cap = sfts[0].get("torch_cpu_capability") if sfts else None
            curve = " ".join(f"{m['metrics']['heldout_accuracy']:.3f}" for m in sfts + evals if m.get("cycle"))
            rows.append(
                {
                    "kernel": kernel,
                    "capability": cap,
                    "seed": seed,
                    "rc": r["rc"],
                    "verdict": verdict,
                    "final": evals[-1]["metrics"]["heldout_accuracy"] if evals else None,
                    "wall_s": round(r["wall_s"], 1),
                    "sft/eval accuracies": curve,
                }
            )
            print(table(rows[-1:], list(rows[-1])), flush=True)
    print(table(rows, list(rows[0])))
    reached = sum(r["verdict"] == "target-reached" for r in rows)
    print(
        f"target-reached {reached}/{len(rows)}; wall median {statistics.median(r['wall_s'] for r in rows):.1f} s, max "
        f"{max(r['wall_s'] for r in rows):.1f} s"
    )


if __name__ == "__main__":
    main()
