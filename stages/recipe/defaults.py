"""Where a recipe's TRL values come from: the recipe, Regimen (a short list, each with its reason), or
TRL's own `SFTConfig` / `GRPOConfig` / `DistillationConfig` defaults (everything else).

Regimen's defaults are deliberately few. The values tuned for the embedded tiny model (learning rates,
step counts, 6-token completions) live in `configs/default.yaml` and the other tiny recipes, where a
reader sees them; a recipe that sets only `model` and `data` trains with TRL's defaults.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

from pydantic import TypeAdapter, ValidationError

REGIMEN_DEFAULTS: dict[str, dict[str, tuple[Any, str]]] = {
    "sft": {
        "ddp_find_unused_parameters": (False, "transformers' choice under DDP (True) costs an extra pass every step")
    },
    "grpo": {
        "beta": (0.04, "Regimen always trains GRPO with a KL penalty that limits drift (TRL's default 0.0 has none)"),
        "ddp_find_unused_parameters": (False, "transformers' choice under DDP (True) costs an extra pass every step"),
    },
    "distill": {
        "ddp_find_unused_parameters": (False, "transformers' choice under DDP (True) costs an extra pass every step")
    },
}

# Fields Regimen sets itself: a recipe value would be ignored, break the stage's file layout, or bypass
# the recipe's own source of truth (reward weights come from `rewards[].weight`, one place for every stage).
RESERVED = {"output_dir", "resume_from_checkpoint", "do_train", "do_eval", "overwrite_output_dir", "reward_weights"}

# What `regimen check` shows of TRL's defaults without --all: the fields a person tunes first.
KEY_FIELDS = {
    "sft": (
        "max_steps",
        "num_train_epochs",
        "learning_rate",
        "lr_scheduler_type",
        "warmup_steps",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "max_length",
        "completion_only_loss",
        "assistant_only_loss",
        "gradient_checkpointing",
        "bf16",
        "logging_steps",
        "save_steps",
        "seed",
        "report_to",
    ),
    "grpo": (
        "max_steps",
        "num_train_epochs",
        "learning_rate",
        "lr_scheduler_type",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "generation_batch_size",
        "steps_per_generation",
        "num_generations",
        "max_completion_length",
        "temperature",
        "top_p",
        "beta",
        "loss_type",
        "scale_rewards",
        "use_vllm",
        "gradient_checkpointing",
        "bf16",
        "logging_steps",
        "save_steps",
        "seed",
        "report_to",
    ),
    "distill": (
        "teacher_model_name_or_path",
        "max_steps",
        "num_train_epochs",
        "learning_rate",
        "lr_scheduler_type",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "max_completion_length",
        "temperature",
        "beta",
        "gradient_checkpointing",
        "bf16",
        "logging_steps",
        "save_steps",
        "seed",
        "report_to",
    ),
}


@functools.cache
def trl_class(section: str) -> type:
    if section == "sft":
        from trl.trainer.sft_config import SFTConfig

        return SFTConfig
    if section == "distill":
        from trl import DistillationConfig

        return DistillationConfig
    from trl.trainer.grpo_config import GRPOConfig

    return GRPOConfig


@functools.cache
def trl_fields(section: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(trl_class(section)) if f.init}


def trl_default(section: str, key: str) -> Any:
    f = trl_fields(section)[key]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


INT64 = 2**63
SEED_MAX = 2**32 - 1
# (low, high, low inclusive): the values a number may take, for TRL fields where TRL's own checks come too
# late (training fails after SFT and the dry run wrote versions) or not at all (a run that never ends).
BOUNDS: dict[str, tuple[float, float, bool]] = {
    "learning_rate": (0, 10, False),
    "beta": (0, 1e4, False),
    "temperature": (0, 100, False),
    "top_p": (0, 1, False),
    "top_k": (0, 1e9, True),
    "min_p": (0, 1, True),
    "repetition_penalty": (0, 100, False),
    "epsilon": (0, 100, True),
    "epsilon_high": (0, 100, True),
    "delta": (0, 1e6, False),
    "weight_decay": (0, 100, True),
    "max_grad_norm": (0, 1e9, True),
    "warmup_ratio": (0, 1, True),
    "warmup_steps": (0, 1e9, True),
    "seed": (0, SEED_MAX, True),
    "data_seed": (0, SEED_MAX, True),
    "max_steps": (-1, 1e9, True),
    "num_train_epochs": (0, 1e6, False),
    "per_device_train_batch_size": (1, 2**20, True),
    "per_device_eval_batch_size": (1, 2**20, True),
    "gradient_accumulation_steps": (1, 1e6, True),
    "num_generations": (2, 1e4, True),
    "max_completion_length": (1, 1e7, True),
    "max_length": (1, 1e7, True),
    "max_prompt_length": (1, 1e7, True),
    "save_steps": (0, 1e9, False),
    "logging_steps": (0, 1e9, False),
    "eval_steps": (0, 1e9, False),
    "save_total_limit": (2, 1e6, True),
    "steps_per_generation": (1, 1e6, True),
    "generation_batch_size": (1, 2**24, True),
    "num_iterations": (1, 1e4, True),
    "adam_beta1": (0, 1, True),
    "adam_beta2": (0, 1, True),
    "adam_epsilon": (0, 1, False),
}
"""Besides: every number is finite, every whole number fits in 64 bits, and the worker processes a run may
start (`dataset_num_proc`, `dataloader_num_workers`) fit in this machine's CPUs."""
PROCESSES = ("dataset_num_proc", "dataloader_num_workers")
WHY = {
    "beta": ": Regimen's GRPO stage always trains with a KL penalty that limits drift",
    "temperature": ": sampling at temperature 0 or below is not sampling (GRPO needs varied attempts)",
}


SECTION_BOUNDS: dict[tuple[str, str], tuple[float, float, bool]] = {
    ("distill", "beta"): (
        0,
        1,
        True,
    )  # the divergence itself: 0 forward KL, 1 reverse KL, 0.5 JSD (not GRPO's KL coefficient)
}
SECTION_WHY = {("distill", "beta"): ": distill.beta chooses the divergence (0 forward KL, 0.5 JSD, 1 reverse KL)"}


def check_number(section: str, key: str, value: Any) -> None:
    """A TRL number the door accepts (see BOUNDS); raises ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{section}.{key}: must be a finite number (got {value!r})")
    if isinstance(value, int) and not -INT64 <= value < INT64:
        raise ValueError(f"{section}.{key}: {value} does not fit in 64 bits")
    if key in PROCESSES:
        cpus = os.cpu_count() or 1
        if not 0 <= value <= cpus:
            raise ValueError(
                f"{section}.{key}: at most {cpus} (this machine's CPUs: a run stays inside its compute slot; got "
                f"{value})"
            )
    bounds = SECTION_BOUNDS.get((section, key)) or BOUNDS.get(key)
    if bounds:
        low, high, inclusive = bounds
        if not (low <= value if inclusive else low < value) or value > high:
            lower = f">= {low:g}" if inclusive else f"> {low:g}"
            why = SECTION_WHY.get((section, key), WHY.get(key, ""))
            raise ValueError(f"{section}.{key}: must be {lower} and <= {high:g} (got {value!r}){why}")


def coerce(
    section: str, values: dict[str, Any], fields: dict[str, dataclasses.Field], class_name: str
) -> dict[str, Any]:
    """Check names against the dataclass and values against its field types (YAML gives strings and ints)
    and the door's bounds (`check_number`)."""
    out = {}
    for key, value in values.items():
        if key in RESERVED:
            why = (
                "set each reward's weight in `rewards:` instead"
                if key == "reward_weights"
                else "checkpoints live in the stage's work folder"
            )
            raise ValueError(f"{section}.{key} is set by Regimen ({why})")
        if key not in fields:
            close = [n for n in fields if n.startswith(key[:4])][:5]
            hint = f"; did you mean one of {close}?" if close else ""
            raise ValueError(f"{section}.{key} is not a field of {class_name}{hint}")
        if key == "save_total_limit" and value is not None and value < 2:
            raise ValueError(
                f"{section}.save_total_limit must be at least 2 (or unset): with 1 the Trainer deletes the last good "
                f"checkpoint before the new one is known to be complete"
            )
        ftype = fields[key].type
        try:
            out[key] = TypeAdapter(ftype).validate_python(value) if not isinstance(ftype, str) else value
        except ValidationError as exc:
            if value is False:  # YAML reads a bare `no` as False; TRL's strategies spell it "no"
                try:
                    out[key] = TypeAdapter(ftype).validate_python("no")
                    continue
                except ValidationError:
                    pass
            msg = exc.errors()[0]["msg"]
            raise ValueError(f"{section}.{key}: {msg} (got {value!r})") from None
        except Exception:  # a type pydantic cannot build a validator for: let TRL judge it
            out[key] = value
        check_number(section, key, out[key])
    return out


def resolve_trl(section: str, given: dict[str, Any]) -> dict[str, Any]:
    """Regimen's defaults under the recipe's own (already coerced) values."""
    return {**{k: v for k, (v, _) in REGIMEN_DEFAULTS[section].items()}, **given}
