"""Two `regimen run` of different experiments started together on one machine, against each run alone,
measured in the same invocation.

    python bench/concurrent_runs.py [--steps 200] [--no-slot]

Each run is the tiny test recipe with a longer GRPO (`--steps`). By default the machine's compute slot
(`REGIMEN_MACHINE_SLOTS`, on) makes the second run wait while the first computes; `--no-slot` measures
both at once without it (the oversubscription the slot exists to prevent). Prints each solo wall time,
the concurrent wall time, and concurrent / (solo A + solo B): at most 1.2 is the aim.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PY, ROOT, env, scratch


def cmd(store: Path, experiment: str, steps: int) -> list[str]:
    return [
        PY,
        "-m",
        "regimen.flows.cli",
        "run",
        "tests/tiny.yaml",
        "--store",
        str(store),
        "--experiment",
        experiment,
        "--set",
        f"grpo.max_steps={steps}",
        "--set",
        "grpo.save_steps=1000",
        "--set",
        f"sft.max_steps={steps}",
    ]


def solo(store: Path, experiment: str, steps: int, extra: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd(store, experiment, steps), cwd=ROOT, env=env(**extra), check=True, capture_output=True)
    return time.perf_counter() - t0


def together(store: Path, steps: int, extra: dict[str, str]) -> float:
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            cmd(store, name, steps),
            cwd=ROOT,
            env=env(**extra),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("together-a", "together-b")
    ]
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"a concurrent run failed:\n{err[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--no-slot", action="store_true")
    args = ap.parse_args()
    extra = {"REGIMEN_MACHINE_SLOTS": "0" if args.no_slot else "1", "REGIMEN_CACHE": scratch("regimen-bench-cache-")}
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        solo(store, "warm-up", 2, extra)  # Prefect's database and the tiny base model, once
        a, b = solo(store, "solo-a", args.steps, extra), solo(store, "solo-b", args.steps, extra)
        both = together(store, args.steps, extra)
    ratio = both / (a + b)
    print(
        f"solo A {a:.1f}s, solo B {b:.1f}s, sum {a + b:.1f}s; both at once {both:.1f}s "
        f"({'compute slot on' if not args.no_slot else 'compute slot off'}): ratio {ratio:.3f} (aim <= 1.2)"
    )


if __name__ == "__main__":
    sys.exit(main())
