"""Stage 1, sft: distillation-style SFT with `trl.SFTTrainer` on the teacher's traces (prompt/completion
rows, loss on the completion only; conversations as prompt messages + an assistant turn, so TRL applies
the chat template and trains on the assistant turn only), then the held-out accuracy of the result."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from regimen.stages.core.contract import StageOutput
from regimen.stages.core.errors import StageStopped
from regimen.stages.recipe.trl import device_for, for_stage
from regimen.stages.rewards import identity as rewards_identity
from regimen.stages.tasks.registry import identity, load_task
from regimen.stages.training.heldout import heldout_eval, spread
from regimen.stages.training.model import load_model, load_tokenizer
from regimen.stages.training.policy import is_main_process, peft_config, save_policy
from regimen.stages.training.teacher import as_sft_rows, teacher_accuracy, traces

NAME = "sft"
ROLE = "teach"
TRAINS = True
KEY_METRICS = ("heldout_accuracy", "traces_kept", "train_loss_last")


def applies(recipe) -> bool:
    """SFT runs when the recipe has a teacher that writes traces (`teacher.kind` not none)."""
    return recipe.trains_sft()


def config_section(recipe) -> dict[str, Any]:
    section = {
        "model": recipe.model.model_dump(mode="json"),
        "data": identity(recipe.data),
        "teacher": recipe.teacher.model_dump(mode="json"),
        "sft": recipe.sft,
        "peft": recipe.peft,
        "eval": {"max_new_tokens": recipe.max_new_tokens(), "metric": recipe.eval.metric},
    }
    if recipe.teacher.kind not in ("oracle", "weak"):  # a model's (or its own) traces are kept by what the rewards pay
        section["rewards"] = rewards_identity(recipe.rewards)
    elif recipe.eval.metric != "exact_match":  # the traces are the task's: only the metric's reward measures SFT
        section["rewards"] = rewards_identity([s for s in recipe.rewards if s.key == recipe.eval.metric])
    if recipe.teacher.kind == "model" and Path(recipe.teacher.name_or_path).expanduser().is_dir():
        from regimen.stages.core.fingerprint import tree_digest

        section["teacher_sha256"] = tree_digest(Path(recipe.teacher.name_or_path).expanduser())
    return section


def oracle_traces(recipe) -> bool:
    """The traces are the task's own (oracle or weak teacher): no reward changes them, so SFT's identity holds only
    the metric's reward, and SFT measures only it (other rewards' held-out means belong to the evaluation)."""
    return recipe.teacher.kind in ("oracle", "weak")


def cached_traces(recipe, task, cycle: int, policy: str, work: Path) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The teacher's traces, made once: kept in the work folder (a resumed stage does not regenerate
    them), and under `accelerate launch` made by rank 0 while the other ranks wait, then read."""
    cache = work / f"traces-cycle{cycle}.json"
    context = contextlib.nullcontext()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        context = PartialState().main_process_first()
    from regimen.stages.store import files

    with context:
        if cache.is_file() and not cache.is_symlink():
            data = json.loads(files.read_text(work, cache))
            return data["rows"], data["counts"]
        rows, counts = traces(recipe, task, cycle=cycle, policy_path=policy)
        files.write_text(work, cache, json.dumps({"rows": rows, "counts": counts}))
    return rows, counts


def run(recipe, inputs: dict[str, Any], dirs) -> StageOutput:
    from datasets import Dataset
    from trl import SFTTrainer

    from regimen.stages.training import limits, progress, trajectories
    from regimen.stages.training.checkpoints import MarkComplete, train_resumable

    policy = inputs["policy"]["model"]
    task = load_task(recipe.data, inputs.get("heldout"))
    rows, counts = cached_traces(recipe, task, int(inputs.get("cycle", 1)), policy, Path(dirs.checkpoints))
    if not rows:
        raise StageStopped(
            "sft",
            f"the {recipe.teacher.kind} teacher produced no trace that clears "
            f"teacher.min_reward={recipe.teacher.min_reward} "
            f"({int(counts['traces_generated'])} generated); lower the threshold, sample more, or use a stronger "
            f"teacher",
        )
    tokenizer = load_tokenizer(policy)
    model = load_model(policy, dtype=recipe.model.dtype)
    # tool replies in a trace were not written by the model: the loss is on the assistant's turns only
    tools = recipe.environment is not None or any(
        isinstance(r["completion"], list) and any(m.get("role") == "tool" for m in r["completion"]) for r in rows
    )
    args = for_stage(recipe, "sft", dirs.checkpoints, **({"assistant_only_loss": True} if tools else {}))
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(as_sft_rows(rows)),
        processing_class=tokenizer,
        peft_config=peft_config(recipe),
        callbacks=[MarkComplete(), *limits.callbacks(recipe, dirs.checkpoints)],
    )
    progress.quiet(trainer, NAME, getattr(dirs, "progress", None))
    resumed = train_resumable(trainer, dirs.checkpoints, args.max_steps)
    model = save_policy(trainer, tokenizer, Path(dirs.out) / "model", merge=recipe.model.merge_lora)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    metrics: dict[str, float] = {
        **counts,
        "train_loss_last": losses[-1] if losses else float("nan"),
        "steps": float(trainer.state.global_step),
    }
    if not is_main_process(trainer):  # under accelerate launch, rank 0 measures; the others are done
        return StageOutput(metrics, extra={"resumed_from_step": resumed})
    model.to(device_for(recipe))
    heldout_metrics, heldout_rows = heldout_eval(  # with the task's teacher, only what SFT's identity holds
        model, tokenizer, recipe, task.heldout, desc="held-out eval (after SFT)", metric_only=oracle_traces(recipe)
    )
    metrics.update(heldout_metrics)
    if (acc := teacher_accuracy(recipe, task)) is not None:
        metrics["teacher_heldout_accuracy"] = acc
    sample = [{"kind": "trace", "prompt": r["prompt"], "completion": r["completion"]} for r in rows[:10]]

    shown = [heldout_rows[i] for i in spread(task.heldout, recipe.eval.trajectories)]
    trajectories.write(dirs.out, sample + [{"kind": "heldout", **r} for r in shown])
    return StageOutput(metrics, extra={"resumed_from_step": resumed})
