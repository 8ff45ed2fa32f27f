"""The reward audit (`stages/rewards/audit.py`) measured: on every task reasoning-gym ships, through the
`reasoning_gym` reward with `partial: false` (Regimen's default: a full score passes) and `partial: true` (the
scorer's own credit), the task's full score as the verdict; on every shipped recipe (its own verdict, its recipe's
audit budget); and on a corpus of gameable and honest rewards written the way people write them
(tests/reward_corpus.py) plus 100 gameable rewards drawn with random parameters. Per audit: caught or not, the
finding's kind, share and witness, the completions the search tried and the seconds it took.

No model: rows are generated (8 per reasoning-gym task, its default configuration; the default recipe's addition
rows for the corpus). Results go to bench/results/reward_audit.jsonl (date, machine, commit on every row).

    .venv/bin/python bench/reward_audit.py [--tasks chain_sum spell_backward ...] [--no-rg]
    .venv/bin/python bench/reward_audit.py --store STORE   # the audit's share of real dry runs' wall time
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


def _finding(report: dict) -> dict:
    f = (report.get("findings") or [{}])[0]
    return {
        "kind": f.get("kind"),
        "share": None if f.get("share") is None else round(f["share"], 3),
        "witness": None if f.get("completion") is None else str(f["completion"])[:80],
    }


def audit_task(name: str) -> dict:
    from regimen.stages.rewards import get_reward
    from regimen.stages.rewards.audit import audit
    from regimen.stages.rewards.scoring import passes

    try:
        rows = rg_rows(name)
    except Exception as exc:  # noqa: BLE001 - a task whose generator fails here is recorded as such
        return {"task": name, "error": f"{type(exc).__name__}: {str(exc)[:120]}"}
    out = {"task": name}
    full = get_reward("reasoning_gym")

    def verdict(completion, row, reference):
        return passes(full(None, [completion], **{k: [v] for k, v in row.items() if k != "prompt"})[0]) == 1.0

    for partial in (False, True):
        fns = {"reasoning_gym": get_reward("reasoning_gym", partial=partial)}
        t0 = time.perf_counter()
        report = audit(fns, {"reasoning_gym": 1.0}, rows, lambda r: r["answer"], correct=verdict)
        key = "partial" if partial else "strict"
        paid = report.get("paid", {})
        for kind in ("reference", "wrong", "empty", "candidates"):
            value = (paid.get(kind) or {}).get("reasoning_gym")
            out[f"{key}_{kind}"] = None if value is None else round(value, 4)
        out[f"{key}_gameable"] = bool(report.get("gameable"))
        found = _finding(report)
        out[f"{key}_finding"] = found["kind"]
        out[f"{key}_share"] = found["share"]
        out[f"{key}_witness"] = found["witness"]
        out[f"{key}_tried"] = (report.get("search") or {}).get("tried", 0)
        out[f"{key}_s"] = round(time.perf_counter() - t0, 2)
        out[f"{key}_errors"] = fns["reasoning_gym"].counts["errors"]
    return out


def shipped() -> list[dict]:
    from regimen.stages.dry_run import _audit
    from regimen.stages.recipe import load_recipe
    from regimen.stages.tasks import shuffled
    from regimen.stages.tasks.registry import load_task

    out = []
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        r = load_recipe(str(path), check_trl=False)
        task = load_task(r.data)
        t0 = time.perf_counter()
        report = _audit(r, shuffled(task.train, seed=1), task.reference)  # as the dry run calls it
        out.append(
            {
                "recipe": path.stem,
                "rewards": ", ".join(f"{k}x{w:g}" for k, w in r.reward_weights().items()),
                "gameable": ", ".join(report.get("gameable") or []) or "-",
                "stops": r.dry_run.gameable == "stop" and bool(report.get("gameable")),
                **_finding(report),
                "tried": (report.get("search") or {}).get("tried", 0),
                "audit_s": round(time.perf_counter() - t0, 2),
            }
        )
    return out


def corpus() -> list[dict]:
    """The corpus (each with the line a policy would learn) and 100 random gameable draws, on the default's rows."""
    sys.path.insert(0, str(ROOT / "tests"))
    import reward_corpus

    from regimen.stages.recipe import load_recipe
    from regimen.stages.rewards.audit import audit
    from regimen.stages.tasks.registry import load_task

    task = load_task(load_recipe(str(ROOT / "configs" / "default.yaml"), check_trl=False).data)
    entries = [("gameable", n, spec, line) for n, (spec, line) in reward_corpus.GAMEABLE.items()]
    entries += [("honest", n, spec, line) for n, (spec, line) in reward_corpus.HONEST.items()]
    entries += [("drawn", n, spec, line) for n, spec, line in reward_corpus.generated(seed=7, n=100)]
    out = []
    for kind, name, spec, line in entries:
        fns, weights = reward_corpus.instances(spec)
        t0 = time.perf_counter()
        report = audit(fns, weights, task.train[:40], task.reference)
        out.append(
            {
                "set": kind,
                "reward": name,
                "learns": line,
                "caught": bool(report["findings"]),
                "correct": bool(report["findings"]) == (kind != "honest"),
                **_finding(report),
                "tried": report["search"]["tried"],
                "audit_s": round(time.perf_counter() - t0, 3),
            }
        )
    return out


def dry_run_share(store: str, stamp: dict) -> list[dict]:
    """The audit's share of real dry runs' wall time: every reward-dry-run version of every experiment in `store`
    (a run's store: `regimen run configs/X.yaml --store S`), its `audit_s` over its `wall_s`."""
    from regimen.stages.store import Store

    st, out = Store(store), []
    for exp in sorted(p.name for p in Path(store).iterdir() if p.is_dir() and p.name[:1].isalnum()):
        for m in st.versions(exp, "reward-dry-run"):
            audit_s = (m.get("metrics") or {}).get("audit_s")
            if audit_s is not None and m.get("wall_s"):
                out.append(
                    {
                        "kind": "dry_run_share",
                        "experiment": exp,
                        "version": m["version"],
                        "audit_s": round(audit_s, 2),
                        "dry_run_s": round(m["wall_s"], 2),
                        "share": round(audit_s / m["wall_s"], 3),
                        **stamp,
                    }
                )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="*")
    ap.add_argument("--no-rg", action="store_true", help="skip reasoning-gym's tasks")
    ap.add_argument("--store", help="only: the audit's share of the dry runs' wall time in this run's store")
    args = ap.parse_args()
    if args.store:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        stamp = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {os.cpu_count()} cores"}
        rows = dry_run_share(args.store, {**stamp, "commit": commit.stdout.strip()})
        with RESULTS.open("a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        print(table(rows, ["experiment", "version", "audit_s", "dry_run_s", "share"]))
        return
    warnings.filterwarnings("ignore")
    header("the reward audit on reasoning-gym's scorers, the shipped recipes and a corpus of rewards")
    from reasoning_gym.factory import DATASETS

    tasks = [] if args.no_rg else args.tasks or sorted(n for n in DATASETS if n != "composite")
    rows = [audit_task(name) for name in tasks]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    stamp = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "commit": commit,
    }
    recipes, rewards = shipped(), corpus()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as fh:
        for row in rows:
            fh.write(json.dumps({"kind": "reasoning-gym", **row, **stamp}) + "\n")
        for row in recipes:
            fh.write(json.dumps({"kind": "recipe", **row, **stamp}) + "\n")
        for row in rewards:
            fh.write(json.dumps({"kind": "corpus", **row, **stamp}) + "\n")
    if rows:
        cols = [
            "task",
            "strict_gameable",
            "strict_s",
            "partial_gameable",
            "partial_share",
            "partial_witness",
            "partial_s",
        ]
        print(table(rows, cols))
        ok = [r for r in rows if "error" not in r]
        print(
            f"\n{len(ok)} tasks audited: gameable with partial: true {sum(r['partial_gameable'] for r in ok)}, "
            f"with partial: false {sum(r['strict_gameable'] for r in ok)}"
        )
    print(table(recipes, list(recipes[0])))
    for kind in ("gameable", "honest", "drawn"):
        part = [r for r in rewards if r["set"] == kind]
        right = sum(r["correct"] for r in part)
        secs = sorted(r["audit_s"] for r in part)
        print(
            f"{kind}: {right}/{len(part)} {'caught' if kind != 'honest' else 'passed'}; completions tried median "
            f"{sorted(r['tried'] for r in part)[len(part) // 2]}; seconds per reward median {secs[len(secs) // 2]}, "
            f"max {secs[-1]}"
        )
    print(table([r for r in rewards if not r["correct"]], ["set", "reward", "learns", "kind", "witness"]))


if __name__ == "__main__":
    main()
