"""The fixed cost of a run: wall time minus the stages' own time, through `regimen run` (Prefect, a temporary
server) and with the same stages called as plain functions (no Prefect), each in a fresh process; where it
goes; and the default recipe's wall / stages ratio, all in one invocation.

    python bench/overhead.py [--runs 3] [--no-default]

The stages' own time is the sum of `wall_s` in the manifests the run wrote (each stage from its start to
its commit). One Prefect home for the whole benchmark, as on a user's machine where ~/.prefect persists:
the first run creates Prefect's database, and is reported apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from common import PY, ROOT, header, manifests, regimen, run, scratch, table

TINY = "tests/tiny.yaml"
STAGES = ("sft", "reward-dry-run", "grpo-smoke", "grpo", "eval")


def direct(config: str, store: str) -> None:
    """The stages of one cycle, called as plain functions (no Prefect), in the flow's order."""
    sys.path.insert(0, str(ROOT))
    from regimen.stages.recipe import load_recipe
    from regimen.stages.run.runner import StageCall, execute
    from regimen.stages.store import Store
    from regimen.stages.training.policy import base_policy

    recipe = load_recipe(config, [f"store={store}", "cycle.max_cycles=1"])
    st, exp = Store(recipe.store), recipe.experiment  # the recipe's own experiment, chosen here as a CLI run would

    def run(stage: str, inputs: dict):
        return execute(StageCall(stage, recipe, inputs, experiment=exp), st)

    sft = run("sft", {"policy": base_policy(recipe, st), "cycle": 1})
    run("reward-dry-run", {"policy": sft.ref})
    run("grpo-smoke", {"policy": sft.ref})
    grpo = run("grpo", {"policy": sft.ref})
    run("eval", {"policy": grpo.ref})


def stages_s(store: Path, experiment: str) -> float:
    return sum(m["wall_s"] for s in STAGES for m in manifests(store, experiment, s))


def snippet_s(code: str) -> float:
    out = run(
        [PY, "-c", f"import time; t0_ = time.perf_counter()\n{code}\nprint('RESULT', time.perf_counter() - t0_)"]
    )["out"]
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("RESULT ")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs of each path on the tiny recipe (medians are reported)")
    ap.add_argument("--no-default", action="store_true", help="skip the default recipe's run (about 6 minutes)")
    ap.add_argument("--direct", nargs=2, metavar=("CONFIG", "STORE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.direct:
        return direct(*args.direct)

    header("fixed cost of a run: regimen run (Prefect) vs. the stages as plain functions")
    tmp = Path(scratch("regimen-bench-overhead-"))
    first = regimen("run", TINY, "--store", str(tmp / "first"))
    first_fixed = first["wall_s"] - stages_s(tmp / "first", "tiny-test")
    rows = []
    for i in range(args.runs):
        for path in ("flow", "direct"):
            store = tmp / f"{path}-{i}"
            res = (
                regimen("run", TINY, "--store", str(store))
                if path == "flow"
                else run([PY, "bench/overhead.py", "--direct", TINY, str(store)])
            )
            st = stages_s(store, "tiny-test")
            rows.append(
                {
                    "run": i + 1,
                    "path": path,
                    "wall_s": res["wall_s"],
                    "stages_s": st,
                    "fixed_s": res["wall_s"] - st,
                    "terminal_lines": len(res["out"].splitlines()) if path == "flow" else "",
                }
            )
    print(table(rows, ["run", "path", "wall_s", "stages_s", "fixed_s", "terminal_lines"]))
    med = {p: statistics.median(r["fixed_s"] for r in rows if r["path"] == p) for p in ("flow", "direct")}
    print(
        f"\nfixed cost, median of {args.runs}: flow {med['flow']:.1f}s, direct {med['direct']:.1f}s; Prefect adds "
        f"{med['flow'] - med['direct']:+.1f}s "
        f"(the very first run, which creates Prefect's database: {first_fixed:.1f}s)"
    )

    stack = (
        "import regimen.stages.recipe.trl, regimen.stages.sft, regimen.stages.grpo, regimen.stages.evaluate\n"
        "from trl import GRPOConfig, SFTConfig, GRPOTrainer, SFTTrainer\nimport datasets"
    )
    imports = snippet_s(stack)
    prefect = snippet_s(
        "import regimen.flows.pipeline.cycle, regimen.flows.serving.server, regimen.flows.present.terminal"
    )
    boot = snippet_s(
        "from regimen.flows.serving.server import TemporaryServer\ns = TemporaryServer(); s.ready(); s.stop()"
    )
    print(
        f"where it goes: importing torch/transformers/TRL/datasets and the stage code {imports:.1f}s (both paths); "
        f"importing Prefect and "
        f"flows {prefect:.1f}s; the temporary server's boot {boot:.1f}s (in its own process, while the recipe "
        f"validates); the rest is Prefect's task and flow runs, the stage lines and the exit"
    )

    if not args.no_default:
        store = tmp / "default"
        res = regimen("run", "configs/default.yaml", "--store", str(store))
        st = stages_s(store, "default")
        print(
            f"\ndefault recipe: wall {res['wall_s']:.1f}s, stages {st:.1f}s, wall / stages {res['wall_s'] / st:.3f}, "
            f"fixed {res['wall_s'] - st:.1f}s"
        )
    print(
        json.dumps(
            {
                "fixed_flow_s": med["flow"],
                "fixed_direct_s": med["direct"],
                "first_run_fixed_s": first_fixed,
                "at": time.strftime("%Y-%m-%d %H:%M"),
            }
        )
    )


if __name__ == "__main__":
    main()
