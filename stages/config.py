"""The recipe: one YAML file per model and task, validated once, at the door.

Every section is a pydantic model with `extra="forbid"`, so a typo is an error that names the field.
`sft:` and `grpo:` take TRL's own field names (`SFTConfig`, `GRPOConfig`) and are checked against
those dataclasses: their types, then TRL's own cross-field validation, before anything runs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from stages.errors import InputError

STAGES = ("sft", "reward-dry-run", "grpo-smoke", "grpo", "eval")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TinyModel(Section):
    """The embedded model's shape (used when `model.name_or_path: tiny`): a tiny Llama, ~0.5M params."""

    hidden_size: int = Field(128, gt=0)
    intermediate_size: int = Field(512, gt=0)
    num_hidden_layers: int = Field(2, gt=0)
    num_attention_heads: int = Field(4, gt=0)
    max_position_embeddings: int = Field(64, gt=8)
    seed: int = 0


class ModelSection(Section):
    name_or_path: str = Field("tiny", description="hub id, local folder, or 'tiny' for the embedded model")
    tiny: TinyModel = TinyModel()
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    merge_lora: bool = Field(True, description="with peft: merge the adapter into the saved policy so later stages load a plain model")

    @field_validator("name_or_path")
    @classmethod
    def _exists_if_path(cls, v: str) -> str:
        return _check_model_ref(v)


def _looks_like_path(v: str) -> bool:
    return v.startswith(("/", "./", "../", "~")) or v.count("/") > 1


def _check_model_ref(v: str) -> str:
    """A local folder must exist and hold a config.json; anything else must look like a hub id."""
    if v == "tiny":
        return v
    p = Path(v).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise ValueError(f"model folder {v!r} has no config.json (not a saved transformers model)")
        return v
    if _looks_like_path(v) or not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", v):
        raise ValueError(f"model path {v!r} does not exist (give an existing folder or a hub id like 'org/name')")
    return v


class DataSection(Section):
    """The task. `addition` is generated in code (with an exact solver as teacher); `jsonl` reads files."""

    task: Literal["addition", "jsonl"] = "addition"
    train_size: int = Field(9000, gt=0, description="addition: distinct training problems")
    heldout_size: int = Field(200, gt=0, description="addition: distinct held-out problems (never trained on)")
    max_operand: int = Field(99, gt=0, description="addition: operands are drawn from 0..max_operand")
    seed: int = 0
    train_file: str | None = Field(None, description="jsonl: rows with `prompt`, `answer` and reward columns")
    heldout_file: str | None = Field(None, description="jsonl: held-out rows; without it, heldout_fraction of train_file is held out")
    heldout_fraction: float = Field(0.25, gt=0, lt=1, description="jsonl without heldout_file: share of rows held out (seeded split)")

    @model_validator(mode="after")
    def _files(self) -> DataSection:
        if self.task == "jsonl":
            if not self.train_file:
                raise ValueError("data.task 'jsonl' needs data.train_file")
            for name in ("train_file", "heldout_file"):
                value = getattr(self, name)
                if value and not Path(value).is_file():
                    raise ValueError(f"data.{name} {value!r} does not exist")
        elif self.train_size + self.heldout_size > (self.max_operand + 1) ** 2:
            raise ValueError(f"train_size + heldout_size exceeds the {(self.max_operand + 1) ** 2} distinct problems max_operand allows")
        return self


class TeacherSection(Section):
    """Where SFT's traces come from: the task's exact solver, a teacher model (rejection sampling),
    or the current policy itself (reward-filtered self-distillation)."""

    kind: Literal["oracle", "model", "self"] = "oracle"
    name_or_path: str | None = None
    samples_per_prompt: int = Field(4, ge=1, description="model/self: completions generated per prompt")
    min_reward: float = Field(1.0, description="model/self: keep a trace only when its total reward is at least this")
    temperature: float = Field(1.0, gt=0)
    max_prompts: int | None = Field(None, gt=0, description="cap the prompts sent to a model teacher (default: all)")

    @model_validator(mode="after")
    def _needs_model(self) -> TeacherSection:
        if self.kind == "model":
            if not self.name_or_path:
                raise ValueError("teacher.kind 'model' needs teacher.name_or_path")
            _check_model_ref(self.name_or_path)
        return self


class RewardSpec(Section):
    name: str = Field(description="a registered reward (answer, format, unit_tests, ...) or 'pkg.module:function'")
    weight: float = 1.0
    pattern: str | None = Field(None, description="format: the regex the whole completion must match")
    args: dict[str, Any] = Field({}, description="options of a configurable reward, e.g. unit_tests: {timeout_s: 5, allow_unisolated: false}")

    def options(self) -> dict[str, Any]:
        return {**self.args, **({"pattern": self.pattern} if self.pattern is not None else {})}


class DryRunSection(Section):
    """The gate before RL: sample the policy, score it, and stop when GRPO could learn nothing."""

    num_prompts: int = Field(32, gt=0, description="prompts sampled, num_generations completions each")
    min_mean_reward: float = Field(0.05, description="below this the task is hopeless for this policy")
    max_mean_reward: float = Field(0.95, description="above this the task is trivial: nothing left to learn")
    max_frac_zero_std: float = Field(0.8, ge=0, le=1, description="most groups without variance teach nothing")


class SmokeSection(Section):
    """A few GRPO steps with the full recipe: some step must show reward variation and finite loss."""

    max_steps: int = Field(4, gt=0)


class EvalSection(Section):
    batch_size: int = Field(256, gt=0, description="held-out prompts per generate() call (greedy)")
    max_new_tokens: int | None = Field(None, gt=0, description="default: grpo.max_completion_length")
    trajectories: int = Field(50, ge=0, description="held-out samples written to trajectories.jsonl")
    metric: str = Field("exact_match", description="'exact_match' against the `answer` column, or a reward name (1.0 counts as correct)")


class GuardSection(Section):
    """Reward-hacking guard: training reward rose, held-out accuracy did not."""

    train_rise: float = Field(0.2, description="a rise of the training reward at least this large ...")
    heldout_gain: float = Field(0.02, description="... with held-out accuracy gaining less than this is suspicious")
    action: Literal["stop", "warn"] = "stop"


class CycleSection(Section):
    max_cycles: int = Field(1, ge=1, description="SFT → ... → eval cycles at most")
    max_rounds: int = Field(1, ge=1, description="GRPO rounds (each followed by eval) per cycle at most")
    target: float = Field(0.95, description="held-out accuracy that ends the flow")
    min_delta: float = Field(0.02, ge=0, description="held-out gain that counts as progress")
    patience: int = Field(1, ge=1, description="evaluations without progress before going back to SFT")
    start_from: Literal["base", "latest"] = Field("base", description="cycle 1 starts from the base model or the latest good policy")
    guard: GuardSection = GuardSection()


class AccelerateSection(Section):
    num_processes: int = Field(2, ge=1)
    config_file: str | None = None
    main_process_port: int = 0
    extra_args: list[str] = []


class Recipe(Section):
    experiment: str = Field("default", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    teacher: TeacherSection = TeacherSection()
    rewards: list[RewardSpec] = Field(default_factory=lambda: [RewardSpec(name="answer")], min_length=1)
    sft: dict[str, Any] = {}
    peft: dict[str, Any] | None = None
    dry_run: DryRunSection = DryRunSection()
    smoke: SmokeSection = SmokeSection()
    grpo: dict[str, Any] = {}
    eval: EvalSection = EvalSection()
    cycle: CycleSection = CycleSection()
    store: str = "artifacts"
    launcher: Literal["inprocess", "accelerate"] = "inprocess"
    accelerate: AccelerateSection = AccelerateSection()

    @field_validator("sft")
    @classmethod
    def _sft_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _typed_trl_fields("sft", v)

    @field_validator("grpo")
    @classmethod
    def _grpo_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _typed_trl_fields("grpo", v)

    @field_validator("peft")
    @classmethod
    def _peft_fields(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        from peft import LoraConfig

        return _typed_dataclass_fields(LoraConfig, v)

    @model_validator(mode="after")
    def _grpo_rules(self) -> Recipe:
        g = self.grpo_settings()
        if g["num_generations"] < 2:
            raise ValueError("grpo.num_generations must be at least 2: GRPO compares attempts within a group")
        if g["beta"] < 0:
            raise ValueError("grpo.beta must be >= 0 (it weighs the KL penalty)")
        if g["beta"] == 0:
            raise ValueError("grpo.beta must be > 0: Regimen's GRPO stage always trains with a KL penalty that limits drift")
        procs = self.num_processes()
        per_step = g["per_device_train_batch_size"] * procs * (g.get("steps_per_generation") or g.get("gradient_accumulation_steps") or 1)
        if g.get("generation_batch_size"):
            per_step = g["generation_batch_size"]
        if per_step % g["num_generations"]:
            raise ValueError(
                f"grpo: the completions per generation batch ({per_step} = per_device_train_batch_size "
                f"{g['per_device_train_batch_size']} x {procs} process(es) x steps_per_generation) must be divisible by "
                f"num_generations ({g['num_generations']}) so every prompt gets a whole group"
            )
        from stages.rewards import from_specs

        names = from_specs(self.rewards)
        if self.eval.metric != "exact_match" and self.eval.metric not in names:
            raise ValueError(f"eval.metric {self.eval.metric!r} must be 'exact_match' or one of the recipe's rewards: {', '.join(names)}")
        return self

    def num_processes(self) -> int:
        return self.accelerate.num_processes if self.launcher == "accelerate" else 1

    def sft_settings(self) -> dict[str, Any]:
        """SFT arguments as TRL gets them: Regimen's defaults for the tiny task, then the recipe's."""
        return {**SFT_DEFAULTS, **self.sft}

    def grpo_settings(self) -> dict[str, Any]:
        return {**GRPO_DEFAULTS, **self.grpo}

    def reward_weights(self) -> dict[str, float]:
        return {reward_key(s): s.weight for s in self.rewards}


def reward_key(spec: RewardSpec) -> str:
    """The name a reward's values are reported under (the dotted path's function name for custom ones)."""
    return spec.name.rsplit(":", 1)[-1]


# Defaults applied under the recipe's own values. They suit a small model on a CPU; every one can be
# overridden in the recipe with TRL's field name.
COMMON_DEFAULTS: dict[str, Any] = {
    "report_to": "none",
    "bf16": False,
    "activation_checkpointing": False,
    "logging_steps": 10,
    "save_strategy": "steps",
    "save_only_model": False,
    "seed": 42,
    "disable_tqdm": False,
    "dataloader_num_workers": 0,
    "ddp_find_unused_parameters": False,  # True (transformers' default) costs an extra pass under DDP
}
SFT_DEFAULTS: dict[str, Any] = {
    **COMMON_DEFAULTS,
    "max_steps": 500,
    "per_device_train_batch_size": 64,
    "learning_rate": 1e-3,
    "lr_scheduler_type": "constant_with_warmup",
    "warmup_steps": 10,
    "save_steps": 100,
    "completion_only_loss": True,
}
GRPO_DEFAULTS: dict[str, Any] = {
    **COMMON_DEFAULTS,
    "max_steps": 600,
    "per_device_train_batch_size": 64,
    "num_generations": 8,
    "learning_rate": 1e-4,
    "beta": 0.04,
    "max_completion_length": 6,
    "temperature": 1.0,
    "save_steps": 100,
    "logging_steps": 10,
}


@functools.cache
def _trl_fields(section: str) -> dict[str, dataclasses.Field]:
    if section == "sft":
        from trl.trainer.sft_config import SFTConfig as cls
    else:
        from trl.trainer.grpo_config import GRPOConfig as cls
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


# Fields Regimen sets itself: a recipe value would be ignored or break the stage's file layout.
RESERVED_TRL_FIELDS = {"output_dir", "resume_from_checkpoint", "do_train", "do_eval", "overwrite_output_dir"}


def _typed_dataclass_fields(cls: type, values: dict[str, Any], section: str = "peft") -> dict[str, Any]:
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    return _coerce(section, values, fields)


def _typed_trl_fields(section: str, values: dict[str, Any]) -> dict[str, Any]:
    return _coerce(section, values, _trl_fields(section))


def _coerce(section: str, values: dict[str, Any], fields: dict[str, dataclasses.Field]) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        if key in RESERVED_TRL_FIELDS:
            raise ValueError(f"{section}.{key} is set by Regimen (checkpoints live in the stage's work folder)")
        if key not in fields:
            close = [n for n in fields if n.startswith(key[:4])][:5]
            hint = f"; did you mean one of {close}?" if close else ""
            raise ValueError(f"{section}.{key} is not a field of TRL's {'SFTConfig' if section == 'sft' else 'GRPOConfig' if section == 'grpo' else 'LoraConfig'}{hint}")
        if key == "save_total_limit" and value is not None and value < 2:
            raise ValueError(f"{section}.save_total_limit must be at least 2 (or unset): with 1 the Trainer deletes the last good checkpoint before the new one is known to be complete")
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
    return out


def trl_check(recipe: Recipe) -> None:
    """Build TRL's own config objects once, so TRL's cross-field validation runs before training."""
    import tempfile
    import warnings

    from stages.trl_args import grpo_args, sft_args

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for section, build in (("sft", sft_args), ("grpo", grpo_args)):
            try:
                build(recipe, tmp)
            except (ValueError, TypeError) as exc:
                raise InputError(f"recipe: {section}: TRL rejects these settings: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Loading, overrides and error messages


_YAML11_WORDS = {"yes", "no", "on", "off", "y", "n"}


def parse_set(items: list[str]) -> dict[str, Any]:
    """`--set a.b=VALUE` items into a mapping; VALUE is read as YAML (so 0.05, true, [1, 2] are typed)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*", key):
            raise InputError(f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. --set grpo.beta=0.05")
        if raw.strip().lower() in _YAML11_WORDS:  # `save_strategy=no` means the string "no", as TRL's CLI reads it
            out[key] = raw.strip()
            continue
        try:
            out[key] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key] = raw
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys into a (copied) raw recipe mapping."""
    import copy

    data = copy.deepcopy(data)
    for key, value in overrides.items():
        parts = key.split(".")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise InputError(f"--set {key}: {'.'.join(parts[: i + 1])} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise InputError(f"recipe {p}: file does not exist")
    if not p.is_file():
        raise InputError(f"recipe {p}: not a file")
    text = p.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"recipe {p}:{where}: YAML syntax error: {problem}") from None
    if data is None:
        raise InputError(f"recipe {p}: file is empty")
    if not isinstance(data, dict):
        raise InputError(f"recipe {p}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def format_validation_error(source: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if p != "__root__")
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            section = ".".join(str(p) for p in err["loc"][:-1])
            allowed = _allowed_fields(err["loc"][:-1])
            msg = f"unknown {'field' if section else 'section'}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
        elif err["type"] not in ("value_error", "assertion_error") and "input" in err and not isinstance(err["input"], dict):
            msg = f"{msg} (got {err['input']!r})"
        lines.append(f"{loc}: {msg}" if loc else msg)
    return f"recipe {source}: " + "; ".join(lines)


def _allowed_fields(loc: tuple) -> list[str]:
    model: Any = Recipe
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        ann = getattr(field, "annotation", None)
        if ann is None:
            return []
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            args = getattr(ann, "__args__", ())
            model = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
            if model is None:
                return []
    return list(model.model_fields)


def load_recipe(path: str | Path, overrides: dict[str, Any] | list[str] | None = None, *, check_trl: bool = True) -> Recipe:
    """Read, override and validate a recipe; any problem is an InputError naming the field or line."""
    if isinstance(overrides, list):
        overrides = parse_set(overrides)
    data = apply_overrides(read_yaml(path), overrides or {})
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(str(path), exc)) from None
    if check_trl:
        trl_check(recipe)
    return recipe


def recipe_from_dict(data: dict[str, Any], source: str = "<dict>") -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(source, exc)) from None


def dump_recipe(recipe: Recipe) -> str:
    """The resolved recipe as YAML, with TRL defaults Regimen applies made explicit."""
    data = recipe.model_dump(mode="json")
    data["sft"] = recipe.sft_settings()
    data["grpo"] = recipe.grpo_settings()
    return yaml.safe_dump(data, sort_keys=False)
