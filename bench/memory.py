"""Peak RSS per stage on the default recipe: each stage runs in its own fresh process (the same
`regimen.stages.run.runner.execute` the flow calls) so its peak is its own. Baseline: a process that only imports
the stage code.

    python bench/memory.py [--config configs/default.yaml] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json

from bench.common import PY, header, peak_rss_mib, scratch, table  # noqa: E402

STAGES = ("sft", "reward-dry-run", "grpo-smoke", "grpo", "eval")


def one(config: str, store: str, stage: str, sets: list[str]) -> None:
    from regimen.stages.recipe import load_recipe
    from regimen.stages.run.runner import StageCall, execute
    from regimen.stages.store import Store
    from regimen.stages.training.policy import base_policy

    recipe = load_recipe(config, sets + [f"store={store}"])
    st = Store(recipe.store)
    exp = recipe.experiment
    sft = st.latest(exp, "sft")
    ref = lambda m: {"stage": m["stage"], "fingerprint": m["fingerprint"], "model": str(st.local_path(m) / "model")}  # noqa: E731
    if stage == "sft":
        inputs = {"policy": base_policy(recipe, st), "cycle": 1}
    elif stage in ("reward-dry-run", "grpo-smoke", "grpo"):
        inputs = {"policy": ref(sft)}
    else:
        g = st.latest(exp, "grpo")
        inputs = {
            "policy": ref(g),
            "cycle": 1,
            "round": 1,
            "history": [{"cycle": 1, "round": 0, "heldout_accuracy": sft["metrics"]["heldout_accuracy"]}],
            "train_reward": g["metrics"].get("train_reward_last"),
            "train_reward_first": g["metrics"].get("train_reward_first"),
        }
    execute(
        StageCall(
            stage, recipe, inputs, experiment=exp, round=0 if stage in ("sft", "reward-dry-run", "grpo-smoke") else 1
        ),
        st,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--one", nargs=2, metavar=("STORE", "STAGE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    sets = ["cycle.max_cycles=1", *args.sets]
    if args.one:
        return one(args.config, args.one[0], args.one[1], sets)
    header("peak RSS per stage")
    store = scratch("regimen-bench-mem-")
    base_wall, base_rss, _ = peak_rss_mib(
        [
            PY,
            "-c",
            "import regimen.stages.run.runner, regimen.stages.sft, regimen.stages.grpo, regimen.stages.evaluate, trl, "
            "datasets",
        ]
    )
    rows = [{"stage": "(imports only)", "peak_rss_mib": base_rss, "wall_s": base_wall, "x imports": 1.0}]
    for stage in STAGES:
        wall, rss, rc = peak_rss_mib(
            [
                PY,
                "bench/memory.py",
                "--config",
                args.config,
                *sum((["--set", s] for s in args.sets), []),
                "--one",
                store,
                stage,
            ]
        )
        if rc != 0:
            raise SystemExit(f"stage {stage} failed (exit {rc})")
        rows.append({"stage": stage, "peak_rss_mib": rss, "wall_s": wall, "x imports": rss / base_rss})
    print(table(rows, ["stage", "peak_rss_mib", "wall_s", "x imports"]))
    print(json.dumps({r["stage"]: round(r["peak_rss_mib"], 1) for r in rows}))


if __name__ == "__main__":
    main()
