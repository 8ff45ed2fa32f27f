"""What a bucket costs (issue 30, part of its benchmark): SeaweedFS on 127.0.0.1 (`tests/s3_server.py`).

1. **Wall ratio**: `regimen run RECIPE` with a local store against the same run with
   `--store s3://bucket/r`, alternated, a fresh experiment each time (`--rounds`, default 1), after one
   unmeasured warm-up run of `tests/tiny.yaml` (disk cache, imports). `--recipe configs/default.yaml` is the
   issue's aim (<= 1.15; ~5-6 min a run here); the default `tests/tiny.yaml` has short stages, so its ratio
   is an upper bound of the fixed cost a bucket adds per version (checks, uploads, downloads).
2. **Upload rate**: the store's checkpoint mirror (`stages/store/work.push`: a sha256 of every file, the
   upload, the marker last, the pruning listing) against a plain `s3fs.put` of the same folder, for a
   synthetic checkpoint of `--mb` MB (one model.safetensors of random bytes and the small files a Trainer
   writes beside it). Aim: the mirror at >= 0.8x the plain put.

3. **The nightly week on two hosts** (`--week`): `bench/nightly_week.py`'s eight nights, its store in the
   bucket, through `regimen pool setup` and two `prefect worker start --pool regimen --limit 1` processes
   as two hosts (their own HOME, PREFECT_HOME, REGIMEN_CACHE, TMPDIR and caches; they share only the
   bucket and the Prefect server), with the pool's real defaults (30 s heartbeats, a 120 s lease: a host is
   presumed lost after 150 s). On night 6 the host running the night's run is SIGKILLed, its whole process
   tree, once a GRPO checkpoint of that night is in the bucket; it is started again after that night (the
   host comes back the next day). Per night: which host ran it, the resumed step, the time from the kill to
   the run Running again and to the next checkpoint in the bucket (aim <= 5 min), and the champion's
   accuracy on the frozen held-out set.

    python bench/two_hosts.py [--rounds 1] [--mb 64] [--recipe configs/default.yaml] [--skip-upload] [--week]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import psutil  # noqa: E402
from common import header, regimen, scratch, table  # noqa: E402
from nightly_week import BIN, EXP, ROOT, Week, prepare, report, run_week, stop  # noqa: E402
from s3_server import weed_server  # noqa: E402


def wall_ratio(s3, rounds: int, recipe: str) -> list[dict]:
    local = Path(scratch("regimen-bench-local-"))
    bucket = s3.make_bucket()
    rows = []
    arms = [("local", str(local / "store")), ("s3", f"s3://{bucket}/r")]
    # not counted: the first run warms the disk cache
    regimen("run", "tests/tiny.yaml", "--store", str(local / "warm"), extra_env={"OMP_NUM_THREADS": "1"})
    for i in range(rounds):
        for where, store in arms if i % 2 == 0 else arms[::-1]:  # alternated: neither always goes first
            cache = scratch("regimen-bench-cache-")
            out = regimen(
                "run",
                recipe,
                "--store",
                store,
                "--experiment",
                f"bench{i}",
                extra_env={**s3.env(), "REGIMEN_CACHE": cache, "OMP_NUM_THREADS": "1"},
            )
            verdict = next((ln.strip() for ln in out["out"].splitlines() if "verdict" in ln.lower()), "")
            rows.append(
                {"round": i, "store": where, "wall_s": round(out["wall_s"], 1), "last verdict line": verdict[:80]}
            )
            print(f"round {i} {where}: {out['wall_s']:.1f} s", flush=True)
    return rows


def fake_checkpoint(work: Path, step: int, mb: int) -> Path:
    from regimen.stages.training.checkpoints import MARKER

    ckpt = work / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(os.urandom(mb << 20))
    for name, size in (
        ("optimizer.pt", 4096),
        ("scheduler.pt", 1024),
        ("rng_state.pth", 15000),
        ("training_args.bin", 6000),
    ):
        (ckpt / name).write_bytes(os.urandom(size))
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (ckpt / MARKER).write_text(json.dumps({"step": step}))
    return ckpt


def upload_rate(s3, mb: int, repeats: int = 6) -> list[dict]:
    import s3fs

    from regimen.stages.store import Store
    from regimen.stages.store import work as mirror
    from regimen.stages.training.checkpoints import MARKER

    for name, value in s3.env().items():
        os.environ[name] = value
    s3fs.S3FileSystem.clear_instance_cache()
    bucket = s3.make_bucket()
    work = Store(f"s3://{bucket}/r", cache_dir=scratch("regimen-bench-up-")).stage("bench", "grpo").work_dir("f" * 64)
    fs = s3.client()
    rows = []
    for i in range(repeats):
        ckpt = fake_checkpoint(work, 10 * (i + 1), mb)
        size = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file()) / 2**20
        timed = {}
        for arm in ("plain", "mirror") if i % 2 == 0 else ("mirror", "plain"):  # alternated: neither always goes first
            t0 = time.perf_counter()
            if arm == "plain":
                fs.put(str(ckpt), f"{bucket}/plain/{ckpt.name}", recursive=True)
            else:
                assert mirror.push(work, ckpt, MARKER, keep=2)
            timed[arm] = time.perf_counter() - t0
        plain, ours = timed["plain"], timed["mirror"]
        rows.append(
            {
                "try": i,
                "MB": round(size, 1),
                "plain put MB/s": round(size / plain, 1),
                "mirror MB/s": round(size / ours, 1),
                "ratio": round(plain / ours, 2),
            }
        )
        print(rows[-1], flush=True)
    return rows


# -- the nightly week on two hosts -------------------------------------------------------------------------


class TwoHostWeek(Week):
    """`nightly_week.Week` with its store in the bucket and two worker hosts instead of `regimen serve`."""

    def __init__(self, base: Path, s3):
        super().__init__(base)
        self.s3 = s3
        self.fs = s3.client()
        self.bucket = s3.make_bucket()
        self.url = ""
        self.store_url = f"s3://{self.bucket}/r"
        self.hosts: dict[str, subprocess.Popen] = {}
        self.kill_next = False
        self.killed: dict = {}
        self.ckpts_before: set[str] = set()

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(**self.s3.env(), **extra)

    def start(self) -> None:
        self.start_server()
        self.setup_pool()
        self.start_host("a")
        self.start_host("b")

    def killed_night(self, n: int, what: str) -> dict:
        """The host running the night's run is SIGKILLed once a GRPO checkpoint of it is in the bucket
        (`while_running`); it comes back the next day."""
        self.kill_next = True
        try:
            out = self.night(n, what)
        finally:
            self.kill_next = False
        if self.killed:
            self.start_host(self.killed["host"])
        return out

    def host_env(self, name: str) -> dict[str, str]:
        dirs = {k: self.base / "hosts" / name / k for k in ("home", "prefect", "cache", "tmp", "xdg", "hf")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        return self.env(
            HOME=str(dirs["home"]),
            PREFECT_HOME=str(dirs["prefect"]),
            REGIMEN_CACHE=str(dirs["cache"]),
            TMPDIR=str(dirs["tmp"]),
            XDG_CACHE_HOME=str(dirs["xdg"]),
            HF_DATASETS_CACHE=str(dirs["hf"]),
        )

    def setup_pool(self) -> None:
        r = subprocess.run(
            [
                str(BIN / "regimen"),
                "pool",
                "setup",
                "--store",
                self.store_url,
                "--config",
                str(self.configs / "week.yaml"),
                "--configs",
                str(self.configs),
                "--allow-unauthenticated-api",
            ],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
        )
        if r.returncode:
            raise RuntimeError(f"regimen pool setup: {r.stdout}{r.stderr}")
        print(r.stdout.strip(), flush=True)

    def start_host(self, name: str) -> None:
        log = open(self.base / f"worker-{name}.log", "ab")
        self.hosts[name] = subprocess.Popen(
            [str(BIN / "prefect"), "worker", "start", "--pool", "regimen", "--limit", "1", "--name", f"host-{name}"],
            cwd=ROOT,
            env=self.host_env(name),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def champion(self) -> dict:
        key = f"{self.bucket}/r/{EXP}/champion.json"
        return json.loads(self.fs.cat_file(key)) if self.fs.exists(key) else {"champion": None, "history": []}

    def manifests(self) -> set[str]:
        self.fs.invalidate_cache()
        return set(self.fs.glob(f"{self.bucket}/r/{EXP}/*/v*/manifest.json"))

    def read_json(self, name: str) -> dict:
        return json.loads(self.fs.cat_file(name))

    def checkpoints(self) -> set[str]:
        from regimen.stages.training.checkpoints import MARKER

        self.fs.invalidate_cache()
        return set(self.fs.glob("/".join([self.bucket, "r", EXP, "grpo", "work", "*", "checkpoint-*", MARKER])))

    @staticmethod
    def steps(keys) -> list[int]:
        return sorted(int(re.search(r"checkpoint-(\d+)/", k).group(1)) for k in keys)

    def tree(self, name: str) -> list:
        try:
            root = psutil.Process(self.hosts[name].pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def ended(
        self, run: dict
    ) -> bool:  # a lost host's run is Crashed (HostLost) until the automation schedules it again
        return super().ended(run) and run["state"].get("name") != "HostLost"

    def while_running(self, run: dict) -> None:
        k = self.killed
        if self.kill_next and not k:
            self.kill_when_checkpointed()
        elif (
            k
            and "running_again_s" not in k
            and run["state"]["type"] == "RUNNING"
            and run["state"].get("name") == "Running"
            and time.monotonic() - k["at"] > 5
        ):
            states = self.call("GET", "/flow_run_states/", params={"flow_run_id": run["id"]}).json()
            if any(st["name"] == "HostLost" for st in states):
                k["running_again_s"] = round(time.monotonic() - k["at"], 1)
                print(f"  Running again {k['running_again_s']} s after the kill", flush=True)
        elif k and "running_again_s" in k and "training_again_s" not in k:
            newer = [s for s in self.steps(self.checkpoints() - self.ckpts_before) if s > max(k["at_kill"])]
            if newer:
                k["training_again_s"] = round(time.monotonic() - k["at"], 1)
                print(f"  checkpoint {newer[0]} in the bucket {k['training_again_s']} s after the kill", flush=True)

    def kill_when_checkpointed(self) -> None:
        """Once a GRPO checkpoint of this night is in the bucket, SIGKILL the host running the night's run."""
        new = self.checkpoints() - self.ckpts_before
        lost = next((n for n in self.hosts if len(self.tree(n)) > 1), None) if new else None
        if lost is None:
            return
        procs = self.tree(lost)
        for p in procs:  # the host dies: its worker, the flow run and whatever they started, at once
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        self.killed.update(host=lost, at=time.monotonic(), at_kill=self.steps(new), processes=len(procs))
        print(
            f"  killed host {lost} ({len(procs)} processes) with GRPO checkpoints {self.killed['at_kill']} of this "
            f"night in the bucket",
            flush=True,
        )

    def night(self, n: int, what: str, config: str = "week.yaml", **env: str) -> dict:
        self.ckpts_before = self.checkpoints()
        out = super().night(n, what, config)
        ran = [
            h
            for h in sorted(self.hosts)
            if out["run_id"] in (self.base / f"worker-{h}.log").read_text(errors="replace")
        ]
        if self.killed.get("host") in ran:  # the killed host first
            ran.remove(self.killed["host"])
            ran.insert(0, self.killed["host"])
        out["hosts"] = " > ".join(ran)
        if self.kill_next:
            out.update(
                {
                    f"kill_{k}": v
                    for k, v in self.killed.items()
                    if k in ("at_kill", "running_again_s", "training_again_s")
                }
            )
        print(
            {k: out[k] for k in ("night", "state", "wall_s", "hosts", "resumed_from_step", "event", "champion_acc")},
            flush=True,
        )
        return out

    def person(self, *args: str) -> str:
        r = subprocess.run(
            [str(BIN / "regimen"), *args, "--store", self.store_url],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
        )
        if r.returncode:
            raise RuntimeError(f"regimen {' '.join(args)}: {r.stderr}")
        return r.stdout

    def close(self) -> None:
        for proc in self.hosts.values():
            stop(proc)
        super().close()


def week_on_two_hosts(s3) -> None:
    t0 = time.monotonic()
    week = prepare(TwoHostWeek(Path(scratch("regimen-bench-week2-")), s3))
    try:
        run_week(week)
        report(
            week,
            t0,
            cols=[
                "night",
                "what",
                "state",
                "wall_s",
                "hosts",
                "resumed_from_step",
                "kill_at_kill",
                "kill_running_again_s",
                "kill_training_again_s",
                "event",
                "challenger_acc",
                "champion",
                "champion_acc",
            ],
            title="the nightly week on two worker hosts and one bucket",
        )
        accs = [n["champion_acc"] for n in week.nights if n["night"] < 8 and n["champion_acc"] is not None]
        print(
            f"champion's frozen-set accuracy over nights 1-7 (before the person's rollback): {accs}; "
            f"{'never drops' if all(b >= a for a, b in zip(accs, accs[1:])) else 'DROPS'}"
        )
    finally:
        week.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument(
        "--recipe", default="tests/tiny.yaml", help="the recipe both arms run (configs/default.yaml: the issue's aim)"
    )
    parser.add_argument("--skip-runs", action="store_true", help="only the upload rate")
    parser.add_argument("--skip-upload", action="store_true", help="only the wall ratio")
    parser.add_argument(
        "--week", action="store_true", help="only the nightly week on two worker hosts, one killed mid-GRPO"
    )
    args = parser.parse_args()
    with weed_server(Path(scratch("regimen-bench-weed-"))) as s3:
        if args.week:
            return week_on_two_hosts(s3)
        if not args.skip_upload:
            header(f"upload: the store's checkpoint mirror vs a plain s3fs.put ({args.mb} MB checkpoint)")
            up = upload_rate(s3, args.mb)
            print(table(up, list(up[0])))
            print(f"median ratio (plain time / mirror time): {statistics.median(r['ratio'] for r in up):.2f}")
        if args.skip_runs:
            return
        header(f"wall: {args.recipe} with a local store vs a bucket")
        rows = wall_ratio(s3, args.rounds, args.recipe)
        print(table(rows, ["round", "store", "wall_s", "last verdict line"]))
        walls = {w: statistics.median(r["wall_s"] for r in rows if r["store"] == w) for w in ("local", "s3")}
        print(
            f"median wall: local {walls['local']:.1f} s, s3 {walls['s3']:.1f} s, ratio "
            f"{walls['s3'] / walls['local']:.2f}"
        )


if __name__ == "__main__":
    main()
