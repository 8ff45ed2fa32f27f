"""What a year of nights costs (issue 42): `regimen status`, an identical rerun (every stage reused) and a run that
adds one version, on an experiment whose stages hold N versions (10, 100, 1,000), in a local store and in a
SeaweedFS bucket; and the bytes a night adds with and without `store.keep`.

The N versions are built as the issue built them: one real run of `tests/tiny.yaml`, then each stage's version
copied and renumbered v1..vN (same fingerprint: an identical rerun reuses the newest), the indexes rebuilt once
(`regimen reindex`, not measured). Measured per arm: wall seconds, and in the bucket the S3 requests the server
answered (`SeaweedFS_s3_request_total`: counted, not timed, so a loaded machine cannot move it). Ratios are
against N=10 in the same run. Results go to bench/results/store_growth.jsonl with the date, machine and commit.

    .venv/bin/python bench/store_growth.py [--sizes 10 100 1000] [--stores local s3] [--nights 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import ROOT, header, regimen, scratch, table  # noqa: E402

EXP = "tiny-test"
TINY = ROOT / "tests" / "tiny.yaml"
RESULTS = ROOT / "bench" / "results" / "store_growth.jsonl"


def source(tmp: Path) -> Path:
    """One real run of the tiny recipe: the versions every arm is built from."""
    store = tmp / "source"
    regimen("run", str(TINY), "--store", str(store))
    return store / EXP


def replicate(src: Path, n: int, put) -> None:
    """Each stage's v1 as v1..vN (manifest renumbered), the experiment's records as they are; `put(rel, bytes)`."""
    for path in sorted(src.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(src).as_posix()
        if path.name.endswith(".lock"):
            continue  # a local store's filelocks (empty files): not the experiment's records
        parts = rel.split("/")
        if len(parts) >= 3 and parts[1] == "v1" and parts[0] not in ("heldout", "data"):
            for v in range(1, n + 1):
                data = path.read_bytes()
                if parts[-1] == "manifest.json":
                    manifest = json.loads(data)
                    manifest["version"] = v
                    data = json.dumps(manifest).encode()
                put("/".join([parts[0], f"v{v}", *parts[2:]]), data)
        elif len(parts) >= 2 and parts[1].startswith("v") and parts[0] not in ("heldout", "data"):
            continue  # other versions of the source run (none in a one-cycle run)
        elif not rel.endswith("index.json") and not rel.startswith("work/"):
            put(rel, path.read_bytes())


def measure(store_url: str, extra_env: dict[str, str], counter) -> dict[str, dict[str, float]]:
    out = {}
    arms = {
        "status": ["status", EXP, "--store", store_url],
        "identical rerun": ["run", str(TINY), "--store", store_url],
        "adds a version": [
            "run",
            str(TINY),
            "--store",
            store_url,
            "--set",
            "grpo.max_steps=7",
            "--set",
            "cycle.max_cycles=1",
        ],
    }
    for name, args in arms.items():
        before = counter()
        r = regimen(*args, extra_env=extra_env, check=False)
        out[name] = {"wall_s": round(r["wall_s"], 2), "requests": counter() - before, "rc": r["rc"]}
        if r["rc"] != 0:
            out[name]["tail"] = r["out"][-400:]
    return out


def local_arm(src: Path, n: int, tmp: Path) -> dict:
    root = tmp / f"local-{n}" / EXP

    def put(rel: str, data: bytes) -> None:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    replicate(src, n, put)
    regimen("reindex", EXP, "--store", str(root.parent))
    return measure(str(root.parent), {}, lambda: 0)


def s3_arm(src: Path, n: int, tmp: Path, s3) -> dict:
    bucket = s3.make_bucket()
    fs = s3.client()
    prefix = f"{bucket}/r/{EXP}"
    replicate(src, n, lambda rel, data: fs.pipe_file(f"{prefix}/{rel}", data))
    env = {**s3.env(), "REGIMEN_CACHE": str(tmp / f"cache-{n}")}
    regimen("reindex", EXP, "--store", f"s3://{bucket}/r", extra_env=env)
    return measure(f"s3://{bucket}/r", env, s3.requests)


def nights(tmp: Path, count: int, keep: bool) -> dict:
    """`count` nights of the tiny recipe on new data each night: the bytes each adds, with or without store.keep."""
    store = tmp / ("keep" if keep else "nokeep")
    sizes = []
    for night in range(count):
        args = ["run", str(TINY), "--store", str(store), "--set", f"data.seed={night}"]
        if keep:
            args += ["--set", "store.keep.last=2"]
        regimen(*args, check=False)
        exp_dir = store / EXP
        sizes.append(  # what the night kept: versions and records, not the Trainer's work folders
            sum(
                p.stat().st_size
                for p in exp_dir.rglob("*")
                if p.is_file() and "work" not in p.relative_to(exp_dir).parts
            )
        )
    added = [b - a for a, b in zip([0, *sizes], sizes)]
    models = sum(1 for _ in (store / EXP).glob("*/v*/model"))
    return {"bytes_per_night": added, "total": sizes[-1], "model_versions_kept": models}


def projection(keep: dict, nokeep: dict, nights_: int = 30, model_gb: float = 1.2) -> dict:
    """A 0.6B-parameter model in bf16 (1.2 GB a copy): every night keeps its SFT and GRPO weights without retention;
    with `store.keep: {last: 2}` only what the policy and the champion's lineage keep (counted in the tiny nights)."""
    per_night = 2 * model_gb
    return {
        "without keep, GB after 30 nights": round(per_night * nights_, 1),
        "with keep last 2, GB after 30 nights": round(keep["model_versions_kept"] * model_gb, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--stores", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    ap.add_argument("--nights", type=int, default=3)
    args = ap.parse_args()
    header("store growth: status, identical rerun, a run adding one version, at N versions per stage")
    tmp = Path(scratch("regimen-bench-growth-"))
    src = source(tmp)
    rows = []
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    stamp = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "commit": commit,
    }
    for kind in args.stores:
        context = _weed(tmp) if kind == "s3" else None
        s3 = context.__enter__() if context else None
        try:
            for n in args.sizes:
                arm = s3_arm(src, n, tmp, s3) if s3 else local_arm(src, n, tmp)
                for name, m in arm.items():
                    rows.append({"store": kind, "versions": n, "arm": name, **m, **stamp})
                    print(table([rows[-1]], list(rows[-1])), flush=True)
        finally:
            if context:
                context.__exit__(None, None, None)
    for row in rows:
        base = next(
            r for r in rows if (r["store"], r["arm"], r["versions"]) == (row["store"], row["arm"], args.sizes[0])
        )
        row["wall_ratio"] = round(row["wall_s"] / base["wall_s"], 2) if base["wall_s"] else None
        row["requests_ratio"] = round(row["requests"] / base["requests"], 2) if base["requests"] else None
    kept, unkept = nights(tmp, args.nights, True), nights(tmp, args.nights, False)
    retention = {"kind": "retention", "with_keep": kept, "without_keep": unkept, **projection(kept, unkept), **stamp}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as fh:
        for row in [*rows, retention]:
            fh.write(json.dumps({k: v for k, v in row.items() if k != "tail"}) + "\n")
    print(table(rows, ["store", "versions", "arm", "wall_s", "wall_ratio", "requests", "requests_ratio", "rc"]))
    print(json.dumps(retention, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)


def _weed(tmp: Path):
    from s3_server import weed_server

    where = tmp / "weed"
    where.mkdir()
    return weed_server(where)


if __name__ == "__main__":
    main()
