"""What a run started from the Prefect UI or API may choose: an allow-list, chosen by the operator.

A deployment run accepts three parameters: `config` (a recipe under the project's `configs/` folder, by
name or relative path, never an arbitrary path), `experiment` (a name in the store) and `overrides`
(dotted recipe keys). Overrides are limited to training hyperparameters: `sft.*` and `grpo.*` fields of
TRL's configs whose values are numbers, booleans or fixed choices (never a path, a URL, a hub push, vLLM,
remote code or a logger), and the Regimen sections `dry_run.*`, `smoke.*`, `eval.*`, `cycle.*`,
`probe.*`. Everything that chooses code or places (`launcher`, `accelerate.*`, `rewards`, `model.*`,
`data.*`, `teacher.*`, `peft`, `store`) is refused with a message naming the key, unless the operator
widened the list when starting `serve` (`regimen serve --allow model.name_or_path`), or, for
`prefect deploy` deployments, in the `REGIMEN_UI_ALLOW` variable of `prefect.yaml`'s job variables.

The operator's choices reach the flow run through the environment of the process that serves it:
`REGIMEN_CONFIGS` (the folder recipes are chosen from), `REGIMEN_STORE` (the store) and `REGIMEN_UI_ALLOW`
(comma-separated key patterns added to the list). The CLI, run by the machine's own user, keeps its full
power and never goes through this module.
"""

from __future__ import annotations

import fnmatch
import os
import re
import typing
from pathlib import Path
from typing import Any

from regimen.stages.errors import InputError

SAFE_SECTIONS = ("dry_run", "smoke", "eval", "cycle", "probe")
TRL_SECTIONS = ("sft", "grpo")
# TRL fields that are numbers or switches but still reach out of the run: the network, the hub, other
# programs, or files.
_PLACE_OR_CODE = re.compile(r"(hub|push|vllm|remote|report|logging_dir|path|_dir$|file|url|deepspeed|fsdp|accelerator|compile|"
                            r"ddp_backend|backend|device|use_cpu|liger|kernel|tpu|xla|mps|ray|optuna|sagemaker|debug|tf32|jit|torchdynamo)")
_EXTRA_TRL: set[str] = set()


def _plain_type(annotation: Any) -> bool:
    """Numbers, booleans, fixed string choices (Literal or Enum), or Optional of those."""
    import enum

    if annotation in (int, float, bool):
        return True
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return True
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union)):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and all(_plain_type(a) for a in args)
    return False


def trl_hyperparameter(section: str, key: str) -> bool:
    from regimen.stages.recipe.defaults import trl_class, trl_fields

    if key in _EXTRA_TRL:
        return True
    if key not in trl_fields(section) or _PLACE_OR_CODE.search(key):
        return False
    try:
        hints = typing.get_type_hints(trl_class(section))
    except Exception:  # noqa: BLE001 - unresolvable annotations: refuse rather than guess
        return False
    return _plain_type(hints.get(key))


def widened() -> list[str]:
    return [p.strip() for p in os.environ.get("REGIMEN_UI_ALLOW", "").split(",") if p.strip()]


def check_overrides(overrides: Any, extra: list[str] | None = None) -> dict[str, Any]:
    """Refuse override keys outside the allow-list (naming the key); returns the overrides."""
    if overrides is None:
        return {}
    if not isinstance(overrides, dict):
        raise InputError(f"overrides: expected a mapping of dotted keys to values, got {type(overrides).__name__}")
    extra = widened() if extra is None else extra
    for key in overrides:
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*", key):
            raise InputError(f"overrides: {str(key)[:60]!r} is not a dotted recipe key")
        if any(fnmatch.fnmatchcase(key, pattern) or key == pattern for pattern in extra):
            continue
        section, _, field = key.partition(".")
        if section in SAFE_SECTIONS and field:
            continue
        if section in TRL_SECTIONS and field and "." not in field and trl_hyperparameter(section, field):
            continue
        raise InputError(f"overrides: {key!r} is not a UI parameter: it chooses code or places (allowed: training hyperparameters "
                         f"sft.*, grpo.*, {', '.join(s + '.*' for s in SAFE_SECTIONS)}); the operator can allow it with "
                         f"`regimen serve --allow {key}`")
    return overrides


def configs_dir() -> Path:
    return Path(os.environ.get("REGIMEN_CONFIGS", "configs")).resolve()


def resolve_config(config: Any) -> Path:
    """A recipe chosen by name (`default`, `default.yaml`) or relative path inside the configs folder."""
    root = configs_dir()
    if not isinstance(config, str) or not config.strip():
        raise InputError("config: give a recipe name from the project's configs folder, e.g. default.yaml")
    name = config.strip()
    if name.startswith("configs/"):
        name = name[len("configs/"):]
    if Path(name).is_absolute() or ".." in Path(name).parts or "\x00" in name:
        raise InputError(f"config {config!r}: choose a recipe inside the project's configs folder by name or relative path")
    if not name.endswith((".yaml", ".yml")):
        name += ".yaml"
    path = (root / name).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise InputError(f"config {config!r}: no such recipe in the project's configs folder")
    return path
