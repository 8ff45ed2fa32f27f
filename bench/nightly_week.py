"""A simulated week of nightly retraining, through a real Prefect server and `regimen serve`, on the tiny
addition task whose data grows night after night (a folder of daily JSONL partitions). Prints the week.

    python bench/nightly_week.py

Each night is a run of the `nightly` deployment created through the API, as its schedule would:

1. day 1's rows: the first run freezes the held-out set and its result is the first champion
2. day 2 added: a challenger trained from the champion on the grown data
3. no new data: the same training again, every stage reused, nothing promoted
4. day 3 added, poisoned (wrong answers): its challenger must not be promoted
5. the poisoned partition removed; the night's recipe trains a gameable reward: not promoted
6. day 4 added, and the serving process killed in the middle of GRPO
7. the same data: the next trigger resumes GRPO from its last checkpoint
8. after a person's `regimen rollback`, one more night on the same data: the rollback holds unless the
   challenger is better by the margin

The test `tests/test_nightly_week.py` runs the same week and asserts on it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
EXP = "week"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}

RECIPE = """\
experiment: week
model:
  name_or_path: tiny
  tiny: {hidden_size: 128, intermediate_size: 512, num_hidden_layers: 2, num_attention_heads: 4}
data: {task: jsonl, train_file: DATA, heldout_fraction: 0.2}
rewards:
  - {name: answer, weight: 1.0}
sft: {max_steps: 120, per_device_train_batch_size: 32, learning_rate: 2.0e-3, lr_scheduler_type: constant_with_warmup,
      warmup_steps: 5, save_steps: 40, logging_steps: 20}
dry_run: {num_prompts: 16, min_mean_reward: 0.0, max_mean_reward: 1.0, max_frac_zero_std: 1.0}
smoke: {max_steps: 2}
grpo: {max_steps: 40, per_device_train_batch_size: 32, num_generations: 8, learning_rate: 1.0e-4, beta: 0.04,
       max_completion_length: 4, save_steps: 10, logging_steps: 10}
probe: {steps: 20, prompts: 32}
eval: {batch_size: 128}
cycle: {max_cycles: 1, max_rounds: 1, target: 0.99}
promote: {min_gain: 0.02, confidence: 0.9}
"""
HACKABLE = RECIPE.replace(
    "  - {name: answer, weight: 1.0}", "  - {name: digits, weight: 1.0}\n  - {name: answer, weight: 0.0}"
)


def rows(day: int, n: int, *, poisoned: bool = False) -> list[dict[str, Any]]:
    rng = random.Random(day)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 30), rng.randint(0, 30)
        out.append({"prompt": f"Q: {a}+{b}=", "answer": str(a + b + (rng.randint(3, 9) if poisoned else 0))})
    return out


def write_day(data: Path, day: int, n: int, *, poisoned: bool = False) -> Path:
    folder = data / f"day={day}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(day, n, poisoned=poisoned)))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
            proc.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Week:
    base: Path
    url: str = ""
    server: subprocess.Popen | None = None
    serve: subprocess.Popen | None = None
    nights: list[dict[str, Any]] = field(default_factory=list)
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    @property
    def api(self) -> str:
        return f"{self.url}/api"

    @property
    def store(self) -> Path:
        return self.base / "store"

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def configs(self) -> Path:
        return self.base / "configs"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "REGIMEN_FAULT", "REGIMEN_KILL"))}
        env.update(
            PREFECT_API_URL=self.api,
            PREFECT_HOME=str(self.base / "home"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_RUNNER_POLL_FREQUENCY="1",
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            OMP_NUM_THREADS="1",
            REGIMEN_CACHE=str(self.base / "cache"),
        )
        env.update(extra)  # a host's own PREFECT_HOME, REGIMEN_CACHE, ... (bench/two_hosts.py) replace the defaults
        return env

    def start_server(self) -> None:
        (self.base / "home").mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(
            PREFECT_HOME=str(self.base / "home"),
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_UI_API_URL=f"{self.url}/api",
        )
        from regimen.flows.serving.server import start_server

        self.server, _ = start_server(port, env, self.base / "server.log")

    def start_serve(self, **env: str) -> None:
        before = {d["name"]: d["updated"] for d in self.deployments()}
        self.serve = subprocess.Popen(
            [
                str(BIN / "regimen"),
                "serve",
                str(self.configs / "week.yaml"),
                "--configs",
                str(self.configs),
                "--store",
                str(self.store),
            ],
            cwd=ROOT,
            env=self.env(**env),
            stdout=open(self.base / "serve.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def registered() -> bool:
            found = {d["name"]: d for d in self.deployments()}
            return all(
                n in found
                and found[n]["updated"] != before.get(n)
                and found[n]["entrypoint"] == "regimen.flows.pipeline.cycle.regimen_cycle"
                for n in ("on-demand", "nightly")
            )

        self._wait(registered, 120, "regimen serve")

    def start(self) -> None:
        self.start_server()
        self.start_serve()

    def killed_night(self, n: int, what: str) -> dict[str, Any]:
        """A night whose run dies mid-GRPO: the serving process killed by REGIMEN_KILL, then served again."""
        stop(self.serve)
        self.start_serve(REGIMEN_KILL="grpo@15")
        out = self.night(n, what)
        stop(self.serve)
        self.start_serve()
        return out

    def _wait(self, ok, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if ok():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{what} not ready after {timeout}s")

    def call(self, method: str, path: str, **kw) -> httpx.Response:
        """An API call, retried as Prefect's own client retries a busy server's 429/502/503 (SQLite under load)."""
        for attempt in range(6):
            r = self.http.request(method, f"{self.api}{path}", **kw)
            if r.status_code not in (429, 502, 503):
                return r
            time.sleep(0.5 * 2**attempt)
        return r

    def deployments(self) -> list[dict[str, Any]]:
        r = self.call("POST", "/deployments/filter", json={"flows": {"name": {"any_": ["regimen-cycle"]}}})
        r.raise_for_status()
        return r.json()

    def trigger(self, config: str = "week.yaml") -> dict[str, Any]:
        """A nightly run, created through the deployment as its schedule would; waits until it ends."""
        dep = next(d for d in self.deployments() if d["name"] == "nightly")
        r = self.call(
            "POST",
            f"/deployments/{dep['id']}/create_flow_run",
            json={"parameters": {"config": config, "experiment": EXP}},
        )
        r.raise_for_status()
        run_id = r.json()["id"]
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            run = self.call("GET", f"/flow_runs/{run_id}").json()
            if self.ended(run):
                return run
            self.while_running(run)
            time.sleep(0.5)
        raise RuntimeError(f"nightly run {run_id} did not end")

    def ended(self, run: dict[str, Any]) -> bool:
        return run["state"]["type"] in TERMINAL

    def while_running(self, run: dict[str, Any]) -> None:
        """Called about twice a second while a night's run has not ended (the two-host week kills a host here)."""

    def champion(self) -> dict[str, Any]:
        path = self.store / EXP / "champion.json"
        return json.loads(path.read_text()) if path.exists() else {"champion": None, "history": []}

    def manifests(self) -> set[str]:
        """Every version's manifest in the store, as '/'-separated names (`<exp>/<stage>/v<n>/manifest.json` last)."""
        return {p.as_posix() for p in self.store.glob(f"{EXP}/*/v*/manifest.json")}

    def read_json(self, name: str) -> dict[str, Any]:
        return json.loads(Path(name).read_text())

    def night(self, n: int, what: str, config: str = "week.yaml", **env: str) -> dict[str, Any]:
        before = len(self.champion()["history"])
        manifests_before = self.manifests()
        t0 = time.monotonic()
        run = self.trigger(config)
        wall = time.monotonic() - t0
        rec = self.champion()
        new = rec["history"][before:]
        line = new[-1] if new else {}
        written = [p for p in self.manifests() - manifests_before if p.split("/")[-3] not in ("data", "heldout")]
        resumed = [self.read_json(p).get("resumed_from_step") for p in written if p.split("/")[-3] == "grpo"]
        champ = rec.get("champion") or {}
        out = {
            "night": n,
            "what": what,
            "state": run["state"]["type"],
            "wall_s": round(wall, 1),
            "versions_written": len(written),
            "resumed_from_step": next((s for s in resumed if s), None),
            "event": line.get("event", "-"),
            "challenger": line.get("policy", "-"),
            "challenger_acc": line.get("heldout_accuracy"),
            "champion": champ.get("policy", "-"),
            "champion_acc": champ.get("heldout_accuracy"),
            "reason": line.get("reason", run["state"].get("message") or ""),
            "run_id": run["id"],
        }
        self.nights.append(out)
        return out

    def person(self, *args: str) -> str:
        r = subprocess.run(
            [str(BIN / "regimen"), *args, "--store", str(self.store)],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
        )
        if r.returncode:
            raise RuntimeError(f"regimen {' '.join(args)}: {r.stderr}")
        return r.stdout

    def events(self) -> list[dict[str, Any]]:
        r = self.call("POST", "/events/filter", json={"filter": {"event": {"prefix": ["regimen.model."]}}, "limit": 50})
        r.raise_for_status()
        return r.json().get("events", [])

    def close(self) -> None:
        for proc in (self.serve, self.server):
            if proc is not None:
                stop(proc)
        self.http.close()


def prepare(week: Week) -> Week:
    """The week's two recipes in its configs folder (the training data's folder written into them)."""
    week.configs.mkdir(parents=True)
    os.chmod(week.configs, 0o755)
    for name, text in (("week.yaml", RECIPE), ("week-hackable.yaml", HACKABLE)):
        (week.configs / name).write_text(text.replace("DATA", str(week.data)))
        os.chmod(week.configs / name, 0o644)
    return week


def run_week(week: Week) -> Week:
    """The eight nights (see the module doc) on a prepared week; `week.start` and `week.killed_night` say
    where the runs happen and how night 6 dies."""
    write_day(week.data, 1, 300)
    week.start()
    week.night(1, "day 1: 300 rows")
    write_day(week.data, 2, 300)
    week.night(2, "day 2 added (+300 rows)")
    week.night(3, "no new data")
    poison = write_day(week.data, 3, 900, poisoned=True)
    week.night(4, "day 3 added: 900 rows with wrong answers")
    shutil.rmtree(poison.parent)
    week.night(5, "poison removed; the recipe trains a gameable reward", config="week-hackable.yaml")
    write_day(week.data, 4, 300)
    week.killed_night(6, "day 4 added (+300 rows); killed mid-GRPO")
    week.night(7, "same data: the next trigger")
    week.rollback_output = week.person("rollback", EXP, "--reason", "a person prefers the earlier model")  # type: ignore[attr-defined]
    week.night(8, "after a person's rollback, same data")
    return week


def simulate(base: Path) -> Week:
    """The week through `regimen serve`; the caller closes it (its server stays up for the caller's checks)."""
    week = prepare(Week(base))
    try:
        return run_week(week)
    except BaseException:
        week.close()
        raise


COLUMNS = [
    "night",
    "what",
    "state",
    "wall_s",
    "versions_written",
    "resumed_from_step",
    "event",
    "challenger",
    "challenger_acc",
    "champion",
    "champion_acc",
]


def report(
    week: Week, t0: float, cols: list[str] = COLUMNS, title: str = "a simulated week of nightly retraining"
) -> None:
    widths = {c: max(len(c), *(len(str(n.get(c))) for n in week.nights)) for c in cols}
    print(
        f"# {title} ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, {time.monotonic() - t0:.0f} s in all)"
    )
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for n in week.nights:
        print("  ".join(str(n.get(c)).ljust(widths[c]) for c in cols))
    for n in week.nights:
        print(f"night {n['night']}: {n['reason']}")
    print(f"events: {[e['event'] for e in week.events()]}")


def main() -> None:
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="regimen-week-"))
    t0 = time.monotonic()
    week = simulate(base)
    try:
        report(week, t0)
    finally:
        week.close()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
