"""TRL's own config objects (`SFTConfig`, `GRPOConfig`) built from the resolved recipe, and the device
every stage computes on.

Regimen owns `output_dir` (the stage's work folder, where Trainer checkpoints live so a killed stage
resumes); everything else is the recipe's resolved section (`regimen.stages.recipe`).
"""

from __future__ import annotations

import os
from typing import Any


def accelerator() -> str | None:
    """'cuda' or 'mps' when this machine has one, else None."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return None


def device_for(recipe) -> str:
    """Where the Trainer runs, so that generation outside TRL (dry run, evaluation, teacher, probe) runs
    there too: this process's CUDA device, MPS, or the CPU (also when the recipe sets `use_cpu`)."""
    if recipe.grpo.get("use_cpu") or recipe.sft.get("use_cpu"):
        return "cpu"
    kind = accelerator()
    if kind == "cuda":
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return kind or "cpu"


def _device_settings(settings: dict[str, Any]) -> dict[str, Any]:
    if "use_cpu" not in settings and accelerator() is None:
        settings["use_cpu"] = True
    if settings.get("use_cpu"):
        settings["bf16"] = False
    return settings


def sft_args(recipe, output_dir: str, **overrides: Any):
    from trl import SFTConfig

    return SFTConfig(output_dir=str(output_dir), **_device_settings({**recipe.sft, **overrides}))


def grpo_args(recipe, output_dir: str, **overrides: Any):
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(output_dir), **_device_settings({**recipe.grpo, **overrides}))
