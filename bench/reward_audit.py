"""What reasoning-gym's own scorers pay (issue 44): the reward audit (`stages/rewards/audit.py`) run on every task
reasoning-gym ships, through the `reasoning_gym` reward with `partial: false` (Regimen's default: a full score
passes) and `partial: true` (the scorer's own credit), and on Regimen's rewards and shipped recipes.

No model: each task's rows are generated (8 per task, its default configuration), the probes are made from their
reference answers, and each reward's mean on each probe is recorded with the findings. Results go to
bench/results/reward_audit.jsonl (date, machine, commit on every row).

    .venv/bin/python bench/reward_audit.py [--tasks chain_sum spell_backward ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, header, table  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "reward_audit.jsonl"


def rg_rows(name: str, n: int = 8) -> list[dict]:
    from regimen.stages.recipe.schema import Recipe
    from regimen.stages.tasks import reasoning_gym as task

    opts = Recipe.model_validate(
        {
            "data": {"task": "reasoning_gym", "name": name, "train_size": n, "heldout_size": n},
            "rewards": [{"name": "reasoning_gym"}],
        }
    ).data
    return task.generate(opts, n, 7)


def audit_task(name: str) -> dict:
    from regimen.stages.rewards import get_reward
    from regimen.stages.rewards.audit import audit

    try:
        rows = rg_rows(name)
    except Exception as exc:  # noqa: BLE001 - a task whose generator fails here is recorded as such
        return {"task": name, "error": f"{type(exc).__name__}: {str(exc)[:120]}"}
    out = {"task": name}
    for partial in (False, True):
        fns = {"reasoning_gym": get_reward("reasoning_gym", partial=partial)}
        report = audit(fns, {"reasoning_gym": 1.0}, rows, lambda r: r["answer"])
        key = "partial" if partial else "strict"
        paid = report.get("paid", {})
        for kind in ("reference", "wrong", "empty", "candidates", "repeated", "prefixed", "suffixed"):
            value = (paid.get(kind) or {}).get("reasoning_gym")
            out[f"{key}_{kind}"] = None if value is None else round(value, 4)
        out[f"{key}_gameable"] = bool(report.get("gameable"))
        out[f"{key}_errors"] = fns["reasoning_gym"].counts["errors"]
    return out


def shipped() -> list[dict]:
    from regimen.stages.recipe import load_recipe
    from regimen.stages.rewards import from_specs
    from regimen.stages.rewards.audit import audit
    from regimen.stages.tasks import shuffled
    from regimen.stages.tasks.registry import load_task

    out = []
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        r = load_recipe(str(path), check_trl=False)
        task = load_task(r.data)
        report = audit(from_specs(r.rewards), r.reward_weights(), shuffled(task.train, seed=1), task.reference)
        out.append(
            {
                "recipe": path.stem,
                "rewards": ", ".join(f"{k}x{w:g}" for k, w in r.reward_weights().items()),
                "gameable": ", ".join(report.get("gameable") or []) or "-",
                "stops": r.dry_run.gameable == "stop" and bool(report.get("gameable")),
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="*")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    header("the reward audit on reasoning-gym's scorers and on the shipped recipes")
    from reasoning_gym.factory import DATASETS

    tasks = args.tasks or sorted(n for n in DATASETS if n != "composite")
    rows = [audit_task(name) for name in tasks]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    stamp = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "commit": commit,
    }
    recipes = shipped()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as fh:
        for row in rows:
            fh.write(json.dumps({"kind": "reasoning-gym", **row, **stamp}) + "\n")
        for row in recipes:
            fh.write(json.dumps({"kind": "recipe", **row, **stamp}) + "\n")
    cols = [
        "task",
        "strict_reference",
        "strict_candidates",
        "strict_suffixed",
        "strict_gameable",
        "partial_candidates",
        "partial_repeated",
        "partial_suffixed",
        "partial_gameable",
        "strict_errors",
    ]
    print(table(rows, cols))
    ok = [r for r in rows if "error" not in r]
    print(
        f"\n{len(ok)} tasks audited: gameable with partial: true {sum(r['partial_gameable'] for r in ok)}, "
        f"with partial: false {sum(r['strict_gameable'] for r in ok)}; reference paid < 1 with partial: false "
        f"{sum(1 for r in ok if (r['strict_reference'] or 0) < 1)}"
    )
    print(table(recipes, list(recipes[0])))


if __name__ == "__main__":
    main()
