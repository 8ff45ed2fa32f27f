"""The one list of stages, in pipeline order. The runner, the flow, the CLI and the tests read it.

Adding a stage: write its module (see `contract.py`) and add it here; nothing else names stages.
Stage modules import only light things at module level, so importing this registry is cheap.
"""

from __future__ import annotations

from regimen.stages import dry_run, evaluate, grpo, sft, smoke
from regimen.stages.contract import Stage

ORDER: tuple[Stage, ...] = (sft, dry_run, smoke, grpo, evaluate)  # type: ignore[assignment]
STAGES: dict[str, Stage] = {s.NAME: s for s in ORDER}
NAMES: tuple[str, ...] = tuple(STAGES)


def get(name: str) -> Stage:
    try:
        return STAGES[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}; stages are {', '.join(NAMES)}") from None


def trains(name: str) -> bool:
    return get(name).TRAINS
