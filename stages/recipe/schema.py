"""The recipe's sections: pydantic models with `extra="forbid"` (a typo is an error that names the field),
frozen once validated. `sft:`, `grpo:` and `distill:` take TRL's own field names and are checked against TRL's
dataclasses; `data:` is validated by the chosen task's own options (`tasks/registry.py`)."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from regimen.stages.core.loading import import_problem
from regimen.stages.core.urls import store_url_problem
from regimen.stages.environments.registry import factory, get, trl_protocol
from regimen.stages.recipe import defaults, trackers, trl
from regimen.stages.rewards import check_specs
from regimen.stages.tasks import registry as tasks


class Section(BaseModel):
    # NaN and infinities refused at the door
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TinyModel(Section):
    """The embedded model's shape (used when `model.name_or_path: tiny`): a tiny Llama, ~0.5M params."""

    hidden_size: int = Field(128, gt=0, le=65536)
    intermediate_size: int = Field(512, gt=0, le=262144)
    num_hidden_layers: int = Field(2, gt=0, le=512)
    num_attention_heads: int = Field(4, gt=0, le=1024)
    max_position_embeddings: int = Field(64, gt=8, le=1 << 20)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    chat: bool = Field(
        False, description="give the tokenizer a compact chat template with tool calls (for environment recipes)"
    )


def looks_like_path(v: str) -> bool:
    return v.startswith(("/", "./", "../", "~")) or v.count("/") > 1


def check_model_ref(v: str) -> str:
    """A local folder must exist and hold a config.json; anything else must look like a hub id."""
    if v == "tiny":
        return v
    p = Path(v).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise ValueError(f"model folder {v!r} has no config.json (not a saved transformers model)")
        return v
    if looks_like_path(v) or not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", v):
        raise ValueError(f"model path {v!r} does not exist (give an existing folder or a hub id like 'org/name')")
    return v


class ModelSection(Section):
    name_or_path: str = Field("tiny", description="hub id, local folder, or 'tiny' for the embedded model")
    tiny: TinyModel = TinyModel()
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    merge_lora: bool = Field(
        True, description="with peft: merge the adapter into the saved policy so later stages load a plain model"
    )

    @field_validator("name_or_path")
    @classmethod
    def _exists_if_path(cls, v: str) -> str:
        return check_model_ref(v)


# Union over a tuple of the tasks' models: the one spelling that makes them one type (`|` needs them listed)
DataSection = Annotated[Union[tasks.options_models()], Field(discriminator="task")]  # type: ignore[valid-type]  # noqa: UP007


class TeacherSection(Section):
    """Where SFT's traces come from: the task's exact solver (`oracle`), the task's weak solver (`weak`,
    right on a known part of the task), a teacher model (rejection sampling), the current policy itself
    (reward-filtered self-distillation), or nobody (`none`: no SFT, the cycle starts at the dry run)."""

    kind: Literal["oracle", "weak", "model", "self", "none"] = "oracle"
    name_or_path: str | None = None
    samples_per_prompt: int = Field(4, ge=1, le=1024, description="model/self: completions generated per prompt")
    min_reward: float = Field(
        1.0, ge=-1e9, le=1e9, description="model/self: keep a trace only when its total reward is at least this"
    )
    temperature: float = Field(1.0, gt=0, le=100)
    max_prompts: int | None = Field(
        None,
        gt=0,
        le=10**9,
        description="traces for at most this many training prompts (a cycle's fresh draw; default: all)",
    )

    @model_validator(mode="after")
    def _needs_model(self) -> TeacherSection:
        if self.kind == "model":
            if not self.name_or_path:
                raise ValueError("teacher.kind 'model' needs teacher.name_or_path")
            check_model_ref(self.name_or_path)
        return self


class RewardSpec(Section):
    name: str = Field(description="a registered reward (answer, format, unit_tests, ...) or 'pkg.module:function'")
    weight: float = Field(1.0, ge=0, le=1e6, description="0 makes it a monitor: computed and logged, never trained on")
    pattern: str | None = Field(None, description="format: the regex the whole completion must match")
    args: dict[str, Any] = Field({}, description="options of a configurable reward, e.g. unit_tests: {timeout_s: 5}")
    as_: str | None = Field(
        None,
        alias="as",
        pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$",
        description="the name its values are reported under (default: its registry name, or a dotted path's "
        "module.function)",
    )

    def options(self) -> dict[str, Any]:
        return {**self.args, **({"pattern": self.pattern} if self.pattern is not None else {})}

    @property
    def key(self) -> str:
        """The name its values are reported under: `as`, else the registry name, else the dotted path written
        `module.function` (two modules' `score` functions sit side by side)."""
        return self.as_ or self.name.replace(":", ".")


class DryRunSection(Section):
    """The gate before RL: sample the policy, score it, and stop when GRPO could learn nothing."""

    num_prompts: int = Field(32, gt=0, le=10**6, description="prompts sampled, num_generations completions each")
    min_mean_reward: float = Field(0.05, ge=-1e9, le=1e9, description="below this the task is hopeless for this policy")
    max_mean_reward: float = Field(
        0.95, ge=-1e9, le=1e9, description="above this the task is trivial: nothing left to learn"
    )
    max_frac_zero_std: float = Field(0.8, ge=0, le=1, description="most groups without variance teach nothing")
    gameable: Literal["stop", "warn"] = Field(
        "stop",
        description="when the reward audit finds a reward that pays without the answer (a completion made without "
        "knowing the answer that earns a material share of the reference's pay, a wrong answer paid as much as the "
        "reference, a reward whose pay drifts with its calls): stop before GRPO, or warn",
    )
    audit_budget: int = Field(
        2400,
        ge=0,
        le=10**7,
        description="completions the reward audit's search generates (its seed examples and shrinking come on top; "
        "0: the fixed probes only); a recipe whose references span lines (programs) searches a tenth of it",
    )
    audit_material: float = Field(
        0.1,
        gt=0,
        le=1,
        description="a finding: an answer-blind completion earning at least this share of the way from a wrong "
        "answer's pay to the reference's, on the typical row",
    )
    abstention: bool = Field(
        False,
        description="the recipe wants abstention: a finding whose witness abstains (empty, 'I don't know') is a "
        "warning, not a stop",
    )


class SmokeSection(Section):
    """A few GRPO steps with the full recipe: some step must show reward variation and finite loss."""

    max_steps: int = Field(4, gt=0, le=10**5)


class ProbeSection(Section):
    """The held-out probe inside GRPO: greedy accuracy on a small held-out sample every `steps` steps, which
    the reward-hacking guard watches during training and which picks the checkpoint the version keeps."""

    steps: int = Field(
        50,
        ge=0,
        le=10**9,
        description="probe every this many GRPO steps (0: no probe, the guard speaks after the round)",
    )
    prompts: int = Field(64, gt=0, le=10**6, description="held-out prompts per probe (greedy)")
    keep: Literal["best", "last"] = Field(
        "best", description="the GRPO version holds the best-probing checkpoint, or the last"
    )
    stop_at_target: bool = Field(
        True,
        description="end the GRPO round once two probes in a row reach cycle.target (evaluation then decides on the "
        "whole set)",
    )
    train_prompts: int = Field(
        32,
        ge=0,
        le=10**6,
        description="training prompts answered greedily at each probe too: tells hacking, overfitting and sharpening "
        "apart (0: none)",
    )


class EvalSection(Section):
    batch_size: int = Field(64, gt=0, le=1 << 20, description="held-out prompts per generate() call (greedy)")
    max_new_tokens: int | None = Field(
        None, gt=0, le=10**7, description="default: grpo.max_completion_length as resolved"
    )
    trajectories: int = Field(50, ge=0, le=10**6, description="held-out samples written to trajectories.jsonl")
    metric: str = Field(
        "exact_match",
        description="'exact_match' against the `answer` column, or a reward as the recipe names it (a dotted path may "
        "be written `pkg.mod:fn` or `pkg.mod.fn`; 1.0 counts as correct)",
    )

    @field_validator("metric")
    @classmethod
    def _as_reported(cls, v: str) -> str:
        """A reward given by path is reported as `pkg.mod.fn` (`RewardSpec.key`): either spelling names it."""
        return v.replace(":", ".")


class GuardSection(Section):
    """The guard: the training reward rose while held-out accuracy did not. What it sees is named from the
    greedy probe on training prompts too (`stages/decide/verdicts.py:verdict`): hacking (the reward pays for something
    else), overfitting (training prompts learnt, held-out not) or sharpening (sampling catches up with what
    greedy decoding already scored: harmless)."""

    train_rise: float = Field(0.2, ge=-1e9, le=1e9, description="a rise of the training reward at least this large ...")
    heldout_gain: float = Field(
        0.02, ge=-1, le=1, description="... with held-out accuracy gaining less than this is suspicious"
    )
    action: Literal["stop", "warn"] = Field("stop", description="on hacking: stop the stage, or warn and go on")
    on_overfitting: Literal["stop", "warn"] = Field(
        "warn", description="on overfitting: stop the stage, or warn and go on"
    )
    sharpening_margin: float = Field(
        0.05,
        ge=0,
        le=1e9,
        description="sampled reward within this of the greedy reward before training counts as sharpening",
    )


class BandsSection(Section):
    easy: float = Field(0.8, ge=-1e9, le=1e9, description="a prompt's mean reward at or above this: easy")
    hard: float = Field(0.2, ge=-1e9, le=1e9, description="below this: hard (between them, and never seen: normal)")

    @model_validator(mode="after")
    def _hard_below_easy(self) -> BandsSection:
        if self.hard >= self.easy:
            raise ValueError(f"hard ({self.hard}) must be below easy ({self.easy}): a prompt cannot be both")
        return self


class LevelsSection(Section):
    """`curriculum.kind: levels` (`stages/training/levels.py`): GRPO's prompts generated at a difficulty level that
    follows the policy (a task that generates problems by level: reasoning_gym)."""

    mode: Literal["adaptive", "fixed", "uniform"] = Field(
        "adaptive",
        description="adaptive: the level moves with the pass rate at it; fixed: every prompt at `start`; uniform: each "
        "prompt at a level drawn uniformly from `start` to `top` (the two baselines adaptive is measured against)",
    )
    start: int = Field(0, ge=0, le=100, description="the level GRPO starts at")
    top: int | None = Field(
        None, ge=0, le=100, description="the highest level (default: the highest of data.heldout_levels)"
    )
    up: float = Field(0.8, ge=0, le=1, description="a pass rate at the current level at or above this: one level up")
    down: float = Field(0.2, ge=0, le=1, description="at or below this: one level down")
    window: int = Field(64, ge=1, le=10**6, description="completions at the current level each decision is taken over")

    @model_validator(mode="after")
    def _order(self) -> LevelsSection:
        if self.down >= self.up:
            raise ValueError(f"curriculum.levels: down ({self.down}) must be below up ({self.up})")
        if self.top is not None and self.start > self.top:
            raise ValueError(f"curriculum.levels: start ({self.start}) is above top ({self.top})")
        return self


class CurriculumSection(Section):
    """GRPO's prompts chosen by pass rate (`kind: pass_rates`, `stages/training/curriculum.py`: prompts whose latest
    groups all scored alike are set aside and re-admitted later; the rest are drawn by difficulty band), or
    generated at a difficulty level that follows the policy (`kind: levels`, `stages/training/levels.py`)."""

    kind: Literal["pass_rates", "levels"] = Field(
        "pass_rates",
        description="pass_rates: a fixed pool drawn by pass rate (when enabled); levels: problems generated at a level "
        "that rises with the policy (on whenever chosen)",
    )
    levels: LevelsSection = LevelsSection()
    enabled: bool = Field(
        False,
        description="true: GRPO draws its prompts by pass rate; false (default): TRL's own sampler (a uniform shuffle "
        "of the training rows)",
    )
    skip_all_alike: bool = Field(
        False,
        description="true: a group whose attempts all scored alike gives no gradient (neither its advantage nor its KL "
        "term; the loss is normalised over the tokens that remain), with or without a curriculum",
    )
    screen_samples: int = Field(
        4,
        ge=0,
        le=64,
        description="with skip_all_alike: answers the current policy gives each candidate prompt before it enters "
        "GRPO's batch; a candidate whose answers all score alike is skipped (0 or 1: no screen, only the loss part)",
    )
    screen_batch: int = Field(
        64,
        ge=1,
        le=4096,
        description="candidate prompts screened together (one generate call, split by eval.batch_size): fewer, larger "
        "calls cost less per answer, and the prompts a call admits wait in a queue, screened by an older policy",
    )
    screen_reuse: bool = Field(
        True,
        description="with the screen: the answers that let a candidate in become the first screen_samples attempts of "
        "its group, so only the rest are generated and every admitted group teaches (off with environment: or vLLM)",
    )
    set_aside_after: int = Field(1, ge=1, le=10**6, description="all-alike groups in a row that set a prompt aside")
    readmit_after: int = Field(
        50, ge=1, le=10**9, description="GRPO steps a set-aside prompt waits before it is drawn again"
    )
    bands: BandsSection = BandsSection()
    weights: dict[Literal["easy", "normal", "hard"], float] = Field(
        {"easy": 0.1, "normal": 0.7, "hard": 0.2},
        description="each active prompt's weight in a draw, by its band (a band is drawn in proportion to weight x its "
        "active prompts)",
    )

    @field_validator("weights")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        if any(not (0 <= w <= 1e6) for w in v.values()) or not any(w > 0 for w in v.values()):
            raise ValueError("curriculum.weights: each within [0, 1e6], and at least one above 0")
        return v


class CycleSection(Section):
    max_cycles: int = Field(1, ge=1, le=1000, description="SFT → ... → eval cycles at most")
    max_rounds: int = Field(1, ge=1, le=1000, description="GRPO rounds (each followed by eval) per cycle at most")
    target: float = Field(0.95, ge=0, le=1, description="held-out accuracy that ends the flow")
    min_delta: float = Field(0.02, ge=0, le=1, description="held-out gain that counts as progress")
    patience: int = Field(1, ge=1, le=1000, description="evaluations without progress before going back to SFT")
    stop_when_taught: bool = Field(
        True, description="end the cycle after SFT when its held-out accuracy already meets the target (no GRPO round)"
    )
    start_from: Literal["champion", "base", "latest"] = Field(
        "champion",
        description="cycle 1 starts from the experiment's champion (the base model until there is one), the base "
        "model, or the latest good policy",
    )
    guard: GuardSection = GuardSection()


class PromoteSection(Section):
    """When a run's challenger replaces the experiment's champion (`stages/decide/promotion.py`)."""

    enabled: bool = Field(True, description="promote a better challenger (false: decide and record, never promote)")
    min_gain: float = Field(
        0.02, ge=0, le=1, description="held-out accuracy the challenger must gain over the champion at least"
    )
    confidence: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="an exact McNemar test over the frozen set's prompts must reject 'no better' at this level",
    )
    test: Literal["mcnemar"] = "mcnemar"


class EnvironmentSection(Section):
    """Multi-turn episodes with tools (`stages/environments`): a registered environment, or `pkg.module:Class`
    (the CLI's full power only; the UI cannot choose code)."""

    name: str = Field(description="a registered environment (probe, code) or 'pkg.module:Class'")
    max_turns: int = Field(4, ge=1, le=64, description="tool calls per episode at most; the episode ends there")
    args: dict[str, Any] = Field({}, description="the environment's options, e.g. code: {timeout_s: 5}")
    tool_timeout_s: float | None = Field(
        30.0,
        gt=0,
        le=86_400,
        description="a tool call's time limit, in every episode (GRPO's rollouts too): past it the model is answered "
        "{'error': 'f timed out (30 s)'} and the step goes on (counted: tool_timeouts); null: no limit",
    )
    tool_max_chars: int | None = Field(
        20_000,
        ge=100,
        le=10**8,
        description="a tool reply's length at most, in characters: a longer one is cut, with a last line saying so "
        "(counted: tool_truncated); null: no limit",
    )

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if problem := import_problem(v):  # a module that raises while it loads (the field is named by the error)
            raise ValueError(problem)
        get(v)  # raises InputError naming the field
        return v

    @model_validator(mode="after")
    def _builds(self) -> EnvironmentSection:
        """One instance, made as training will make them: bad `args` are refused at the door."""
        try:
            factory(self)()
        except Exception as exc:  # noqa: BLE001 - an environment's constructor is user code: its error, named
            raise ValueError(
                f"environment.args: {self.name} could not be made with {dict(self.args)!r}: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from None
        return self


class KeepSection(Section):
    """Retention (`store.keep` in the recipe; `stages/store/retention.py`): what `regimen gc` keeps of each stage,
    run after every run that sets it. The champion's lineage, the last `champions` earlier champions (rollback
    targets), the records and what a running stage holds are kept whatever it says."""

    last: int | None = Field(None, ge=1, le=10**6, description="the last K versions of each stage")
    days: float | None = Field(None, ge=0, le=10**5, description="versions finished within D days")
    champions: int = Field(
        2,
        ge=0,
        le=10**4,
        description="earlier champions that stay restorable by `regimen rollback` (their lineage kept); older ones "
        "go like anything else, their history lines stay",
    )

    @model_validator(mode="after")
    def _something(self) -> KeepSection:
        if self.last is None and self.days is None:
            raise ValueError("store.keep: set last (versions per stage), days, or both")
        return self


class LimitsSection(Section):
    """An operator's ceilings on one run. `regimen serve --max-steps/--max-checkpoints/--max-hours/--max-disk-gb`
    sets them for every run it serves (a UI run cannot raise them: `limits.*` is not on the allow-list).
    They do not enter fingerprints: they refuse or stop a run, they never change what it computes."""

    max_steps: int | None = Field(
        None, ge=1, le=10**9, description="a training stage's max_steps at most (epoch-based training refused)"
    )
    max_checkpoints: int | None = Field(
        None, ge=2, le=10**6, description="checkpoints a training stage keeps at most (its save_total_limit)"
    )
    max_hours: float | None = Field(None, gt=0, le=10**5, description="wall time of the run: training stops past it")
    max_disk_gb: float | None = Field(
        None, gt=0, le=10**7, description="the experiment folder's size: training stops past it at a save"
    )


ACCELERATE_FLAGS = {
    "--mixed_precision",
    "--gpu_ids",
    "--dynamo_backend",
    "--same_network",
    "--rdzv_backend",
    "--max_restarts",
    "--monitor_interval",
    "--deepspeed_config_file",
    "--zero_stage",
    "--gradient_accumulation_steps",
    "--use_fsdp",
    "--use_deepspeed",
    "--fsdp_version",
    "--num_cpu_threads_per_process",
    "--debug",
    "--quiet",
    "-q",
}
# accelerate launch options that are the section's own fields (typed and checked), never extra_args
ACCELERATE_FIELDS = {
    "--num_processes": "num_processes",
    "--num_machines": "num_machines",
    "--machine_rank": "machine_rank",
    "--main_process_ip": "main_process_ip",
    "--main_process_port": "main_process_port",
    "--config_file": "config_file",
}
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


class AccelerateSection(Section):
    """`launcher: accelerate`. One machine: `num_processes` ranks there. Several machines (`num_machines` > 1):
    the same recipe is launched on each, differing only in `machine_rank`; `num_processes` counts the whole
    job's processes (accelerate's own meaning: each machine starts num_processes / num_machines), and every
    machine meets machine 0 at `main_process_ip:main_process_port`. Only global rank 0 (on machine_rank 0)
    writes the stage's outputs; a machine of rank >= 1 lends its processes and commits nothing
    (`run/launcher.py`). `num_machines`, `machine_rank` and the address do not enter fingerprints: where the
    processes run does not change what they compute (`tests/test_launch.py`)."""

    num_processes: int = Field(
        2, ge=1, le=4096, description="processes of the whole job, across all machines (accelerate's --num_processes)"
    )
    num_machines: int = Field(1, ge=1, le=1024, description="machines the job spans (accelerate's --num_machines)")
    machine_rank: int = Field(
        0, ge=0, le=1023, description="this machine's rank, below num_machines; 0 writes the stage's outputs"
    )
    main_process_ip: str | None = Field(
        None,
        max_length=253,
        validate_default=True,
        description="address (IP or host name) of machine_rank 0, which every machine reaches; needed when "
        "num_machines > 1",
    )
    main_process_port: int = Field(
        0, ge=0, le=65535, validate_default=True, description="its port (0: a free one, only on one machine)"
    )
    config_file: str | None = None
    extra_args: list[str] = Field(
        [], description="more `accelerate launch` options (only known ones: no program or script)"
    )

    @field_validator("num_machines")
    @classmethod
    def _whole_processes(cls, v: int, info) -> int:
        n = info.data.get("num_processes")
        if n is not None and n % v:
            raise ValueError(
                f"{n} processes (accelerate.num_processes, the whole job's) do not split evenly over {v} machines; "
                f"give each machine the same number"
            )
        return v

    @field_validator("machine_rank")
    @classmethod
    def _rank_below_machines(cls, v: int, info) -> int:
        machines = info.data.get("num_machines")
        if machines is not None and v >= machines:
            raise ValueError(
                f"{v} must be below accelerate.num_machines ({machines}): machines are ranked 0..{machines - 1}"
            )
        return v

    @field_validator("main_process_ip")
    @classmethod
    def _address(cls, v: str | None, info) -> str | None:
        machines = info.data.get("num_machines") or 1
        if v is None:
            if machines > 1:
                raise ValueError(
                    f"required with accelerate.num_machines {machines}: the address of machine_rank 0 that every "
                    f"machine reaches"
                )
            return v

        try:
            ip = ipaddress.ip_address(v)
        except ValueError:
            if not _HOSTNAME.match(v):
                raise ValueError(f"{v!r} is neither an IP address nor a host name") from None
            return v
        if ip.is_unspecified or ip.is_multicast:
            raise ValueError(
                f"{v!r} is not an address another machine can connect to (give machine_rank 0's own address)"
            )
        return v

    @field_validator("main_process_port")
    @classmethod
    def _port(cls, v: int, info) -> int:
        machines = info.data.get("num_machines") or 1
        if machines > 1 and v == 0:
            raise ValueError(
                f"set a port with accelerate.num_machines {machines}: 0 picks a free port on each machine separately, "
                "so they would never meet; every machine gives the same port, free on machine_rank 0"
            )
        return v

    @field_validator("config_file")
    @classmethod
    def _config_exists(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_file():
            raise ValueError(f"accelerate config file {v!r} does not exist")
        return v

    @field_validator("extra_args")
    @classmethod
    def _known_flags(cls, v: list[str]) -> list[str]:
        """Only `--flag` / `--flag=value` / `--flag value` of accelerate's own launch options: nothing that
        could name another program (`--no_python`, `-m`, a script path), nor one of the section's fields."""
        expect_value = False
        for arg in v:
            if expect_value and not arg.startswith("-"):
                expect_value = False
                continue
            flag = arg.split("=", 1)[0]
            if flag in ACCELERATE_FIELDS:
                raise ValueError(f"{flag} is a field of the section: set accelerate.{ACCELERATE_FIELDS[flag]}")
            if flag not in ACCELERATE_FLAGS:
                raise ValueError(
                    f"{arg!r} is not an allowed accelerate launch option (allowed: "
                    f"{', '.join(sorted(ACCELERATE_FLAGS))})"
                )
            expect_value = "=" not in arg and flag not in (
                "--debug",
                "--quiet",
                "-q",
                "--same_network",
                "--use_fsdp",
                "--use_deepspeed",
            )
        return v


TrackerName = Literal[trackers.NAMES]  # type: ignore[valid-type]
"""A tracker's name, from the one list of trackers (`recipe/trackers.py`): an unknown one is refused naming the
field and the known names."""


class Recipe(Section):
    experiment: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=100,
        description="the experiment's name: its folder in the store, its champion, its frozen held-out set",
    )
    model: ModelSection = Field(ModelSection(), description="the policy: `tiny` (built here) or a folder / hub id")
    data: DataSection = Field(  # type: ignore[valid-type]
        default_factory=lambda: tasks.TASKS["addition"].Options(),
        description="the task: its rows for training and its held-out rows (`task:` picks which, with its fields)",
    )
    teacher: TeacherSection = Field(TeacherSection(), description="who writes SFT's traces (none: no SFT stage)")
    rewards: list[RewardSpec] = Field(
        default_factory=lambda: [RewardSpec(name="answer")],
        min_length=1,
        description="the rewards GRPO trains on, each with its weight (0: a monitor), called as TRL calls them",
    )
    sft: dict[str, Any] = Field(
        {}, validate_default=True, description="TRL SFTConfig fields, resolved: the recipe's over Regimen's defaults"
    )
    peft: dict[str, Any] | None = Field(None, description="a LoRA adapter (LoraConfig fields); none: full weights")
    dry_run: DryRunSection = Field(DryRunSection(), description="the reward audit and the policy sampled before GRPO")
    smoke: SmokeSection = Field(SmokeSection(), description="a few GRPO steps that must show reward variation")
    grpo: dict[str, Any] = Field(
        {}, validate_default=True, description="TRL GRPOConfig fields, resolved: the recipe's over Regimen's defaults"
    )
    distill: dict[str, Any] | None = Field(
        None,
        description="TRL DistillationConfig fields for the on-policy distillation stage (after SFT; "
        "skipped when absent); the teacher is distill.teacher_model_name_or_path: a folder, a hub id, "
        "or champion:<experiment> (that experiment's champion in this store)",
    )
    probe: ProbeSection = Field(ProbeSection(), description="the held-out probe inside GRPO and the guard it feeds")
    eval: EvalSection = Field(EvalSection(), description="held-out evaluation: the metric and how it is generated")
    cycle: CycleSection = Field(CycleSection(), description="cycles and rounds: the target, patience, the guard")
    promote: PromoteSection = Field(PromoteSection(), description="when a challenger replaces the champion")
    curriculum: CurriculumSection = Field(
        CurriculumSection(), description="how GRPO picks its prompts: pass rates, levels, the all-alike screen"
    )
    environment: EnvironmentSection | None = Field(
        None, description="multi-turn episodes with tools (a class written for TRL's environment_factory)"
    )
    store: str = Field("artifacts", description="the store: a local folder or a bucket URL (s3://...)")
    keep: KeepSection | None = Field(
        None, description="retention: written `store: {url: ..., keep: {last: K, days: D}}` in a recipe"
    )
    tracking: list[TrackerName] = Field(
        [],
        description="trackers the run is mirrored to: one run group per run, a run per stage (the store stays the "
        "source of truth; a tracker that is down never stops training). Each is configured as its users do: its "
        "environment (MLFLOW_TRACKING_URI, TRACKIO_DIR, WANDB_MODE, ...) or tracking_options",
    )
    tracking_options: dict[TrackerName, dict[str, Any]] = Field(
        {}, description=f"per tracker: {trackers.options_text()}"
    )
    launcher: Literal["inprocess", "accelerate"] = Field(
        "inprocess", description="training stages in this process, or under `accelerate launch` (accelerate:)"
    )
    accelerate: AccelerateSection = Field(AccelerateSection(), description="accelerate launch's settings")
    limits: LimitsSection = Field(
        LimitsSection(), description="an operator's ceilings: steps, checkpoints, hours, disk"
    )
    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)  # what the recipe itself set (for `regimen check`)

    @field_validator("sft")
    @classmethod
    def _sft_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        return defaults.resolve_trl("sft", defaults.coerce("sft", v, defaults.trl_fields("sft"), "TRL's SFTConfig"))

    @field_validator("grpo")
    @classmethod
    def _grpo_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        return defaults.resolve_trl("grpo", defaults.coerce("grpo", v, defaults.trl_fields("grpo"), "TRL's GRPOConfig"))

    @field_validator("distill")
    @classmethod
    def _distill_fields(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return None
        resolved = defaults.resolve_trl(
            "distill", defaults.coerce("distill", v, defaults.trl_fields("distill"), "TRL's DistillationConfig")
        )
        teacher = resolved.get("teacher_model_name_or_path")
        if not isinstance(teacher, str) or not teacher.strip():
            raise ValueError(
                "distill.teacher_model_name_or_path: name the teacher to distil from: a model folder, a hub id, "
                "or champion:<experiment> (the champion of another experiment in this store)"
            )
        if teacher.startswith("champion:"):
            import re

            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", teacher.removeprefix("champion:")):
                raise ValueError(
                    f"distill.teacher_model_name_or_path {teacher!r}: champion:<experiment> takes an experiment name "
                    "(letters, digits, '_', '.' or '-')"
                )
        return resolved

    @field_validator("peft")
    @classmethod
    def _peft_fields(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v

        from peft import LoraConfig

        return defaults.coerce(
            "peft", v, {f.name: f for f in dataclasses.fields(LoraConfig) if f.init}, "peft's LoraConfig"
        )

    @field_validator("store")
    @classmethod
    def _store_opens(cls, v: str) -> str:
        if problem := store_url_problem(v):
            raise ValueError(problem)
        return v

    @model_validator(mode="before")
    @classmethod
    def _store_section(cls, data: Any) -> Any:
        """`store:` is a URL, or `{url: URL, keep: {...}}` (retention beside where the store is)."""
        if isinstance(data, dict) and isinstance(data.get("store"), dict):
            section = dict(data["store"])
            unknown = set(section) - {"url", "keep"}
            if unknown:
                raise ValueError(f"store: unknown field(s) {', '.join(sorted(unknown))} (a store has url and keep)")
            data = {**data, "store": section.get("url", "artifacts")}
            if section.get("keep") is not None:
                if data.get("keep") is not None:
                    raise ValueError("store.keep and keep: retention is written once (store: {url: ..., keep: {...}})")
                data["keep"] = section["keep"]
        return data

    @model_validator(mode="before")
    @classmethod
    def _scorer_is_the_metric(cls, data: Any) -> Any:
        """A task with its own scorer (reasoning_gym) is measured by it: unless `eval.metric` is set, held-out
        accuracy is the share of held-out rows that the recipe's `reasoning_gym` reward scores 1.0. A recipe that does
        not list that reward gets it as a monitor (weight 0: logged, never trained on)."""
        if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
            return data
        scorer = getattr(tasks.TASKS.get(data["data"].get("task")), "SCORER", None)
        evaluation = data.get("eval") if isinstance(data.get("eval"), dict) else {}
        if scorer is None or "metric" in evaluation or not isinstance(data.get("rewards"), list):
            return data
        specs = [r for r in data["rewards"] if isinstance(r, dict) and r.get("name") == scorer]
        if not specs:  # measured by it without being listed: added as a monitor (weight 0), never trained on
            monitor = {"name": scorer, "weight": 0.0}
            return {**data, "rewards": [*data["rewards"], monitor], "eval": {**evaluation, "metric": scorer}}
        return {**data, "eval": {**evaluation, "metric": specs[0].get("as") or scorer}}

    @model_validator(mode="before")
    @classmethod
    def _environment_rows_are_episodes(cls, data: Any) -> Any:
        """With an environment, rows read from files (jsonl, hf) are episodes unless `data.episodes` says otherwise: a
        prompt may repeat (TRL's own examples repeat one prompt; the environment makes each episode different)."""
        if not isinstance(data, dict) or not isinstance(data.get("data"), dict) or not data.get("environment"):
            return data
        if data["data"].get("task") in ("jsonl", "hf") and "episodes" not in data["data"]:
            return {**data, "data": {**data["data"], "episodes": True}}
        return data

    @model_validator(mode="after")
    def _rules(self) -> Recipe:
        """Regimen's own rules; TRL's (group sizes, batch divisibility, ...) run when the configs are built
        (`recipe/trl.py`, at the door: `load_recipe`)."""
        for spec in self.rewards:
            if problem := import_problem(spec.name):
                raise ValueError(f"rewards: {problem}")
        names = check_specs(self.rewards)
        if not any(r.weight > 0 for r in self.rewards):
            raise ValueError("rewards: every reward has weight 0 (monitors only); at least one must train (weight > 0)")
        if self.eval.metric != "exact_match" and self.eval.metric not in names:
            raise ValueError(
                f"eval.metric {self.eval.metric!r} must be 'exact_match' or one of the recipe's rewards: "
                f"{', '.join(names)}"
            )
        self._within_limits()
        if self.environment is not None:
            if self.eval.metric == "exact_match":
                raise ValueError(
                    "eval.metric: with an environment, evaluation judges episodes: name a reward (e.g. episode), not "
                    "exact_match"
                )
            self._rewards_fit_the_environment(names)
            if self.model.name_or_path == "tiny" and not self.model.tiny.chat:
                raise ValueError(
                    "model.tiny.chat: an environment needs a chat template with tool calls; set model.tiny.chat: true"
                )
            if self.distill is not None:
                raise ValueError(
                    "distill: not with an environment yet: TRL's DistillationTrainer runs tool calls from a list of "
                    "functions, "
                    "not Regimen's environments' episodes (their state, turn limit and episode reward); remove "
                    "distill: or environment:"
                )
        self._trackers_fit()
        if self.curriculum.skip_all_alike and self.num_processes() != 1:
            raise ValueError(
                "curriculum.skip_all_alike: runs in one process only (each rank sees a share of a group); remove it "
                "or launch one process"
            )
        screens = self.curriculum.skip_all_alike and self.curriculum.screen_samples >= 2
        if screens and (self.grpo_value("max_steps") or -1) <= 0:
            raise ValueError(
                "curriculum.skip_all_alike: its screen is an endless stream of prompts: set grpo.max_steps (or "
                "curriculum.screen_samples: 0 for the loss part alone)"
            )
        if self.curriculum.kind == "levels" and not getattr(tasks.TASKS[self.data.task], "LEVELS", False):
            raise ValueError(
                f"curriculum.kind: levels needs a task that generates problems by level (reasoning_gym); data.task "
                f"{self.data.task!r} draws from a fixed pool (curriculum.kind: pass_rates re-weights it)"
            )
        if self.teacher.kind == "weak" and not getattr(tasks.TASKS[self.data.task], "weak_solution", None):
            raise ValueError(
                f"teacher.kind 'weak' needs a task with a weak solver (e.g. data.task: code); data.task "
                f"{self.data.task!r} has none"
            )
        return self

    def _trackers_fit(self) -> None:
        """`tracking:` is the way in: a trainer's own `report_to` beside it is refused, options name known fields."""
        for name, options in self.tracking_options.items():
            if name not in self.tracking:
                raise ValueError(f"tracking_options.{name}: {name} is not in tracking: {self.tracking}")
            unknown = set(options) - set(trackers.TRACKERS[name])
            if unknown:
                raise ValueError(
                    f"tracking_options.{name}: unknown {', '.join(sorted(unknown))} "
                    f"(known: {', '.join(sorted(trackers.TRACKERS[name]))})"
                )
        for section in ("sft", "grpo", "distill"):
            report = (getattr(self, section) or {}).get("report_to")
            if self.tracking and report not in (None, [], "none", ["none"]):
                raise ValueError(
                    f"{section}.report_to: with `tracking:` Regimen mirrors every stage to the trackers itself "
                    f"(one run group per run); remove {section}.report_to, or add the tracker to tracking"
                )

    def _rewards_fit_the_environment(self, names: list[str]) -> None:
        """`episode` judges Regimen's environments (their `Episode`); `get_reward` calls a TRL-protocol class's own."""
        cls = get(self.environment.name)
        listed = {s.name for s in self.rewards}
        if trl_protocol(cls) and "episode" in listed:
            raise ValueError(
                f"rewards: episode judges Regimen's environments; {self.environment.name} follows TRL's protocol: list "
                "get_reward (its own get_reward()) or a reward of yours that reads `environments`"
            )
        if "get_reward" in listed and not (trl_protocol(cls) and callable(getattr(cls, "get_reward", None))):
            raise ValueError(f"rewards: get_reward: {self.environment.name} has no get_reward() of TRL's protocol")

    def _within_limits(self) -> None:
        """A recipe asking for more than `limits` allows is refused, naming the field and the limit."""
        lim = self.limits
        sections = {
            "sft": self.sft,
            "grpo": self.grpo,
            "smoke": {"max_steps": self.smoke.max_steps},
            **({"distill": self.distill} if self.distill else {}),
        }
        for section, values in sections.items():
            if section == "sft" and not self.trains_sft():
                continue
            steps = values.get("max_steps", -1)  # TRL's default: train by epochs
            if lim.max_steps is not None and steps is not None and not 0 < steps <= lim.max_steps:
                why = "training by epochs (max_steps -1) is not bounded" if steps <= 0 else f"{steps} asked"
                raise ValueError(
                    f"{section}.max_steps: at most {lim.max_steps} (limits.max_steps, the operator's limit); {why}"
                )
            kept = values.get("save_total_limit")
            if lim.max_checkpoints is not None and kept is not None and kept > lim.max_checkpoints:
                raise ValueError(
                    f"{section}.save_total_limit: at most {lim.max_checkpoints} (limits.max_checkpoints, the "
                    f"operator's limit); {kept} asked"
                )

    # -- resolved values ----------------------------------------------------------------------
    def grpo_value(self, key: str) -> Any:
        """A GRPO setting as training uses it: read from the recipe's `GRPOConfig` itself (`recipe/trl.py`)."""
        return getattr(trl.config(self, "grpo"), key)

    def sft_value(self, key: str) -> Any:
        """An SFT setting as training uses it: read from the recipe's `SFTConfig` itself."""
        return getattr(trl.config(self, "sft"), key)

    def max_new_tokens(self) -> int:
        """Completion length outside TRL (dry run, evaluation, teacher, probe): eval.max_new_tokens, else GRPO's."""
        return int(self.eval.max_new_tokens or self.grpo_value("max_completion_length"))

    def num_processes(self) -> int:
        return self.accelerate.num_processes if self.launcher == "accelerate" else 1

    def reward_weights(self) -> dict[str, float]:
        return {s.key: s.weight for s in self.rewards}

    def trains_sft(self) -> bool:
        return self.teacher.kind != "none"

    def distills(self) -> bool:
        """The on-policy distillation stage runs (a `distill:` section is set)."""
        return self.distill is not None
