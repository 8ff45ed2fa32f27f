"""What the held-out probe inside GRPO costs: the default recipe with the probe (its defaults) against
the same recipe with `probe.steps=0`, in the same invocation, alternated.

    python bench/probe_cost.py [--config configs/default.yaml] [--rounds 1] [--set KEY=VALUE ...]

Prints, per run, the GRPO stages' seconds, the probe's own seconds (`metrics.probe_s`), the whole run's
wall time, the final held-out accuracy and verdict, and the ratios probe / no probe (aim: total <= 1.10).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import regimen


def one(config: str, store: Path, experiment: str, extra: list[str]) -> dict:
    res = regimen(
        "run",
        config,
        "--store",
        str(store),
        "--experiment",
        experiment,
        *sum((["--set", s] for s in extra), []),
        check=False,
    )
    grpo = [json.loads(p.read_text()) for p in sorted((store / experiment / "grpo").glob("v*/manifest.json"))]
    evals = [
        json.loads(p.read_text())
        for p in sorted((store / experiment / "eval").glob("v*/manifest.json"), key=lambda p: int(p.parent.name[1:]))
    ]
    decisions = sorted((store / experiment / "decisions").glob("*.json"))
    return {
        "wall_s": res["wall_s"],
        "rc": res["rc"],
        "grpo_s": sum(m["wall_s"] for m in grpo),
        "probe_s": sum(m["metrics"].get("probe_s", 0.0) for m in grpo),
        "heldout": evals[-1]["metrics"]["heldout_accuracy"] if evals else None,
        "verdict": json.loads(decisions[-1].read_text())["verdict"] if decisions else None,
        "best_steps": [m.get("best_step") for m in grpo],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    args = ap.parse_args()
    rows = {"probe": [], "no probe": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, extra in (("probe", []), ("no probe", ["probe.steps=0"])):
                rows[name].append(
                    one(args.config, Path(tmp) / f"{r}-{name.replace(' ', '-')}", "bench", args.sets + extra)
                )
    for name, runs in rows.items():
        for run in runs:
            print(
                f"{name:<9} exit {run['rc']} wall {run['wall_s']:.1f}s  grpo {run['grpo_s']:.1f}s  probe "
                f"{run['probe_s']:.1f}s  "
                f"held-out {run['heldout']}  verdict {run['verdict']}  best_step {run['best_steps']}"
            )
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("wall_s", "grpo_s", "probe_s")} for k, v in rows.items()}
    print(
        f"ratio probe / no probe: total wall {med['probe']['wall_s'] / med['no probe']['wall_s']:.3f}, GRPO stages "
        f"{med['probe']['grpo_s'] / med['no probe']['grpo_s']:.3f}; the probe itself {med['probe']['probe_s']:.1f}s "
        f"= {med['probe']['probe_s'] / med['probe']['grpo_s']:.1%} of GRPO"
    )


if __name__ == "__main__":
    sys.exit(main())
