"""TRL's own config objects (`SFTConfig`, `GRPOConfig`), built once from the resolved recipe, and the device
every stage computes on.

`config(recipe, "sft" | "grpo")` is *the* config of a recipe: built once per process from the resolved
section (TRL's own `__post_init__` validation runs then, at the door), read by `regimen check` to show what
training will use, and handed to the trainers by `for_stage`, which copies it with the stage's work folder
as `output_dir` (where Trainer checkpoints live, so a killed stage resumes) and nothing else changed. What
Regimen sets beyond the recipe's section is set here, where `regimen check` sees it on the object: the
device (`use_cpu` and no `bf16` on a machine without CUDA or MPS), the reward weights (`rewards[].weight`,
one place for every stage) and `model_init_kwargs` (`model.dtype`).

A stage that runs with other settings (the smoke test's few steps) asks `for_stage(..., **changes)`: a new
object built the same way with those fields changed, validated by TRL again.

Built objects are cached by the values they are built from, so every stage of a run, `regimen check` and
the recipe's own checks share one object per section.
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from typing import Any

from regimen.stages.recipe.defaults import trl_class

PLACEHOLDER_DIR = "regimen-stage-work-folder"
"""`output_dir` of the shared object; `for_stage` replaces it with the stage's work folder."""
BUILT_BY_REGIMEN = {
    "use_cpu": "no CUDA or MPS on this machine",
    "bf16": "training on the CPU",
    "reward_weights": "from rewards[].weight",
    "model_init_kwargs": "from model.dtype",
    "teacher_model_name_or_path": "Regimen loads the teacher itself (a folder, a hub id, or champion:<experiment> "
    "resolved in the store)",
}
"""Fields this module sets beyond the recipe's section, and why (`regimen check` prints the reasons)."""


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


def settings(recipe, section: str) -> dict[str, Any]:
    """The keyword arguments the section's config is built from: the recipe's resolved section plus what
    Regimen sets (see BUILT_BY_REGIMEN)."""
    values = dict(getattr(recipe, section))
    if "use_cpu" not in values and accelerator() is None:
        values["use_cpu"] = True
    if values.get("use_cpu"):
        values["bf16"] = False
    if section == "distill":
        values.pop("teacher_model_name_or_path", None)  # the stage hands TRL the loaded teacher (see BUILT_BY_REGIMEN)
    if section == "grpo":
        values["reward_weights"] = [spec.weight for spec in recipe.rewards]
        if recipe.model.dtype != "float32":
            values.setdefault("model_init_kwargs", {"dtype": recipe.model.dtype})
    return values


def config(recipe, section: str):
    """The recipe's `SFTConfig` (section "sft"), `GRPOConfig` ("grpo") or `DistillationConfig` ("distill"): built once,
    shared, not to be changed (use `for_stage`). Raises TRL's own ValueError/TypeError for settings TRL rejects."""
    values = settings(recipe, section)
    key = (section, _world(recipe, section), json.dumps(values, sort_keys=True, default=repr))
    if key not in _BUILT:
        if len(_BUILT) >= 32:
            _BUILT.pop(next(iter(_BUILT)))
        _BUILT[key] = _construct(section, values, _world(recipe, section))
    return _BUILT[key]


def for_stage(recipe, section: str, output_dir, **changes: Any):
    """The section's config for one stage: a copy of `config(...)` writing to `output_dir`; with
    `changes`, a config built with those fields changed (TRL validates it again)."""
    if changes or _world(recipe, section) > 1:
        # Under `accelerate launch` this runs in each rank, where TRL's class knows the real world size:
        # built from TRL's own class (the shared object's class answers the world size for the parent).
        built = _construct(section, {**settings(recipe, section), **changes})
    else:
        built = copy.copy(config(recipe, section))
    built.output_dir = str(output_dir)
    for key, (value, _) in stage_time(recipe, section, built).items():
        setattr(built, key, value)
    return built


def stage_time(recipe, section: str, built=None, *, streams: bool = False) -> dict[str, tuple[Any, str]]:
    """What Regimen sets on a stage's config when the trainer is built, beyond `settings`: {field: (value, why)}. The
    stages apply it (`for_stage`; the GRPO trainer's builder with `streams`), `regimen check` prints it. `streams`:
    GRPO's prompts come from a stream (a curriculum or the screen, `training/sampler.py`)."""
    built = config(recipe, section) if built is None else built
    out: dict[str, tuple[Any, str]] = {}
    cap = recipe.limits.max_checkpoints  # the operator's ceiling (the door refused a recipe asking for more)
    if cap is not None and (built.save_total_limit is None or built.save_total_limit > cap):
        out["save_total_limit"] = (cap, "limits.max_checkpoints, the operator's ceiling")
    elif cap is None and built.save_total_limit is None:  # as serve caps them: a plain run keeps 5 too, not every one
        out["save_total_limit"] = (DEFAULT_CHECKPOINTS, "a training stage keeps 5 checkpoints unless told (TRL: all)")
    if section == "grpo" and streams:
        why = "the curriculum's (or the screen's) stream is read in order and its own state resumes it"
        out["shuffle_dataset"], out["ignore_data_skip"] = (False, why), (True, why)
    if section == "grpo" and recipe.environment is not None:
        out["max_tool_calling_iterations"] = (recipe.environment.max_turns, "from environment.max_turns")
    return out


DEFAULT_CHECKPOINTS = 5
"""Checkpoints a training stage keeps when neither the recipe (save_total_limit) nor the operator (limits) says."""


class Rejected(ValueError):
    """TRL refused a section's settings; `fields` are the recipe keys whose values it refused."""

    def __init__(self, section: str, fields: list[str], message: str):
        named = ", ".join(f"{section}.{f}" for f in fields) or section
        super().__init__(f"{named}: TRL rejects {'this setting' if len(fields) == 1 else 'these settings'}: {message}")
        self.section, self.fields = section, fields


def check(recipe) -> None:
    """Build the recipe's configs (TRL's validation runs); raise `Rejected` naming the fields TRL refused."""
    for section in ("sft", "grpo", *(("distill",) if getattr(recipe, "distill", None) is not None else ())):
        try:
            config(recipe, section)
        except (ValueError, TypeError) as exc:
            world = _world(recipe, section)
            where = f" (with {world} processes under launcher: accelerate)" if world > 1 else ""
            raise Rejected(
                section, _culprits(section, settings(recipe, section), getattr(recipe, section), world), f"{exc}{where}"
            ) from None


def _culprits(section: str, values: dict[str, Any], given: dict[str, Any], world: int) -> list[str]:
    """The recipe's keys without which TRL accepts the section (each tried alone, then all together)."""

    def accepted(without: set[str]) -> bool:
        try:
            _construct(section, {k: v for k, v in values.items() if k not in without}, world)
            return True
        except (ValueError, TypeError):
            return False

    keys = [k for k in given if k in values]
    found = [k for k in keys if accepted({k})]
    return found or (keys if keys and accepted(set(keys)) else [])


_BUILT: dict[tuple[str, int, str], Any] = {}


def _world(recipe, section: str) -> int:
    """The processes one training of this section runs on (`accelerate.num_processes` under `launcher:
    accelerate`, else 1)."""
    return recipe.num_processes()


def _construct(section: str, values: dict[str, Any], world: int = 1):
    """TRL's config class built from `values`. TRL validates a GRPO batch against the world size of the
    process that builds the config; a recipe that trains on N processes is built and validated here as
    each of its N ranks will build it: the class's public `world_size` property answers N."""
    cls = trl_class(section)
    if world > 1:
        cls = type(cls.__name__, (cls,), {"world_size": property(lambda self: world), "__module__": cls.__module__})
    with warnings.catch_warnings():  # TRL and transformers announce their own deprecations at construction
        warnings.simplefilter("ignore", FutureWarning)
        return cls(output_dir=PLACEHOLDER_DIR, **values)
