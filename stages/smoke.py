"""Stage 3, grpo-smoke: a few GRPO steps with the full recipe before the long run. It fails unless
some step shows reward variation (`reward_std > 0`), every loss is finite and some gradient is non-zero,
so a broken reward, a degenerate policy or a bad learning rate costs seconds, not the whole run."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

from regimen.stages.core.contract import StageOutput
from regimen.stages.training import trajectories

NAME = "grpo-smoke"
ROLE = "gate"
TRAINS = True
KEY_METRICS = ("mean_reward", "max_reward_std", "max_abs_loss")


def config_section(recipe) -> dict[str, Any]:
    from regimen.stages.training.grpo_trainer import config_section as shared

    return {**shared(recipe), "smoke": recipe.smoke.model_dump(mode="json")}


def verdict(logs: list[dict[str, Any]]) -> str | None:
    """Why the smoke test fails, or None when it passes."""
    steps = [h for h in logs if "loss" in h and "reward" in h]
    if not steps:
        return "no training step was logged"
    bad_loss = [h["step"] for h in steps if not math.isfinite(h["loss"])]
    if bad_loss:
        return f"the loss is not finite at step(s) {bad_loss}: lower grpo.learning_rate or check the model's dtype"
    if not any(h.get("reward_std", 0) > 0 for h in steps):
        return (
            f"no step among {len(steps)} showed any reward variation (reward_std = 0 throughout): every attempt scores "
            f"alike, "
            "so GRPO has nothing to learn from; check the reward on sample text (regimen reward-check), use larger "
            "groups or a higher temperature"
        )
    grads = [h.get("grad_norm") for h in steps if h.get("grad_norm") is not None]
    if grads and not any(g > 0 for g in grads):
        return (
            "every gradient was zero: the policy is not being updated (check the learning rate and that parameters "
            "are trainable)"
        )
    return None


def run(recipe, inputs: dict[str, Any], dirs) -> StageOutput:
    from regimen.stages.training.grpo_trainer import build_trainer

    policy = inputs["policy"]["model"]
    recorder = trajectories.Recorder(keep_first=recipe.smoke.max_steps, keep_last=0)
    scratch = Path(dirs.checkpoints) / "smoke"
    trainer, _ = build_trainer(
        recipe,
        policy,
        scratch,
        recorder,
        stage=NAME,
        heldout=inputs.get("heldout"),
        watch=getattr(dirs, "progress", None),
        max_steps=recipe.smoke.max_steps,
        logging_steps=1,
        save_strategy="no",
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    trajectories.write(dirs.out, recorder.rows())
    shutil.rmtree(scratch, ignore_errors=True)
    metrics = {
        "steps": float(len(logs)),
        "max_reward_std": max((h.get("reward_std", 0.0) for h in logs), default=0.0),
        "mean_reward": sum(h.get("reward", 0.0) for h in logs) / max(len(logs), 1),
        "max_abs_loss": max((abs(h["loss"]) for h in logs), default=math.nan),
        "max_grad_norm": max((h.get("grad_norm") or 0.0 for h in logs), default=0.0),
        "frac_reward_zero_std_mean": sum(h.get("frac_reward_zero_std", 0.0) for h in logs) / max(len(logs), 1),
    }
    reason = verdict(trainer.state.log_history)
    return StageOutput(
        metrics,
        status="failed" if reason else "completed",
        diagnosis=f"smoke test failed: {reason}" if reason else None,
    )
