"""Resumable training: Trainer checkpoints in the stage's work folder, torn ones skipped.

A checkpoint counts only once a marker file is written after the Trainer finished saving it, so a
process killed mid-write leaves a torn folder that is ignored (the previous checkpoint is used).
When the last good checkpoint is already at `max_steps`, `resume_from_checkpoint` would train one
extra step (measured): the stage is finished from that checkpoint's weights instead.

In a remote store (a bucket) each marked checkpoint is also uploaded by the main process, its marker
last, and pruned there as `save_total_limit` says (`store/work.py`); before a stage runs, a host whose
work folder has nothing as new as the bucket's newest complete checkpoint downloads it (`fetch_remote`),
so any host resumes where the last one stopped.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

from transformers import TrainerCallback, TrainerState

MARKER = "regimen_complete"
_CKPT = re.compile(r"^checkpoint-(\d+)$")


class MarkComplete(TrainerCallback):
    """Write the marker after each save (on_save runs once the checkpoint is fully written). Before a
    save, the checkpoint's folder must not be a link (planted in the work folder while training: the
    Trainer would write through it); after it, nothing in it may be one."""

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_symlink():
                from regimen.stages.core.errors import StoreError

                raise StoreError(
                    f"{ckpt} is a symbolic link inside the store; the store never writes through links it did not make "
                    f"(remove it)"
                )
        return control

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                from regimen.stages.store.files import check_tree_no_links

                check_tree_no_links(ckpt)
                (ckpt / MARKER).write_text(json.dumps({"step": state.global_step}))
                _push(Path(args.output_dir), ckpt, args.save_total_limit)
        return control


UPLOAD_TRIES = 3
_BEHIND: dict[str, str] = {}  # work folder -> the checkpoint whose upload failed (the bucket is behind this host)


def _push(work: Path, ckpt: Path, keep: int | None, *, pause=time.sleep) -> None:
    """Upload a marked checkpoint to the store's bucket (when the work folder is mirrored there), retried with
    backoff (1 s, 2 s). A failed upload is logged, never the training's failure: this host can still resume; others
    cannot until a later checkpoint reaches the bucket, which catches it up (resuming reads the newest complete
    checkpoint), and that is said too."""
    from regimen.stages.store import work as mirror

    say = logging.getLogger("regimen.training")
    for attempt in range(UPLOAD_TRIES):
        try:
            pushed = mirror.push(work, ckpt, MARKER, keep)
        except Exception as exc:  # noqa: BLE001 - training goes on; the checkpoint is kept locally
            if attempt + 1 < UPLOAD_TRIES:
                say.warning("upload of %s to the store failed (%s); retrying", ckpt.name, str(exc)[:160])
                pause(2**attempt)
                continue
            _BEHIND[str(work)] = ckpt.name
            say.error(
                "could not upload %s to the store after %d tries (%s); another host could not resume from it until a "
                "later checkpoint reaches the store",
                ckpt.name,
                UPLOAD_TRIES,
                str(exc)[:200],
            )
            return
        if pushed and (behind := _BEHIND.pop(str(work), None)):
            say.warning("the store caught up: %s is there (the upload of %s had failed)", ckpt.name, behind)
        return


def fetch_remote(output_dir: Path) -> int | None:
    """Before training: download the bucket's newest complete checkpoint when this work folder has none as
    new (a host that has never seen the run), checked against its digests. Returns its step, or None."""
    from regimen.stages.store import work as mirror

    last = last_checkpoint(output_dir)
    try:
        return mirror.pull(Path(output_dir), MARKER, last[0] if last else None)
    except Exception as exc:  # noqa: BLE001 - resuming from what this host has (or from the start) is still right
        logging.getLogger("regimen.training").warning(
            "could not fetch checkpoints from the store (%s); resuming from this host's own", str(exc)[:200]
        )
        return None


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


def train_resumable(trainer, output_dir: Path, max_steps: int, on_finished=None, restore=None) -> int:
    """Train to the end, resuming from the last good checkpoint. Returns the step resumed from (0 fresh).

    A checkpoint is the end of training when its step reaches `max_steps`, or, for epoch-based training
    (`max_steps: -1`), when its own `trainer_state.json` says so (`global_step >= max_steps` as the
    Trainer computed it from the epochs). Then its weights are loaded without training (`load_weights`;
    `resume_from_checkpoint` would train one extra step, measured), the Trainer's state is restored from
    the checkpoint's `trainer_state.json` (transformers' public `TrainerState.load_from_json`), and
    `on_finished(state)` lets callbacks see the restored log history (the guard re-reads its curves);
    `restore(path)` lets them reload what they saved in that checkpoint (the curriculum's state), since
    no `on_train_begin` runs then."""
    last = last_checkpoint(output_dir)
    if last is None:
        trainer.train()
        return 0
    step, path = last
    state = TrainerState.load_from_json(str(path / "trainer_state.json"))
    planned = max_steps if max_steps > 0 else int(state.max_steps or 0)
    if planned > 0 and step >= planned and load_weights(trainer, path):
        state.global_step = state.global_step or step
        state.max_steps = planned
        trainer.state = state
        if restore is not None:
            restore(path)
        if on_finished is not None:
            on_finished(trainer.state)
        return step
    trainer.train(resume_from_checkpoint=str(path))
    return step


def load_weights(trainer, checkpoint: Path) -> bool:
    """Load a checkpoint's weights into the trainer's model with public APIs: a PEFT adapter through
    peft's `set_peft_model_state_dict`, a whole model through transformers' `load_sharded_checkpoint` (an
    index of shards) or `load_state_dict` (one `model.safetensors`; tied weights are not saved, hence not
    strict). False when the checkpoint holds no such file (a sharded FSDP/DeepSpeed state): the caller
    then resumes through the Trainer, which trains one step more."""
    from safetensors.torch import load_file

    checkpoint = Path(checkpoint)
    model = trainer.accelerator.unwrap_model(trainer.model)
    try:
        from peft import PeftModel, set_peft_model_state_dict

        if isinstance(model, PeftModel):
            adapter = checkpoint / "adapter_model.safetensors"
            if not adapter.is_file():
                return False
            set_peft_model_state_dict(model, load_file(str(adapter)))
            return True
    except ImportError:
        pass
    if (checkpoint / "model.safetensors.index.json").is_file():
        from transformers.modeling_utils import load_sharded_checkpoint

        load_sharded_checkpoint(model, str(checkpoint), strict=False)
        return True
    weights = checkpoint / "model.safetensors"
    if not weights.is_file():
        return False
    missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
    if unexpected or any(k not in _tied(model) for k in missing):
        raise RuntimeError(f"{weights} does not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return True


def _tied(model) -> set[str]:
    """Parameter names that share their tensor with another parameter (not saved twice in a checkpoint)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        key = tensor.data_ptr()
        if key in seen:
            tied.update((name, seen[key]))
        else:
            seen[key] = name
    return tied
