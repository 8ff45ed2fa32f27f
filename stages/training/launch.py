"""Training stages under `accelerate launch` (DDP, FSDP, DeepSpeed on GPUs; gloo ranks on CPU).

The same stage code runs in every rank (`python -m regimen.stages.training.launch_entry`); rank 0 writes the stage's
files into the staging folder and its `StageOutput` as JSON into the work folder, and the parent reads
it back after the launch exits. Each rank dies with its parent (PR_SET_PDEATHSIG) and records its pid,
because torchrun gives ranks their own sessions and a SIGKILL to the launcher would leave them running.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from regimen.stages.errors import StageStopped

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


def accelerate_command(recipe, spec: Path) -> list[str]:
    """`accelerate launch` for this recipe. Without a config file, `--multi_gpu` takes the torchrun path
    for any process count (with TRL's use_cpu on a CPU-only machine that means gloo ranks; `--cpu`
    would silently start one process)."""
    acc = recipe.accelerate
    cmd = [sys.executable, "-m", "accelerate.commands.launch"]
    if acc.config_file:
        cmd += ["--config_file", acc.config_file]
    elif acc.num_processes > 1:
        cmd += ["--multi_gpu"]
    cmd += ["--num_processes", str(acc.num_processes), "--main_process_port", str(acc.main_process_port), *acc.extra_args]
    return cmd + ["-m", "regimen.stages.training.launch_entry", str(spec)]


def run_with_accelerate(stage: str, recipe, inputs: dict[str, Any], dirs) -> Any:
    from regimen.stages.contract import StageOutput

    work = Path(dirs.checkpoints)
    spec = work / "launch.json"
    output = work / "launch_output.json"
    output.unlink(missing_ok=True)
    spec.write_text(json.dumps({"stage": stage, "recipe": recipe.model_dump(mode="json"), "inputs": inputs,
                                "out": str(dirs.out), "checkpoints": str(work)}, default=str))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // recipe.accelerate.num_processes)))}
    tail: collections.deque[str] = collections.deque(maxlen=15)
    rank_errors: list[str] = []
    proc = subprocess.Popen(accelerate_command(recipe, spec), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, preexec_fn=die_with_parent, bufsize=1)
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
    if rc != 0 or not output.exists():
        cause = "".join(f"\n  {e}" for e in rank_errors)
        last = "\n".join(tail)
        raise StageStopped(stage, f"accelerate launch ({recipe.accelerate.num_processes} processes) exited with code {rc}"
                                  + (f"; the ranks raised:{cause}" if cause else "") + f"\nlast lines:\n{last}")
    data = json.loads(output.read_text())
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
    """Ranks that outlived their launcher (each recorded its pid) are killed."""
    for pidfile in (work / "ranks").glob("*.pid"):
        try:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
        pidfile.unlink(missing_ok=True)
