"""Retention over a month of nights whose champion changes most nights (issue 51): is what the store holds bounded?

    python bench/retention_nights.py [--nights 30] [--stores local s3]

Each night is a real `regimen run tests/tiny.yaml` on new data (`data.seed` = the night) with
`store.keep: {last: 2}` (its gc runs after the run; `keep.champions` at its default, 2). The nightly SFT starts from
the champion, as `cycle.start_from: champion` does. When the flow did not promote, a person promotes the night's
GRPO (`regimen promote`) on four nights of five, so the champion changes most nights; then `regimen gc --keep-last 2`
runs, as the next night's run would. After each night: versions each stage holds (its index) against the versions
it has written (the baseline in the same run: without retention they are equal), and the model folders kept.
Counted, not timed. In SeaweedFS (a real S3 server) the same, through the bucket's indexes.

Results: `bench/results/retention.jsonl`, one row per night and store.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import ROOT, header, regimen, scratch, table  # noqa: E402

EXP = "tiny-test"
TINY = ROOT / "tests" / "tiny.yaml"
RESULTS = ROOT / "bench" / "results" / "retention.jsonl"
STAGES = ("sft", "reward-dry-run", "grpo-smoke", "grpo", "eval")


def held(url: str, extra_env: dict[str, str]) -> dict[str, object]:
    """Per stage: versions held (the index) and written (the index's next number less one); model folders kept."""
    code = (
        "import json, sys\n"
        "from regimen.stages.store import Store\n"
        "st = Store(sys.argv[1])\n"
        "out = {}\n"
        "for stage in sys.argv[3:]:\n"
        "    listed = st.versions(sys.argv[2], stage)\n"
        "    out[stage] = [len(listed), st.next_version(sys.argv[2], stage) - 1,"
        " sum(1 for e in listed if e.get('has_model'))]\n"
        "print(json.dumps(out))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, url, EXP, *STAGES],
        cwd=ROOT,
        env={**os.environ, **extra_env},
        capture_output=True,
        text=True,
        check=True,
    )
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    return {
        **{f"held_{s}": c[0] for s, c in counts.items()},
        "models_kept": sum(c[2] for c in counts.values()),
        "written_per_stage": counts["grpo"][1],
    }


def night(url: str, n: int, extra_env: dict[str, str]) -> dict:
    args = ["run", str(TINY), "--store", url, "--set", f"data.seed={n}", "--set", "store.keep.last=2"]
    run = regimen(*args, extra_env=extra_env, check=False)
    promoted = "challenger promoted" in run["out"]
    person = False
    if not promoted and n % 5 != 0:  # a person promotes the night's GRPO on four nights of five
        latest = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from regimen.stages.store import Store; "
                "print(Store(sys.argv[1]).versions(sys.argv[2], 'grpo')[-1]['version'])",
                url,
                EXP,
            ],
            cwd=ROOT,
            env={**os.environ, **extra_env},
            capture_output=True,
            text=True,
        ).stdout.strip()
        p = regimen(
            "promote", EXP, f"grpo/v{latest}", "--store", url, "--reason", "bench", extra_env=extra_env, check=False
        )
        person = p["rc"] == 0
    gc = regimen("gc", EXP, "--keep-last", "2", "--store", url, extra_env=extra_env, check=False)
    return {"night": n, "rc": run["rc"], "flow_promoted": promoted, "person_promoted": person, "gc_rc": gc["rc"]}


def arm(kind: str, nights: int, tmp: Path, stamp: dict) -> list[dict]:
    rows: list[dict] = []
    context = None
    if kind == "s3":
        from s3_server import weed_server

        where = tmp / "weed"
        where.mkdir()
        context = weed_server(where)
        s3 = context.__enter__()
        url = f"s3://{s3.make_bucket()}/r"
        extra = {**s3.env(), "REGIMEN_CACHE": str(tmp / "cache")}
    else:
        url, extra = str(tmp / "store"), {}
    try:
        for n in range(1, nights + 1):
            row = {"store": kind, **night(url, n, extra), **held(url, extra), **stamp}
            rows.append(row)
            print(
                f"{kind} night {n}: rc {row['rc']}, promoted: flow {row['flow_promoted']}, "
                f"person {row['person_promoted']}, held {[row[f'held_{s}'] for s in STAGES]} of "
                f"{row['written_per_stage']} written per stage, models kept {row['models_kept']}",
                flush=True,
            )
    finally:
        if context is not None:
            context.__exit__(None, None, None)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--stores", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    args = ap.parse_args()
    header(f"retention over {args.nights} nights, a champion change most nights, store.keep.last=2")
    tmp = Path(scratch("regimen-bench-retention-"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    stamp = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "commit": commit.stdout.strip(),
    }
    rows = [r for kind in args.stores for r in arm(kind, args.nights, tmp, stamp)]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    print(table(rows, ["store", "night", *(f"held_{s}" for s in STAGES), "models_kept", "written_per_stage"]))


if __name__ == "__main__":
    main()
