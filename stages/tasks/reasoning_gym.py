"""reasoning-gym's procedural tasks as they ship (`pip install 'regimen-rl[reasoning-gym]'`).

    data:
      task: reasoning_gym
      name: chain_sum              # or a mixture: [{name: chain_sum, weight: 2}, {name: spell_backward}]
      config: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}
      train_size: 2000
      heldout_size: 200
      seed: 0
      system_prompt: null          # a plain continuation for the embedded tiny model; 'default' (reasoning-gym's
                                   # own, answers in <answer> tags) or your text: a chat for a real model

Rows are generated from the seed (the held-out set from its own seed and the training rows from another, both
derived from `seed` far apart, training rows equal to a held-out prompt dropped). Each row carries what its scorer
needs: `answer` (the reference, the oracle teacher's completion), `source_dataset` (the task of a mixture's row, for
accuracy per task) and `rg_entry` (JSON: the task's name, the configuration the item was generated with, its question,
answer and metadata), so the `reasoning_gym` reward can call that task's own registered scorer. A row generated at a
curriculum level also carries `level`.

Prompts: without `system_prompt`, a plain continuation `question + "\\n"` (the line break is the separator: a
completion is the answer and nothing else); with it, a conversation `[system, user]` rendered by the model's
chat template, and the reference wrapped in `<answer>` tags when the system prompt asks for them.

At the door, every task named is checked: known to reasoning-gym, its configuration accepted, and its scorer
paying its own reference answer for an item stored as JSON (some, such as arc_agi, do not survive the round
trip: refused, naming the task).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from regimen.stages.core.errors import InputError
from regimen.stages.tasks import Task, TaskOptions, check_split

NAME = "reasoning_gym"
SCORER = "reasoning_gym"  # the reward that scores rows with their task's own scorer: the held-out metric
EXTRA = "pip install 'regimen-rl[reasoning-gym]'"


def library():
    """reasoning_gym, or InputError naming the extra that installs it (exit 2 at the door)."""
    try:
        import reasoning_gym
    except ImportError:
        raise InputError(f"data.task: reasoning_gym needs reasoning-gym, which is not installed: {EXTRA}") from None
    return reasoning_gym


class Part(BaseModel):
    """One task of a mixture, as reasoning-gym's composite dataset takes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(description="a reasoning-gym task, e.g. chain_sum")
    weight: float = Field(1.0, gt=0, le=1e6, description="its share of the rows, against the others' weights")
    config: dict[str, Any] = Field({}, description="the task's own configuration fields")


class Options(TaskOptions):
    task: Literal["reasoning_gym"] = "reasoning_gym"
    name: str | list[Part] = Field(
        description="a reasoning-gym task (e.g. chain_sum), or a mixture: a list of {name, weight, config}"
    )
    config: dict[str, Any] = Field({}, description="the task's configuration fields (a single task only)")
    train_size: int = Field(2000, gt=0, le=10**7, description="training problems generated")
    heldout_size: int = Field(200, gt=0, le=10**6, description="held-out problems, from their own seed")
    system_prompt: str | None = Field(
        None,
        description="unset: a plain continuation (question, then a line break) for the embedded tiny model; "
        "'default' (reasoning-gym's own, answers in <answer> tags) or your text: a [system, user] chat",
    )
    level: int | None = Field(
        None, ge=0, le=100, description="generate at this curriculum level of every task (its attributes' levels)"
    )
    level_range: Literal["upper_bound", "inclusive"] = Field(
        "upper_bound",
        description="how a level becomes a range of each attribute (reasoning-gym's RangeAttributeMode): upper_bound: "
        "that level's value only (spell_backward: 5-letter words at level 1); inclusive: every value up to it (3 to 5 "
        "letters), so a higher level holds the lower ones' problems too",
    )
    heldout_levels: list[int] | None = Field(
        None,
        description="the held-out set spread evenly over these curriculum levels (each row keeps its `level`, and "
        "accuracy is reported per level): what `curriculum.kind: levels` is measured on",
    )

    @field_validator("heldout_levels")
    @classmethod
    def _levels(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(not 0 <= x <= 100 for x in v) or len(set(v)) != len(v)):
            raise ValueError("heldout_levels: distinct levels between 0 and 100, at least one")
        return v

    @field_validator("config")
    @classmethod
    def _json_config(cls, v: dict[str, Any]) -> dict[str, Any]:
        json.dumps(v)  # plain YAML values only: they enter fingerprints and each row's record
        return v

    @model_validator(mode="after")
    def _known(self) -> Options:
        if isinstance(self.name, list) and self.config:
            raise ValueError("config: a mixture gives each task's config in its own entry of `name`")
        if isinstance(self.name, list) and not self.name:
            raise ValueError("name: a mixture needs at least one task")
        if isinstance(self.name, list) and len({p.name for p in self.name}) != len(self.name):
            raise ValueError("name: a mixture names each task once")
        try:
            library()
        except InputError as exc:
            raise ValueError(str(exc).removeprefix("data.task: ")) from None
        from reasoning_gym.factory import DATASETS

        for part in self.parts():
            if part.name not in DATASETS or part.name == "composite":
                near = sorted(n for n in DATASETS if n.startswith(part.name[:3]))[:5]
                hint = f"did you mean {', '.join(near)}?" if near else f"it has {len(DATASETS) - 1}, e.g. chain_sum"
                raise ValueError(f"name: {part.name!r} is not a reasoning-gym task ({hint})")
        return self

    def parts(self) -> list[Part]:
        return list(self.name) if isinstance(self.name, list) else [Part(name=self.name, config=self.config)]


def system_text(opts: Options) -> str | None:
    if opts.system_prompt is None:
        return None
    if opts.system_prompt == "default":
        return library().utils.SYSTEM_PROMPTS["default"]
    return opts.system_prompt


def tagged(opts: Options) -> bool:
    """Whether the reference answer is written in <answer> tags (the system prompt asks for them)."""
    text = system_text(opts)
    return text is not None and "<answer>" in text


def _check_part(part: Part, level: int | None, mode: str = "upper_bound") -> None:
    rg = library()
    try:
        ds = _dataset(part.name, json.dumps(part.config, sort_keys=True), level, 0, 2, mode)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the library's own validation, named
        raise InputError(f"data.config of {part.name}: {type(exc).__name__}: {exc}") from None
    item = json.loads(json.dumps(ds[0], default=_plain))
    config = dataset_config(part.name, part.config, ds)
    scorer = rg.create_dataset(part.name, **{**config, "size": 1, "seed": 0})
    try:
        paid = float(scorer.score_answer(item["answer"], item))
    except Exception as exc:  # noqa: BLE001
        paid = f"an error ({type(exc).__name__})"
    if paid != 1.0:
        raise InputError(
            f"data.name: {part.name}'s scorer pays its own reference answer {paid} once the item is stored as JSON "
            "(as the held-out set and the rows are): this task is not supported"
        )


def _plain(value: Any) -> Any:
    """What json.dumps cannot write, as plain data (tuples and sets as lists, the rest as text)."""
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


@cache
def _dataset(name: str, config_json: str, level: int | None, seed: int, size: int, mode: str = "upper_bound"):
    """A reasoning-gym dataset of `name` with this configuration (at a curriculum level when given, its ranges by
    `mode`: `Options.level_range`)."""
    rg = library()
    config = json.loads(config_json)
    if level is None:
        return rg.create_dataset(name, **{**config, "seed": seed, "size": size})
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
    from reasoning_gym.factory import DATASETS, create_curriculum, has_curriculum

    if not has_curriculum(name):
        raise InputError(f"data.level: {name} has no difficulty curriculum in reasoning-gym")
    curriculum = create_curriculum(name)
    curriculum.set_global_level(level)
    made = curriculum.generate_configuration(
        {**config, "seed": seed, "size": size}, context=DefaultCurriculumContext(mode=RangeAttributeMode(mode))
    )
    return DATASETS[name][0](config=made)


def levels(name: str) -> int:
    """How many levels reasoning-gym's curriculum of `name` has (its longest attribute's)."""
    library()
    from reasoning_gym.factory import create_curriculum, has_curriculum

    if not has_curriculum(name):
        raise InputError(f"curriculum: {name} has no difficulty curriculum in reasoning-gym (kind: levels needs one)")
    return max(len(a.levels) for a in create_curriculum(name).attributes.values())


def dataset_config(name: str, config: dict[str, Any], ds) -> dict[str, Any]:
    """The configuration to remake `ds`'s scorer from: the recipe's own fields, plus the fields a curriculum
    level set (plain numbers), never the whole dataclass (some hold objects JSON cannot carry)."""
    out = dict(config)
    from reasoning_gym.factory import create_curriculum, has_curriculum

    if has_curriculum(name):
        for attr in create_curriculum(name).attributes.values():
            for field in ("lower_field_name", "upper_field_name", "field_name"):
                key = getattr(attr, field, None)
                if key and dataclasses.is_dataclass(ds.config) and hasattr(ds.config, key):
                    value = getattr(ds.config, key)
                    if isinstance(value, (int, float, str, bool)) and key not in config:
                        out[key] = value
    return out


def generate(opts: Options, n: int, seed: int, level: int | None = None) -> list[dict[str, Any]]:
    """`n` rows drawn as reasoning-gym's composite dataset draws them: row i from the task a seeded choice by
    weight picks, item i of that task's dataset (seeded `seed + its position + 1`)."""
    parts = opts.parts()
    level = opts.level if level is None else level
    datasets = [
        _dataset(p.name, json.dumps(p.config, sort_keys=True), level, seed + i + 1, n, opts.level_range)
        for i, p in enumerate(parts)
    ]
    configs = [dataset_config(p.name, p.config, ds) for p, ds in zip(parts, datasets)]
    rows = []
    for i in range(n):
        k = random.Random(seed + i).choices(range(len(parts)), weights=[p.weight for p in parts], k=1)[0]
        item = json.loads(json.dumps(datasets[k][i], default=_plain))
        rows.append(_row(opts, parts[k].name, configs[k], level, item))
    return rows


def _row(opts: Options, name: str, config: dict[str, Any], level: int | None, item: dict[str, Any]) -> dict[str, Any]:
    question = str(item["question"])
    system = system_text(opts)
    prompt: Any = (
        f"{question}\n"
        if system is None
        else [{"role": "system", "content": system}, {"role": "user", "content": question}]
    )
    entry = {
        "name": name,
        "config": config,
        "level": level,
        **{k: item.get(k) for k in ("question", "answer", "metadata")},
    }
    row = {
        "prompt": prompt,
        "answer": str(item["answer"]),
        "source_dataset": name,
        "rg_entry": json.dumps(entry, sort_keys=True),
    }
    if level is not None:
        row["level"] = level
    return row


LEVELS = True
"""This task generates problems at a difficulty level (`curriculum.kind: levels`: `row_at`, `top_level`)."""


def top_level(opts: Options) -> int:
    """The highest level GRPO may reach: the highest held-out level, else the lowest top of the tasks' curricula."""
    if opts.heldout_levels:
        return max(opts.heldout_levels)
    return min(levels(p.name) for p in opts.parts()) - 1


def row_at(opts: Options, level: int, seed: int, index: int) -> dict[str, Any]:
    """Training row `index` of the stream at `level` (deterministic in seed, level and index)."""
    parts = opts.parts()
    k = random.Random(seed + index).choices(range(len(parts)), weights=[p.weight for p in parts], k=1)[0]
    part = parts[k]
    seed = seed + 7919 * (level + 1) + k
    ds = _dataset(part.name, json.dumps(part.config, sort_keys=True), level, seed, 10**6, opts.level_range)
    item = json.loads(json.dumps(ds[index], default=_plain))
    return _row(opts, part.name, dataset_config(part.name, part.config, ds), level, item)


def reference(opts: Options):
    wrap = tagged(opts)

    def ref(row: dict[str, Any]) -> str | None:
        answer = row.get("answer")
        if answer in (None, ""):
            return None
        return f"<answer>{answer}</answer>" if wrap else str(answer)

    return ref


def load(opts: Options) -> Task:
    for part in opts.parts():
        _check_part(part, opts.level, opts.level_range)
    if opts.heldout_levels:
        per = -(-opts.heldout_size // len(opts.heldout_levels))
        heldout = [
            row
            for level in opts.heldout_levels
            for row in generate(opts, per, split_seed(opts.seed, f"heldout-{level}"), level)
        ][: opts.heldout_size]
    else:
        heldout = generate(opts, opts.heldout_size, split_seed(opts.seed, "heldout"))
    train = generate(opts, opts.train_size, split_seed(opts.seed, "train"))
    train = check_split(train, heldout, f"reasoning-gym {_label(opts)} (train)", "its held-out rows")
    return Task(train, heldout, NAME, reference=reference(opts))


def split_seed(seed: int, split: str) -> int:
    """A split's seed, far from the other split's: reasoning-gym draws item i from `Random(seed + i)`, so seeds a
    few apart would give the two splits the same items shifted by one."""
    return int(hashlib.sha256(f"{seed}:{split}".encode()).hexdigest()[:8], 16) % (2**31)


def _label(opts: Options) -> str:
    return "+".join(p.name for p in opts.parts())


def identity(opts: Options) -> dict[str, Any]:
    """The options and the library's version: the same seed gives other problems in another release."""
    try:
        made_by = version("reasoning-gym")
    except PackageNotFoundError:
        made_by = "absent"
    # level_range at its default stays out, so recipes written before it existed keep their fingerprints
    default = opts.level_range == Options.model_fields["level_range"].default
    return {**opts.model_dump(mode="json", exclude={"level_range"} if default else None), "reasoning_gym": made_by}
