"""Every shipped tiny recipe on data seeds x float kernels, and whether it kept its stated purpose.

    python bench/recipes.py                          # all recipes, seeds 0 1 2, kernels default and avx2
    python bench/recipes.py --recipe tiny-env        # one recipe (repeatable)
    python bench/recipes.py --seeds 0 --kernels avx2 # a part of the table ('native' = this CPU's own kernels)

A tiny model's training lands elsewhere on another CPU (float kernels) and on another data draw, so a
recipe's figure from one run is not a result. Each run here is a fresh store and the full `regimen run`
(`tiny-distill` runs the default first in its store: its teacher is the default's champion). Every finished
run is appended to a table (`--table`, JSON lines; default `bench/results/recipes.jsonl`, committed with the
code: the artifacts store is not, and a table kept only there was lost with its checkout), so a second
invocation resumes a partly done table and only reports what is already there with `--report`. A row
counts only while its recipe is what it was at the row's commit (its settings; comments aside): retuning a
recipe (and committing it) makes its earlier rows history, kept in the table and reported apart, and its runs start
over.

Printed per recipe: exit codes, verdicts or the stop's kind, held-out per stage (median and range),
the dry run's mean reward, wall (median and max), and whether the recipe's purpose held on every run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
from pathlib import Path

import yaml
from common import ROOT, header, manifests, regimen, scratch, table

TINY = (
    "tiny-env",
    "tiny-code",
    "tiny-code-stdio",
    "tiny-code-weak-teacher",
    "hackable",
    "tiny-code-hackable",
    "tiny-distill",
    "rg-chain-sum",
    "rg-word-reversal",
    "rg-spell-backward",
    "rg-mixture",
)


def _median(xs):
    return statistics.median(xs) if xs else None


def improves(rows):
    """GRPO's evaluation above SFT's held-out on the median, every run exited 0."""
    gains = [r["eval"] - r["sft"] for r in rows if r["eval"] is not None and r["sft"] is not None]
    ok = all(r["rc"] == 0 for r in rows) and len(gains) == len(rows) and _median(gains) > 0
    return (
        ok,
        f"eval - sft median {_median(gains) if gains else float('nan'):+.3f}; exits {sorted({r['rc'] for r in rows})}",
    )


def improves_on_every_run(rows):
    """reasoning-gym recipes: every run exits 0 and GRPO's held-out accuracy (by the task's own scorer) is above
    SFT's on every run, not only on the median."""
    gains = [None if r["eval"] is None or r["sft"] is None else round(r["eval"] - r["sft"], 3) for r in rows]
    ok = all(r["rc"] == 0 for r in rows) and all(g is not None and g > 0 for g in gains)
    return ok, f"eval - sft {gains}; exits {sorted({r['rc'] for r in rows})}"


def trains_through_tools(rows):
    """tiny-env: every run passes the dry run's band and trains (exit 0), and GRPO beats SFT on the median."""
    ok, why = improves(rows)
    band = all(r["dry_run_mean"] is not None and 0.05 <= r["dry_run_mean"] <= 0.95 for r in rows)
    return ok and band, f"{why}; dry run in the band on every run: {band}"


def stopped_by_the_guard(rows):
    """hackable recipes: every run exits 1 naming reward-hacking-suspected."""
    ok = all(r["rc"] == 1 and r["stop"] == "reward-hacking-suspected" for r in rows)
    return ok, f"stops {[r['stop'] for r in rows]}"


def beats_its_teacher(rows):
    """The weak teacher's student beats the teacher's own held-out accuracy on every run."""
    ok = all(
        r["rc"] == 0 and r["eval"] is not None and r["teacher"] is not None and r["eval"] > r["teacher"] for r in rows
    )
    margins = [round(r["eval"] - r["teacher"], 3) for r in rows if r["eval"] is not None and r["teacher"] is not None]
    return ok, f"student - teacher {margins}"


def distils(rows):
    """tiny-distill: on every run it exits 0 and the distillation teaches: the student goes from its short SFT
    (the answer's format, not the skill) to at least half its teacher's held-out accuracy. (Only "above the
    SFT" passed a run whose distillation had stalled at 0.12 against a teacher at 0.965.)"""
    ok = all(
        r["rc"] == 0
        and r["distill"] is not None
        and r["teacher"] is not None
        and r["distill"] > (r["sft"] or 0)
        and r["distill"] >= 0.5 * r["teacher"]
        for r in rows
    )
    return ok, f"sft -> distill (teacher) {[(r['sft'], r['distill'], r['teacher']) for r in rows]}"


PURPOSE = {
    "tiny-env": trains_through_tools,
    "tiny-code": improves,
    "tiny-code-stdio": improves,
    "tiny-code-weak-teacher": beats_its_teacher,
    "hackable": stopped_by_the_guard,
    "tiny-code-hackable": stopped_by_the_guard,
    "tiny-distill": distils,
    "rg-chain-sum": improves_on_every_run,
    "rg-word-reversal": improves_on_every_run,
    "rg-spell-backward": improves_on_every_run,
    "rg-mixture": improves_on_every_run,
}


def _metric(ms, key):
    vals = [m["metrics"][key] for m in ms if key in m.get("metrics", {})]
    return round(vals[-1], 4) if vals else None


def _dry_run_mean(store: str, exp: str, out: str) -> float | None:
    """The dry run's mean reward: from its version, or from its stop ("mean reward 0.016 over ...")."""
    got = _metric(manifests(store, exp, "reward-dry-run"), "mean_reward")
    if got is None and (m := re.search(r"^stopped: reward-dry-run: mean reward ([0-9.]+)", out, re.M)):
        got = float(m.group(1))
    return got


def kernel_env(kernel: str) -> dict[str, str]:
    """'native': the kernels torch picks on this CPU; otherwise an ATEN_CPU_CAPABILITY value ('avx2',
    'avx512', or 'default', torch's unvectorised kernels)."""
    return {} if kernel == "native" else {"ATEN_CPU_CAPABILITY": kernel}


def default_kernels() -> list[str]:
    """Two float-kernel families this CPU can run: its own and AVX2, or, where its own is AVX2 (no
    AVX-512), its own and torch's unvectorised kernels."""
    import torch

    return ["native", "default" if torch.backends.cpu.get_cpu_capability() == "AVX2" else "avx2"]


def one_run(recipe: str, seed: int, kernel: str) -> dict:
    store = scratch(f"regimen-bench-recipes-{recipe}-")
    env = kernel_env(kernel)
    sets = ["--set", f"data.seed={seed}"]
    wall = 0.0
    if recipe == "tiny-distill":  # its teacher: the default's champion, in the same store, on the same seed and kernel
        first = regimen("run", "configs/default.yaml", "--store", store, *sets, extra_env=env, check=False)
        wall += first["wall_s"]
    r = regimen("run", f"configs/{recipe}.yaml", "--store", store, *sets, extra_env=env, check=False)
    wall += r["wall_s"]
    exp = recipe  # every shipped recipe's experiment is its file's name (checked in main)
    stops = [x for x in r["out"].splitlines() if x.startswith(("stopped:", "error:"))]
    decisions = sorted((Path(store) / exp / "decisions").glob("*.json"))
    sfts, evals, distills = (
        manifests(store, exp, "sft"),
        manifests(store, exp, "eval"),
        manifests(store, exp, "distill"),
    )
    return {
        "recipe": recipe,
        "seed": seed,
        "kernel": kernel,
        "rc": r["rc"],
        "capability": sfts[0].get("torch_cpu_capability") if sfts else None,
        "verdict": json.loads(decisions[-1].read_text())["verdict"] if decisions else None,
        "stop": "reward-hacking-suspected"
        if "reward-hacking-suspected" in r["out"]
        else (stops[-1][:80] if stops else None),
        "sft": _metric(sfts, "heldout_accuracy"),
        # the teacher: the distillation's (a model) where there is one, else the SFT traces' teacher
        "teacher": _metric(distills, "teacher_heldout_accuracy")
        if distills
        else _metric(sfts, "teacher_heldout_accuracy"),
        "distill": _metric(distills, "heldout_accuracy"),
        "dry_run_mean": _dry_run_mean(store, exp, r["out"]),
        "eval": _metric(evals, "heldout_accuracy"),
        "wall_s": round(wall, 1),
        "last_line": r["out"].strip().splitlines()[-1][:200] if r["out"].strip() else "",
    }


_RECIPE_AT: dict[tuple[str, str], str | None] = {}


def recipe_at(commit: str, name: str) -> str | None:
    """configs/NAME.yaml as it was at `commit` (None where git does not know it)."""
    key = (commit, name)
    if key not in _RECIPE_AT:
        r = subprocess.run(["git", "show", f"{commit}:configs/{name}.yaml"], cwd=ROOT, capture_output=True, text=True)
        _RECIPE_AT[key] = r.stdout if r.returncode == 0 else None
    return _RECIPE_AT[key]


def current(row: dict) -> bool:
    """The row was run with the recipe as it is now: the same settings (YAML parsed, so a comment's edit does
    not make a row history; any value's does)."""
    then = recipe_at(row.get("commit", ""), row["recipe"])
    now = (ROOT / "configs" / f"{row['recipe']}.yaml").read_text()
    return then is not None and (then == now or yaml.safe_load(then) == yaml.safe_load(now))


def summary(recipe: str, rows: list[dict]) -> dict:
    def spread(key):
        xs = [r[key] for r in rows if r[key] is not None]
        return f"{_median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})" if xs else "-"

    holds, why = PURPOSE[recipe](rows)
    return {
        "recipe": recipe,
        "runs": len(rows),
        "exits": " ".join(str(r["rc"]) for r in rows),
        "sft": spread("sft"),
        "distill": spread("distill"),
        "eval": spread("eval"),
        "dry run": spread("dry_run_mean"),
        "wall s": f"{_median([r['wall_s'] for r in rows]):.0f} (max {max(r['wall_s'] for r in rows):.0f})",
        "purpose": ("holds" if holds else "MISSED") + f": {why}",
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--recipe", action="append", choices=TINY, help="one shipped tiny recipe (repeatable; default: all)"
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--kernels", nargs="+", help="'native' and/or ATEN_CPU_CAPABILITY values (default: two families this CPU has)"
    )
    ap.add_argument("--table", default=str(ROOT / "bench" / "results" / "recipes.jsonl"))
    ap.add_argument("--report", action="store_true", help="print what the table holds; run nothing")
    args = ap.parse_args()
    args.kernels = args.kernels or default_kernels()
    recipes = args.recipe or list(TINY)
    for name in recipes:  # the table is keyed by recipe: its experiment must be its name
        text = (ROOT / "configs" / f"{name}.yaml").read_text()
        if not re.search(rf"^experiment:\s*{re.escape(name)}\s*$", text, re.M):
            raise SystemExit(f"configs/{name}.yaml: experiment is not {name!r}")
    path = Path(args.table)
    path.parent.mkdir(parents=True, exist_ok=True)
    everything = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    done = [d for d in everything if current(d)]  # rows of an earlier version of their recipe are history
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    if not args.report and any(
        subprocess.run(["git", "diff", "--quiet", "HEAD", "--", f"configs/{r}.yaml"], cwd=ROOT).returncode
        for r in recipes
    ):
        raise SystemExit(
            "a recipe differs from the commit (git diff configs/): commit it first, so that its rows name the recipe "
            "they ran"
        )
    header(f"recipes {recipes} on seeds {args.seeds} x kernels {args.kernels} (table {path}, commit {commit})")
    for recipe in recipes if not args.report else []:
        for kernel in args.kernels:
            for seed in args.seeds:
                if any((d["recipe"], d["seed"], d["kernel"]) == (recipe, seed, kernel) for d in done):
                    continue  # resumed: this run is in the table
                row = {**one_run(recipe, seed, kernel), "commit": commit}
                if row["rc"] < 0 or row["rc"] in (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGKILL):
                    raise SystemExit(
                        f"{recipe} seed {seed} {kernel}: the run was stopped by a signal (exit {row['rc']}): "
                        "not a result of the recipe, not recorded; rerun to resume the table"
                    )
                done.append(row)
                with path.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                print(table([row], [k for k in row if k != "last_line"]), flush=True)
    report(recipes, everything, done, args.seeds, args.kernels)


COLUMNS = ["seed", "kernel", "capability", "rc", "verdict", "stop", "sft", "teacher", "distill", "dry_run_mean", "eval"]


def report(recipes: list[str], everything: list[dict], done: list[dict], seeds: list[int], kernels: list[str]) -> None:
    """Each recipe's runs (and its earlier versions' apart), then one summary row per recipe."""
    summaries = []
    for recipe in recipes:
        old = [d for d in everything if d["recipe"] == recipe and not current(d)]
        if old:
            print(
                f"\n## {recipe}: {len(old)} earlier run(s) of an earlier version of the recipe (commits "
                f"{', '.join(sorted({str(d.get('commit')) for d in old}))}), not counted\n"
                + table(old, ["seed", "kernel", "rc", "verdict", "sft", "teacher", "eval", "wall_s", "commit"])
            )
        rows = [d for d in done if d["recipe"] == recipe and d["seed"] in seeds and d["kernel"] in kernels]
        if rows:
            print(f"\n## {recipe}\n" + table(rows, [*COLUMNS, "wall_s", "commit"]))
            caps = sorted({str(r["capability"]) for r in rows})
            if len(caps) < 2 and len(kernels) > 1:
                print(f"note: every run computed with {caps}: the kernels asked for were one family on this CPU")
            summaries.append(summary(recipe, rows))
    if summaries:
        print("\n" + table(summaries, list(summaries[0])))


if __name__ == "__main__":
    main()
