"""Sandboxed unit-test scoring throughput against a naive baseline, measured in the same run.

    python bench/sandbox_throughput.py [--n 300] [--workers N] [--json]

Solutions: the shipped code problems' reference solutions and, for every third one, a wrong solution
(so both passing and failing tests are exercised). The sandboxed run scores them with
`regimen.stages.rewards.sandbox.run_batch` (isolated, parallel, server start-up included); the naive baseline runs
one `subprocess.run([python, "-c", solution + tests])` per solution, sequentially, with no isolation
at all. Both must agree on every score. Prints solutions/second for each and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from regimen.stages.rewards.code import load_code_problems  # noqa: E402
from regimen.stages.rewards.sandbox import SandboxConfig, isolation_status, run_batch  # noqa: E402

NAIVE_HARNESS = """
import sys
_tests = {tests!r}
_passed = 0
for _t in _tests:
    try:
        exec(compile(_t, "<test>", "exec"), globals())
        _passed += 1
    except Exception:
        pass
print("PASSED", _passed)
"""


def solutions(n: int) -> list[tuple[str, list[str]]]:
    problems = load_code_problems()
    items = []
    for i in range(n):
        p = problems[i % len(problems)]
        code = p["answer"] if i % 3 else f"def {p['entry_point']}(*args, **kwargs):\n    return None\n"
        items.append((code, p["tests"]))
    return items


def naive(items: list[tuple[str, list[str]]], timeout_s: float) -> list[int]:
    passed = []
    for code, tests in items:
        program = code + "\n" + NAIVE_HARNESS.format(tests=tests)
        try:
            proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=timeout_s)
            last = proc.stdout.strip().splitlines()[-1:] or [""]
            passed.append(int(last[0].split()[1]) if last[0].startswith("PASSED ") else 0)
        except subprocess.TimeoutExpired:
            passed.append(0)
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="solutions to score (default 300)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="sandbox worker slots (default: CPUs)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()

    items = solutions(args.n)
    isolated, why = isolation_status()
    cfg = SandboxConfig(timeout_s=5.0, allow_unisolated=not isolated)

    started = time.perf_counter()
    results = run_batch(items, workers=args.workers, config=cfg)
    sandboxed_s = time.perf_counter() - started

    started = time.perf_counter()
    baseline = naive(items, cfg.timeout_s)
    naive_s = time.perf_counter() - started

    disagree = [i for i, (r, b) in enumerate(zip(results, baseline)) if r.passed != b]
    report = {
        "solutions": len(items),
        "tests": sum(len(t) for _, t in items),
        "workers": args.workers,
        "cpus": os.cpu_count(),
        "isolated": isolated and all(r.isolated for r in results),
        "sandboxed_s": round(sandboxed_s, 3),
        "sandboxed_per_s": round(len(items) / sandboxed_s, 1),
        "naive_s": round(naive_s, 3),
        "naive_per_s": round(len(items) / naive_s, 1),
        "ratio": round(naive_s / sandboxed_s, 2),
        "load_avg_1m": os.getloadavg()[0],
        "scores_agree": not disagree,
    }
    if args.json:
        print(json.dumps(report))
    else:
        iso = "isolated" if report["isolated"] else f"NOT isolated ({why})"
        print(f"{report['solutions']} solutions, {report['tests']} test snippets, {report['cpus']} CPUs, load average {report['load_avg_1m']:.2f}")
        print(f"sandboxed ({iso}, {args.workers} workers): {sandboxed_s:.2f} s = {report['sandboxed_per_s']} solutions/s")
        print(f"naive (subprocess.run per solution, sequential, no isolation): {naive_s:.2f} s = {report['naive_per_s']} solutions/s")
        print(f"ratio: sandboxed is {report['ratio']}x the naive baseline's speed")
        if disagree:
            print(f"WARNING: scores disagree on {len(disagree)} solutions, e.g. item {disagree[0]}")
    return 0 if not disagree else 1


if __name__ == "__main__":
    raise SystemExit(main())
