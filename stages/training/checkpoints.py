"""Resumable training: Trainer checkpoints in the stage's work folder, torn ones skipped.

A checkpoint counts only once a marker file is written after the Trainer finished saving it, so a
process killed mid-write leaves a torn folder that is ignored (the previous checkpoint is used).
When the last good checkpoint is already at `max_steps`, `resume_from_checkpoint` would train one
extra step (measured): the stage is finished from that checkpoint's weights instead.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from transformers import TrainerCallback

MARKER = "regimen_complete"
_CKPT = re.compile(r"^checkpoint-(\d+)$")


class MarkComplete(TrainerCallback):
    """Write the marker after each save (on_save runs once the checkpoint is fully written)."""

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                (ckpt / MARKER).write_text(json.dumps({"step": state.global_step}))
        return control


def complete_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """Good checkpoints, oldest first."""
    found = []
    for p in Path(output_dir).glob("checkpoint-*"):
        m = _CKPT.match(p.name)
        if m and (p / MARKER).is_file() and (p / "trainer_state.json").is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def last_checkpoint(output_dir: Path) -> tuple[int, Path] | None:
    found = complete_checkpoints(output_dir)
    return found[-1] if found else None


def train_resumable(trainer, output_dir: Path, max_steps: int, on_finished=None) -> int:
    """Train to the end, resuming from the last good checkpoint. Returns the step resumed from (0 fresh).

    A checkpoint is the end of training when its step reaches `max_steps`, or, for epoch-based training
    (`max_steps: -1`), when its own `trainer_state.json` says so (`global_step >= max_steps` as the
    Trainer computed it from the epochs).
    Then its weights are loaded without training (`Trainer._load_from_checkpoint`: a private method, the
    one the Trainer itself uses to resume; `resume_from_checkpoint` would train one extra step), and
    `on_finished(state)` lets callbacks see the restored log history (the guard re-reads its curves)."""
    last = last_checkpoint(output_dir)
    if last is None:
        trainer.train()
        return 0
    step, path = last
    state = json.loads((path / "trainer_state.json").read_text())
    planned = max_steps if max_steps > 0 else int(state.get("max_steps") or 0)
    if planned > 0 and step >= planned:
        trainer._load_from_checkpoint(str(path))
        trainer.state.global_step = state.get("global_step", step)
        trainer.state.max_steps = planned
        trainer.state.log_history = state.get("log_history", [])
        if on_finished is not None:
            on_finished(trainer.state)
        return step
    trainer.train(resume_from_checkpoint=str(path))
    return step
