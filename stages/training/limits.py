"""An operator's ceilings on one run (`limits:` in a recipe; `regimen serve --max-...` sets them for every
run it serves, and a UI run cannot raise them): training stops with a named error when the run has used
more wall time than `limits.max_hours`, or its experiment folder holds more than `limits.max_disk_gb`.

Checked by a Trainer callback after every step (time) and every save (disk: checkpoints are what grows),
so the run stops within one step of the ceiling with its checkpoints intact (a rerun resumes). The steps
and checkpoint ceilings are checked earlier, at the door (`recipe/schema.py`) and when TRL's config is
built (`recipe/trl.py`). The wall time counts from this process's start (`psutil`): a served run is one
process, a CLI run too.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from transformers import TrainerCallback

from regimen.stages.core.errors import StageStopped


class LimitExceeded(StageStopped):
    """The run passed an operator's ceiling (wall time or disk): the stage stops (exit 1)."""


def _started() -> float:
    import psutil

    return psutil.Process().create_time()


def folder_bytes(root: Path) -> int:
    """Bytes of the regular files under `root` (links not followed: the store makes none)."""
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    return total


class RunLimits(TrainerCallback):
    """Stop training (raise LimitExceeded) past `max_hours` of the run or `max_disk_gb` in `root`. Over the disk
    limit, the recipe's retention (`store.keep`) runs first; training stops only when what it may remove is not
    enough, saying what it kept and why."""

    def __init__(self, stage: str, max_hours: float | None, max_disk_gb: float | None, root: Path, recipe=None):
        self.stage, self.max_hours, self.max_disk_gb, self.root = stage, max_hours, max_disk_gb, Path(root)
        self.started = _started()
        self.recipe = recipe

    def on_step_end(self, args, state, control, **kwargs):
        if self.max_hours is not None and (time.time() - self.started) > self.max_hours * 3600:
            raise LimitExceeded(
                self.stage,
                f"limits.max_hours: the run has used more than {self.max_hours:g} h of wall time (the operator's "
                f"limit); stopped at step {state.global_step}, checkpoints kept",
            )
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.max_disk_gb is not None:
            used = folder_bytes(self.root)
            if used > self.max_disk_gb * 1e9:
                kept = self._retain()
                used = folder_bytes(self.root)
                if used > self.max_disk_gb * 1e9:
                    raise LimitExceeded(
                        self.stage,
                        f"limits.max_disk_gb: {self.root} holds {used / 1e9:.4g} GB, more than the operator's limit of "
                        f"{self.max_disk_gb:g} GB; stopped at step {state.global_step}; {kept}",
                    )
        return control

    def _retain(self) -> str:
        """The recipe's retention, run now: what it kept and why (for the stop's message when it was not enough)."""
        keep = getattr(self.recipe, "keep", None)
        if keep is None:
            return "store.keep is not set, so nothing may be removed (set it, or run `regimen gc`)"
        from regimen.stages.store import Store
        from regimen.stages.store.retention import collect

        done = collect(
            Store(self.recipe.store), self.root.name, last=keep.last, days=keep.days, champions=keep.champions
        )
        kept = "; ".join(f"{reason}: {len(v)}" for reason, v in done["kept"].items())
        return f"store.keep removed {len(done['remove'])} version(s) ({done['freed'] / 1e9:.3g} GB) and kept {kept}"


def callbacks(recipe, checkpoints: Path) -> list[TrainerCallback]:
    """The callbacks that hold a stage to `recipe.limits` ([] when it sets none). The disk counted is the
    experiment's folder (three levels above a stage's work folder: experiment, then stage, then `work`,
    then the stage's key)."""
    limits = recipe.limits
    if limits.max_hours is None and limits.max_disk_gb is None:
        return []
    path = Path(checkpoints)
    stage, root = (path.parents[1].name, path.parents[2]) if len(path.parents) > 2 else ("training", path)
    return [RunLimits(stage, limits.max_hours, limits.max_disk_gb, root, recipe)]
