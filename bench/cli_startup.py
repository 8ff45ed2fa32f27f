"""How long `regimen --help` and `regimen check <recipe>` take to start, against a baseline tree in the
same run (issue 47 item 7: imports moved to the top must keep the light commands light).

The baseline is another commit of this repository (`--baseline REF`, default: the commit before the
imports moved), checked out in a temporary git worktree and put first on PYTHONPATH (the editable
install's finder is appended to `sys.meta_path`, so PYTHONPATH wins); the current tree is this checkout.
Runs alternate (baseline, current) so that load on the machine falls on both; the figure is the median
of each, and the ratio current / baseline. Also records which heavy libraries each command loaded.

    python bench/cli_startup.py [--baseline REF] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, env, header, table

HEAVY = ("torch", "trl", "transformers", "datasets", "prefect", "fsspec")
COMMANDS = [["--help"], ["check", "configs/default.yaml"]]
SNIPPET = (
    "import sys\n"
    "sys.argv = ['regimen', *sys.argv[1:]]\n"
    "from regimen.flows.cli import main\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\n"
    f"print('LOADED', sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})), file=sys.stderr)\n"
)


def tree_of(ref: str, scratch: Path) -> Path:
    """A folder to put on PYTHONPATH holding `regimen` as the tree of `ref`."""
    work = scratch / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(work), ref], cwd=ROOT, check=True)
    (scratch / "path").mkdir()
    (scratch / "path" / "regimen").symlink_to(work)
    return scratch / "path"


def once(path: Path | None, args: list[str]) -> tuple[float, list[str]]:
    extra = {"PYTHONPATH": str(path)} if path else {}
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", SNIPPET, *args], cwd=ROOT, env=env(**extra), capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    loaded = next((line for line in r.stderr.splitlines() if line.startswith("LOADED")), "LOADED ?")
    return wall, json.loads(loaded.split(" ", 1)[1].replace("'", '"'))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="216ff10~1", help="the commit to compare with")
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    baseline_sha = subprocess.run(
        ["git", "rev-parse", "--short", a.baseline], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    current_sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    header(f"CLI start-up: {current_sha} (this tree) vs {baseline_sha}")
    with tempfile.TemporaryDirectory(prefix="regimen-bench-cli-") as tmp:
        base = tree_of(a.baseline, Path(tmp))
        try:
            rows = []
            for args in COMMANDS:
                once(base, args), once(None, args)  # warm the disk cache and the bytecode of both trees
                times: dict[str, list[float]] = {"baseline": [], "current": []}
                loaded: dict[str, list[str]] = {}
                for _ in range(a.repeats):
                    for which, path in (("baseline", base), ("current", None)):
                        wall, libs = once(path, args)
                        times[which].append(wall)
                        loaded[which] = libs
                b, c = statistics.median(times["baseline"]), statistics.median(times["current"])
                rows.append(
                    {
                        "bench": "cli_startup",
                        "command": f"regimen {' '.join(args)}",
                        "baseline": baseline_sha,
                        "current": current_sha,
                        "repeats": a.repeats,
                        "baseline_s": round(b, 3),
                        "current_s": round(c, 3),
                        "ratio": round(c / b, 3),
                        "baseline_loads": loaded["baseline"],
                        "current_loads": loaded["current"],
                        "cpus": os.cpu_count(),
                        "date": time.strftime("%Y-%m-%d"),
                    }
                )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(Path(tmp) / "tree")], cwd=ROOT)
    print(table(rows, ["command", "baseline_s", "current_s", "ratio", "baseline_loads", "current_loads"]))
    with (ROOT / "bench" / "results" / "cli_startup.jsonl").open("a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
