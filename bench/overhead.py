"""Orchestration overhead: the default recipe through the Prefect flow (`regimen run`) vs. the same
stages called directly as Python functions (`regimen.stages.runner.execute`), each in a fresh process.

    python bench/overhead.py [--config configs/default.yaml] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.common import PY, header, manifests, regimen, run, scratch, table  # noqa: E402


def direct(config: str, store: str, sets: list[str]) -> None:
    """The stages of one cycle, called as plain functions (no Prefect), in the flow's order."""
    t0 = time.perf_counter()
    from regimen.stages.recipe import load_recipe
    from regimen.stages.training.policy import base_policy
    from regimen.stages.runner import execute
    from regimen.stages.store import Store

    recipe = load_recipe(config, sets + [f"store={store}"])
    st = Store(recipe.store)
    sft = execute("sft", recipe, {"policy": base_policy(recipe, st), "cycle": 1}, st)
    execute("reward-dry-run", recipe, {"policy": sft.ref}, st)
    execute("grpo-smoke", recipe, {"policy": sft.ref}, st)
    grpo = execute("grpo", recipe, {"policy": sft.ref}, st, round_=1)
    g = grpo.manifest["metrics"]
    execute("eval", recipe, {"policy": grpo.ref, "cycle": 1, "round": 1, "history": [{"cycle": 1, "round": 0, "heldout_accuracy": sft.manifest["metrics"]["heldout_accuracy"]}],
                             "train_reward": g.get("train_reward_last"), "train_reward_first": g.get("train_reward_first")}, st, round_=1)
    print(json.dumps({"in_process_s": time.perf_counter() - t0}))


def result(out: str) -> list[str]:
    """The values a snippet printed after RESULT (Prefect logs around it)."""
    return next(line.split()[1:] for line in out.splitlines() if line.startswith("RESULT "))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--direct", nargs=1, metavar="STORE", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sets = ["cycle.max_cycles=1", *args.sets]
    if args.direct:
        return direct(args.config, args.direct[0], sets)

    header("orchestration overhead: Prefect flow vs. direct calls")
    tmp = Path(scratch("regimen-bench-overhead-"))
    imp = run([PY, "-c", "import time; t=time.perf_counter(); import regimen.stages.runner, regimen.stages.sft, regimen.stages.grpo, regimen.stages.evaluate; a=time.perf_counter()-t; import regimen.flows.cycle; print('RESULT', a, time.perf_counter()-t-a)"])
    stage_imports, prefect_imports = map(float, result(imp["out"]))
    snippet = "from prefect import flow\nimport time\n@flow\ndef noop(): pass\nt=time.perf_counter(); noop(); print('RESULT', time.perf_counter()-t)"
    [first_start] = map(float, result(run([PY, "-c", snippet])["out"]))  # creates and migrates Prefect's database
    [prefect_start] = map(float, result(run([PY, "-c", snippet])["out"]))
    d = run([PY, "bench/overhead.py", "--config", args.config, *sum((["--set", s] for s in args.sets), []), "--direct", str(tmp / "direct")])
    f = regimen("run", args.config, "--store", str(tmp / "flow"), *sum((["--set", s] for s in sets), []))
    exp = "default"
    for line in f["out"].splitlines():
        if line.startswith("experiment "):
            exp = line.split()[1]
    rows = []
    for label, store, res in (("direct", tmp / "direct", d), ("flow", tmp / "flow", f)):
        stages = {m["stage"]: m["wall_s"] for s in ("sft", "reward-dry-run", "grpo-smoke", "grpo", "eval") for m in manifests(store, exp, s)}
        rows.append({"path": label, "wall_s": res["wall_s"], "sum_of_stages_s": sum(stages.values()), "grpo_s": stages.get("grpo", 0.0),
                     "wall/stages": res["wall_s"] / sum(stages.values())})
    print(table(rows, ["path", "wall_s", "sum_of_stages_s", "grpo_s", "wall/stages"]))
    ratio = rows[1]["wall_s"] / rows[0]["wall_s"]
    extra = rows[1]["wall_s"] - rows[0]["wall_s"]
    print(f"\nflow / direct wall time: {ratio:.3f}  (flow costs {extra:+.1f}s over {rows[0]['wall_s']:.1f}s)")
    print(f"where it goes: importing prefect + flows {prefect_imports:.1f}s; Prefect's temporary server + an empty flow run {prefect_start:.1f}s "
          f"(the very first one, which creates Prefect's database: {first_start:.1f}s; `regimen run` boots the server while the recipe "
          f"validates, so part of this overlaps); the rest (task runs, artifacts, plots, noise) {extra - prefect_imports - prefect_start:+.1f}s")
    print(f"(stage code imports, paid by both paths: {stage_imports:.1f}s)")


if __name__ == "__main__":
    main()
