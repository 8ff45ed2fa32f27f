"""Stage 1, sft: distillation-style SFT with `trl.SFTTrainer` on the teacher's traces
(prompt/completion rows, loss on the completion only), then the held-out accuracy of the result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stages import trajectories
from stages.data import data_identity, load_task
from stages.errors import StageStopped


def config_section(recipe) -> dict[str, Any]:
    section = {
        "model": recipe.model.model_dump(),
        "data": data_identity(recipe.data),
        "teacher": recipe.teacher.model_dump(),
        "sft": recipe.sft_settings(),
        "peft": recipe.peft,
        "eval": {"max_new_tokens": recipe.eval.max_new_tokens or recipe.grpo_settings().get("max_completion_length"), "metric": recipe.eval.metric},
    }
    if recipe.teacher.kind != "oracle":
        section["rewards"] = [r.model_dump() for r in recipe.rewards]
    return section


def run(recipe, inputs: dict[str, Any], dirs) -> Any:
    from datasets import Dataset
    from trl import SFTTrainer

    from stages.checkpoints import MarkComplete, train_resumable
    from stages.evaluate import heldout_eval
    from stages.model import load_model, load_tokenizer
    from stages.policy import peft_config, save_policy
    from stages.runner import StageOutput
    from stages.teacher import traces
    from stages.trl_args import sft_args

    policy = inputs["policy"]["model"]
    task = load_task(recipe.data)
    rows, counts = traces(recipe, task, cycle=int(inputs.get("cycle", 1)), policy_path=policy)
    if not rows:
        raise StageStopped("sft", f"the {recipe.teacher.kind} teacher produced no trace that clears teacher.min_reward={recipe.teacher.min_reward} "
                           f"({int(counts['traces_generated'])} generated); lower the threshold, sample more, or use a stronger teacher")
    tokenizer = load_tokenizer(policy)
    model = load_model(policy, dtype=recipe.model.dtype)
    args = sft_args(recipe, dirs.checkpoints)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         peft_config=peft_config(recipe), callbacks=[MarkComplete()])
    resumed = train_resumable(trainer, dirs.checkpoints, args.max_steps)
    model = save_policy(trainer, tokenizer, Path(dirs.out) / "model", merge=recipe.model.merge_lora)
    metrics, heldout_rows = heldout_eval(model, tokenizer, recipe, task, desc="held-out eval (after SFT)")
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    metrics.update(counts)
    metrics.update({"train_loss_last": losses[-1] if losses else float("nan"), "steps": float(trainer.state.global_step)})
    sample = [{"kind": "trace", "prompt": r["prompt"], "completion": r["completion"]} for r in rows[:10]]
    trajectories.write(dirs.out, sample + [{"kind": "heldout", **r} for r in heldout_rows[: recipe.eval.trajectories]])
    return StageOutput(metrics, extra={"resumed_from_step": resumed})
