"""TRL's own config objects (`SFTConfig`, `GRPOConfig`) built from a recipe.

Regimen owns `output_dir` (the stage's work folder, where Trainer checkpoints live so a killed stage
resumes); everything else is the recipe's, over Regimen's defaults (`stages.config`).
"""

from __future__ import annotations

from typing import Any


def _device_settings(settings: dict[str, Any], num_processes: int) -> dict[str, Any]:
    import torch

    if "use_cpu" not in settings and not torch.cuda.is_available():
        settings["use_cpu"] = True
    if settings.get("use_cpu"):
        settings["bf16"] = False
    return settings


def sft_args(recipe, output_dir: str, **overrides: Any):
    from trl import SFTConfig

    settings = _device_settings({**recipe.sft_settings(), **overrides}, recipe.num_processes())
    return SFTConfig(output_dir=str(output_dir), **settings)


def grpo_args(recipe, output_dir: str, **overrides: Any):
    from trl import GRPOConfig

    settings = _device_settings({**recipe.grpo_settings(), **overrides}, recipe.num_processes())
    return GRPOConfig(output_dir=str(output_dir), **settings)
