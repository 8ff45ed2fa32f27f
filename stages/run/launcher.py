"""Training stages under `accelerate launch` (DDP, FSDP, DeepSpeed on GPUs; gloo ranks on CPU).

The same stage code runs in every rank (`python -m regimen.stages.run.launch_entry`); global rank 0 writes
the stage's files into the staging folder and its `StageOutput` as JSON into the work folder, and the
parent reads it back after the launch exits. Each rank dies with its parent (PR_SET_PDEATHSIG) and records
its pid, because torchrun gives ranks their own sessions and a SIGKILL to the launcher would leave them
running.

Several machines (`accelerate.num_machines` > 1): every machine launches the same stage with the same
recipe but its own `machine_rank`, and their ranks form one job (global ranks, machine after machine).
Only global rank 0, on machine_rank 0, writes: checkpoints, metrics, trajectories, the staging folder, the
output JSON. A machine of rank >= 1 lends its processes and nothing else: when its ranks have finished,
`run_with_accelerate` raises `LentToMachineZero` instead of returning an output, so its runner has
nothing to commit; the job's version is the one machine_rank 0 commits (into a store both reach, e.g. a
bucket, where the other machine then finds it by fingerprint).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from regimen.stages.core.contract import StageOutput
from regimen.stages.core.errors import RegimenError, StageStopped

log = logging.getLogger("regimen.launch")
PR_SET_PDEATHSIG = 1
_RANK_ERROR = re.compile(r"^(\[rank\d+\]:\s*)?[\w.]*(Error|Exception|Interrupt)\b.*:")


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to kill this process when its parent dies (no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass


def ranks_dir(work: Path) -> Path:
    """Where ranks record their pids: a private folder in this user's cache, never the (possibly shared)
    store, so nobody can plant a pid for us to kill. One folder per work folder."""
    base = Path(os.environ.get("REGIMEN_CACHE", Path.home() / ".cache" / "regimen")) / "ranks"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    d = base / hashlib.sha256(str(Path(work).resolve()).encode()).hexdigest()[:16]
    d.mkdir(exist_ok=True, mode=0o700)
    return d


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def record_rank(work: Path, rank: int) -> None:
    """A rank's pid and its start time (so a recycled pid is never mistaken for it)."""
    pid = os.getpid()
    (ranks_dir(work) / f"{rank}.pid").write_text(f"{pid} {_start_time(pid) or ''}")


class LentToMachineZero(RegimenError):
    """A machine of `accelerate.machine_rank` >= 1 ran its ranks of a stage to the end: the stage's version
    is machine_rank 0's (global rank 0 wrote it there), so this machine has nothing to commit. Not a
    failure of the stage: a runner that knows it records no failed attempt and commits nothing."""

    exit_code = 0

    def __init__(self, stage: str, machine_rank: int, num_machines: int, processes: int, main: str):
        super().__init__(
            f"{stage}: machine_rank {machine_rank} of {num_machines} ran its {processes} process(es) of the job to the "
            f"end; global rank 0 on machine_rank 0 ({main}) writes the stage's version: nothing is committed here"
        )
        self.stage, self.machine_rank = stage, machine_rank


def local_processes(recipe) -> int:
    """The processes `accelerate launch` starts on this machine (num_processes counts the whole job's)."""
    acc = recipe.accelerate
    return max(1, acc.num_processes // acc.num_machines)


def accelerate_command(recipe, spec: Path) -> list[str]:
    """`accelerate launch` for this recipe. Without a config file, `--multi_gpu` takes the torchrun path
    for any process count (with TRL's use_cpu on a CPU-only machine that means gloo ranks; `--cpu`
    would silently start one process). With several machines, `--num_processes` is the whole job's (as
    accelerate expects: each machine starts num_processes / num_machines) and the machines meet at machine
    0's address (static rendezvous, every machine given the same address and port)."""
    acc = recipe.accelerate
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if acc.config_file:
        cmd += ["--config_file", acc.config_file]
    elif acc.num_processes > 1:
        cmd += ["--multi_gpu"]
    # the recipe's, over a config file's
    cmd += [
        "--num_processes",
        str(acc.num_processes),
        "--main_process_port",
        str(acc.main_process_port),
        "--num_machines",
        str(acc.num_machines),
        "--machine_rank",
        str(acc.machine_rank),
    ]
    if acc.num_machines > 1:
        cmd += ["--main_process_ip", str(acc.main_process_ip)]
    cmd += list(acc.extra_args)
    return cmd + ["-m", "regimen.stages.run.launch_entry", str(spec)]


def run_with_accelerate(stage: str, recipe, inputs: dict[str, Any], dirs) -> Any:
    work = Path(dirs.checkpoints)
    spec = work / "launch.json"
    output = work / "launch_output.json"
    output.unlink(missing_ok=True)
    from regimen.stages.store import files

    files.write_text(
        work,
        spec,
        json.dumps(
            {
                "stage": stage,
                "recipe": recipe.model_dump(mode="json", by_alias=True),
                "inputs": inputs,
                "out": str(dirs.out),
                "checkpoints": str(work),
            },
            default=str,
        ),
    )
    acc = recipe.accelerate
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get(
            "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // local_processes(recipe)))
        ),
    }
    tail: collections.deque[str] = collections.deque(maxlen=15)
    rank_errors: list[str] = []
    proc = subprocess.Popen(
        accelerate_command(recipe, spec),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=die_with_parent,
        bufsize=1,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            if _RANK_ERROR.match(line) and len(rank_errors) < 4:
                rank_errors.append(line)
            print(line, file=sys.stderr, flush=True)  # the terminal sees what an in-process stage would show
            log.info("%s", line)  # Prefect's log (flows/ routes `regimen.*` loggers there)
        rc = proc.wait()
    except BaseException:
        _kill_group(proc)
        _kill_ranks(work)
        raise
    _kill_ranks(work)
    if rc == 0 and acc.machine_rank > 0:  # its ranks are done; global rank 0 wrote the version on machine 0
        raise LentToMachineZero(
            stage,
            acc.machine_rank,
            acc.num_machines,
            local_processes(recipe),
            f"{acc.main_process_ip}:{acc.main_process_port}",
        )
    if rc != 0 or not output.is_file() or output.is_symlink():
        cause = "".join(f"\n  {e}" for e in rank_errors)
        last = "\n".join(tail)
        where = f" on machine_rank {acc.machine_rank} of {acc.num_machines}" if acc.num_machines > 1 else ""
        raise StageStopped(
            stage,
            f"accelerate launch ({acc.num_processes} processes{where}) exited with code {rc}"
            + (f"; the ranks raised:{cause}" if cause else "")
            + f"\nlast lines:\n{last}",
        )
    data = json.loads(files.read_text(work, output))
    return StageOutput(data["metrics"], data["status"], data.get("diagnosis"), data.get("extra", {}))


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def _kill_ranks(work: Path) -> None:
    """Ranks that outlived their launcher (each recorded its pid and start time) are killed; a pid that
    now belongs to another process (a different start time) is left alone."""
    for pidfile in ranks_dir(work).glob("*.pid"):
        try:
            pid_text, _, started = pidfile.read_text().partition(" ")
            pid = int(pid_text)
            if started.strip() and _start_time(pid) == started.strip():
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, ValueError, OSError):
            pass
        pidfile.unlink(missing_ok=True)
