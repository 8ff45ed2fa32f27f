"""What a run started from the Prefect UI or API may choose: an allow-list, chosen by the operator.

A deployment run accepts three parameters: `config` (a recipe under the project's `configs/` folder, by
name or relative path, never an arbitrary path), `experiment` (a name in the store) and `overrides`
(dotted recipe keys). Overrides are limited to training hyperparameters: `sft.*`, `grpo.*` and `distill.*` fields of
TRL's configs whose values are numbers, booleans or fixed choices (never a path, a URL, a hub push, vLLM,
remote code or a logger), and the Regimen sections `dry_run.*`, `smoke.*`, `eval.*`, `cycle.*`,
`probe.*`, `curriculum.*`. Everything that chooses code or places (`launcher`, `accelerate.*`, `rewards`,
`environment.*`, `model.*`, `data.*`, `teacher.*`, `peft`, `store`), and the operator's own policy
(`promote.*`, `limits.*`, the reward-hacking guard's `cycle.guard.*`) is refused with a message naming the key, unless
the operator widened the list when starting `serve` (`regimen serve --allow model.name_or_path`), or, for `prefect
deploy` deployments, in the `REGIMEN_UI_ALLOW` variable of `prefect.yaml`'s job variables.

The operator's choices reach the flow run through the environment of the process that serves it:
`REGIMEN_CONFIGS` (the folder recipes are chosen from), `REGIMEN_STORE` (the store) and `REGIMEN_UI_ALLOW`
(comma-separated key patterns added to the list). The CLI, run by the machine's own user, keeps its full
power and never goes through this module.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import json
import os
import re
import stat
import typing
from pathlib import Path
from typing import Any

from regimen.stages.core.errors import InputError
from regimen.stages.recipe.defaults import trl_class, trl_fields

REFUSED = "Refused"
"""The name of a refused run's state (a Failed state: the UI shows it; the failure hooks and the pool's automation
read it as data, never the message's text)."""

SAFE_SECTIONS = ("dry_run", "smoke", "eval", "cycle", "probe", "curriculum")
OPERATOR_POLICY_IN_SAFE_SECTIONS = ("cycle.guard.",)
"""Keys inside a safe section that are the operator's policy all the same: the guard's action and thresholds."""
TRL_SECTIONS = ("sft", "grpo", "distill")
# TRL fields that are numbers or switches but still reach out of the run: the network, the hub, other
# programs, or files.
_PLACE_OR_CODE = re.compile(
    r"(hub|push|vllm|remote|report|logging_dir|path|_dir$|file|url|deepspeed|fsdp|accelerator|compile|"
    r"ddp_backend|backend|device|use_cpu|liger|kernel|tpu|xla|mps|ray|optuna|sagemaker|debug|tf32|jit|torchdynamo)"
)
_EXTRA_TRL: set[str] = set()


def _plain_type(annotation: Any) -> bool:
    """Numbers, booleans, fixed string choices (Literal or Enum), or Optional of those."""
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
        if key == "cycle.guard" or key.startswith(OPERATOR_POLICY_IN_SAFE_SECTIONS):
            raise InputError(
                f"overrides: {key!r} is not a UI parameter: the reward-hacking guard's action and thresholds are the "
                f"operator's "
                f"policy (like promote.* and limits.*); the operator can allow it with `regimen serve --allow {key}`"
            )
        if section in SAFE_SECTIONS and field:
            continue
        if section in TRL_SECTIONS and field and "." not in field and trl_hyperparameter(section, field):
            continue
        raise InputError(
            f"overrides: {key!r} is not a UI parameter: it chooses code or places (allowed: training hyperparameters "
            f"sft.*, grpo.*, distill.*, {', '.join(s + '.*' for s in SAFE_SECTIONS)}); the operator can allow it with "
            f"`regimen serve --allow {key}`"
        )
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
        name = name[len("configs/") :]
    if Path(name).is_absolute() or ".." in Path(name).parts or "\x00" in name:
        raise InputError(
            f"config {config!r}: choose a recipe inside the project's configs folder by name or relative path"
        )
    if not name.endswith((".yaml", ".yml")):
        name += ".yaml"
    path = (root / name).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise InputError(f"config {config!r}: no such recipe in the project's configs folder")
    check_owner_only(path)
    return path


def check_owner_only(path: Path) -> None:
    """A recipe chooses code and places: one that other users can write is refused (exit 2)."""
    if path.stat().st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise InputError(
            f"config {path.name}: {path} is writable by other users (mode {stat.S_IMODE(path.stat().st_mode):o}); "
            "a recipe chooses code and places, so only its owner may write it (chmod go-w)"
        )


LIMIT_FLAGS = {
    "max_steps": "--max-steps",
    "max_checkpoints": "--max-checkpoints",
    "max_hours": "--max-hours",
    "max_disk_gb": "--max-disk-gb",
}
DEFAULT_LIMITS = {"max_steps": 100_000, "max_checkpoints": 5, "max_hours": 24.0, "max_disk_gb": 50.0}
"""What `regimen serve` holds UI runs to unless the operator says otherwise (0 lifts one)."""


def operator_limits() -> dict[str, Any]:
    """The operator's ceilings for this served run, as recipe overrides (`limits.*`, which UI parameters
    cannot set); {} outside `regimen serve`."""
    raw = os.environ.get("REGIMEN_UI_LIMITS")
    if not raw:
        return {}
    return {f"limits.{k}": v for k, v in json.loads(raw).items() if v}


# ---------------------------------------------------------------------------------------------
# The deployment record: what `regimen serve` registered is what its runs run


GUARDED = (
    "entrypoint",
    "path",
    "pull_steps",
    "job_variables",
    "parameter_openapi_schema",
    "enforce_parameter_schema",
    "parameters",
    "work_pool_name",
    "work_queue_name",
    "storage_document_id",
    "infrastructure_document_id",
    "global_concurrency_limit",
    "concurrency_options",
)
"""The fields of a deployment record that choose code, places, defaults or how many runs share the
device (the concurrency limit and its collision strategy: 1, ENQUEUE): what serve registered is what its
runs check the record against (`check_deployment`). Not the schedules' on/off state: pausing is a
person's right in the UI. The concurrency limit lives in the deployment's global concurrency limit (the
deprecated `concurrency_limit` field reads None): its limit, on/off state, decay and identity are
digested, not the slots in use."""
_LIMIT_FIELDS = ("id", "name", "limit", "active", "slot_decay_per_second")


def record_digest(deployment: Any) -> tuple[str, dict[str, str]]:
    """A digest of the guarded fields of a deployment record (an API object or a mapping), and each field's."""
    data = dict(deployment if isinstance(deployment, dict) else deployment.model_dump(mode="json"))
    if isinstance(data.get("global_concurrency_limit"), dict):
        data["global_concurrency_limit"] = {k: data["global_concurrency_limit"].get(k) for k in _LIMIT_FIELDS}
    fields = {
        k: hashlib.sha256(json.dumps(data.get(k), sort_keys=True, default=str).encode()).hexdigest() for k in GUARDED
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest(), fields


NOT_GIVEN = object()


def check_deployment(deployment_id: Any = NOT_GIVEN) -> str | None:
    """In a run of a served deployment: why the run is refused (its deployment's record differs from what
    `regimen serve` registered: the names of the changed fields), or None. Runs started otherwise (the
    CLI, a work pool's worker) are not checked here. `deployment_id`: the run's (default: the current
    flow run's)."""
    registered = os.environ.get("REGIMEN_DEPLOYMENTS")
    if not registered:
        return None
    from prefect import get_client
    from prefect.context import FlowRunContext

    if deployment_id is NOT_GIVEN:
        ctx = FlowRunContext.get()
        deployment_id = ctx.flow_run.deployment_id if ctx is not None and ctx.flow_run is not None else None
    digests = json.loads(registered)
    if not deployment_id:  # serve's processes run only its deployments' runs: one it cannot place is refused
        return "this run names no deployment, in a process `regimen serve` started for its deployments"
    if str(deployment_id) not in digests:
        return f"deployment {deployment_id} is not one `regimen serve` registered"
    with get_client(sync_client=True) as client:
        record = client.read_deployment(deployment_id)
    digest, fields = record_digest(record)
    if digest == digests[str(deployment_id)]:
        return None
    known = json.loads(os.environ.get("REGIMEN_DEPLOYMENT_FIELDS", "{}")).get(str(deployment_id), {})
    changed = [k for k, v in fields.items() if known.get(k) != v] if known else list(GUARDED)
    return (
        f"deployment {record.name!r} was changed through Prefect's API since `regimen serve` registered it "
        f"({', '.join(changed)}); serve runs only what it registered: restart `regimen serve` to register it again"
    )
