"""Entry point of one rank under `accelerate launch`: run the stage, global rank 0 reports its output.

`RANK` is the job's global rank under torchrun (machine after machine); `LOCAL_RANK` is the rank on this
machine and picks only the device. So with several machines exactly one process of the whole job, rank 0 on
machine_rank 0, writes the staging folder and the output; a machine's local rank 0 elsewhere writes nothing."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from regimen.stages import registry
from regimen.stages.core.contract import StageDirs
from regimen.stages.recipe import recipe_from_dict
from regimen.stages.run.launcher import die_with_parent, record_rank


def main(spec_path: str) -> None:
    die_with_parent()
    spec = json.loads(Path(spec_path).read_text())
    work = Path(spec["checkpoints"])
    rank = global_rank()
    record_rank(work, rank)

    # TRL's configs built now, before any Trainer: building one after the Accelerator exists resets its state
    recipe = recipe_from_dict(spec["recipe"], "launch spec", check_trl=True)
    out = Path(spec["out"]) if rank == 0 else work / f"rank{rank}-out"
    out.mkdir(parents=True, exist_ok=True)
    output = registry.get(spec["stage"]).run(recipe, spec["inputs"], StageDirs(out=out, checkpoints=work))
    if rank == 0:
        world, local = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
        output.extra["launch"] = {"launcher": "accelerate", "num_processes": world, "backend": _backend()}
        if local and world // local > 1:
            output.extra["launch"]["num_machines"] = world // local
        from regimen.stages.store import files

        files.write_text(work, work / "launch_output.json", json.dumps(asdict(output), default=str))
    _close_process_group()


def global_rank() -> int:
    """This process's rank in the whole job (torchrun's RANK), never the per-machine LOCAL_RANK."""
    return int(os.environ.get("RANK", "0"))


def _close_process_group() -> None:
    """Every rank leaves together and closes the process group before exit, as torch asks: a gloo group
    left open can abort a rank at interpreter exit ("terminate called without an active exception"),
    which fails a stage whose work is done."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _backend() -> str | None:
    """The process group's backend for the device this rank trains on. torch reports "undefined" for a
    group created without a backend (it then picks one per device, e.g. "cpu:gloo,cuda:nccl"), and so can
    accelerate's environment variable."""
    import torch
    import torch.distributed as dist

    env = os.environ.get("ACCELERATE_DISTRIBUTED_BACKEND")
    fallback = env if env and env != "undefined" else None
    try:  # a record for the manifest, asked after training: never worth failing the finished stage
        if not (dist.is_available() and dist.is_initialized()):
            return fallback
        backend = str(dist.get_backend())
        if backend != "undefined":
            return backend
        device = "cuda" if torch.cuda.is_available() else "cpu"
        per_device = dict(part.split(":", 1) for part in str(dist.get_backend_config()).split(",") if ":" in part)
        return per_device.get(device) or fallback
    except Exception:  # noqa: BLE001
        return fallback


if __name__ == "__main__":
    main(sys.argv[1])
