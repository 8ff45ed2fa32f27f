"""The stage contract: what every stage is, takes and returns.

A stage is a module with a name, its role in the cycle, the part of the recipe that can change its
result, whether it trains (training stages may run under `accelerate launch`), the metrics a person looks
at first, and

    run(recipe, inputs, dirs) -> StageOutput

`inputs` are references to earlier artifacts (`{"policy": {"stage", "version", "fingerprint", "model"}}`;
also `heldout`, the experiment's frozen held-out set, and for train stages `pass_rates`, the version whose
`pass_rates.jsonl` the curriculum starts from: the dry run's, or the round before's);
`dirs.out` becomes the version folder, `dirs.checkpoints` is the resumable work folder. Stages import
shared pieces (training, rewards, tasks), never each other and never the runner; `registry.py` lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

Role = Literal["teach", "gate", "train", "judge"]
ROLES: tuple[str, ...] = ("teach", "gate", "train", "judge")
"""Where the flow runs a stage, in registry order within each role:

- teach: once per cycle, when the recipe has a teacher; makes the cycle's starting policy (its metrics
  carry `heldout_accuracy`, the cycle's baseline). Each teach stage starts from the previous one's policy.
- gate: once per cycle, on that policy, before any training round; a gate stops the flow by returning
  status "failed" with a diagnosis.
- train: every round, each from the previous one's policy; the last one's policy is the round's result.
- judge: exactly one; measures a policy on held-out data (`heldout_accuracy`), once per round and, when
  the cycle has no teacher, once at its start (and after the teach stages when they already meet the
  target: `cycle.stop_when_taught`). The flow decides what comes next from its history.
"""


@dataclass
class StageOutput:
    """What a stage returns. Files are whatever it wrote into `dirs.out`."""

    metrics: dict[str, float]
    status: str = "completed"  # or "failed": a gate's verdict, with a diagnosis
    diagnosis: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more manifest fields (resumed_from_step, warning, ...)


@dataclass
class StageDirs:
    out: Path  # staging folder: becomes the version (model/, metrics.json, trajectories.jsonl)
    checkpoints: Path  # resumable work folder for Trainer checkpoints, kept across attempts
    progress: Callable[[str, dict[str, Any]], None] | None = (
        None  # live updates for whoever watches (the flow shows them in the UI)
    )


class Stage(Protocol):
    """What the registry holds: a stage module satisfies this structurally."""

    NAME: str  # as the store, the flow and the CLI name it
    ROLE: Role  # where the flow runs it (ROLES)
    TRAINS: bool  # runs a Trainer (and so may run under `launcher: accelerate`)
    KEY_METRICS: tuple[str, ...]  # shown first in summaries

    def config_section(self, recipe: Any) -> dict[str, Any]:
        """The part of the resolved recipe that can change this stage's result (enters its fingerprint).
        A stage may take the inputs too (`config_section(recipe, inputs)`), when which part of the recipe
        matters depends on them (evaluation on a frozen held-out set leaves the training data out)."""

    def run(self, recipe: Any, inputs: dict[str, Any], dirs: StageDirs) -> StageOutput:
        """Do the work; write files into `dirs.out`."""

    # Optional: `applies(recipe) -> bool` (the stage runs only for recipes that configure it: sft needs a
    # teacher, distill a `distill:` section) and `door(recipe)` (its own checks at the run's preflight,
    # before anything is written; raises InputError naming the field).
