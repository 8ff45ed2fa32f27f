"""The one list of stages, in pipeline order. The runner, the flow, the CLI and the tests read it.

Adding a stage: write its module (see `core/contract.py`) and add it here; nothing else names stages. The
flow runs each stage where its `ROLE` says (`contract.ROLES`), in this order within the role.
Stage modules import only light things at module level, so importing this registry is cheap.
"""

from __future__ import annotations

from regimen.stages import distill, dry_run, evaluate, grpo, sft, smoke
from regimen.stages.core.contract import ROLES, Stage

ORDER: tuple[Stage, ...] = (sft, distill, dry_run, smoke, grpo, evaluate)  # type: ignore[assignment]
STAGES: dict[str, Stage] = {s.NAME: s for s in ORDER}
NAMES: tuple[str, ...] = tuple(STAGES)


def check(order: tuple[Stage, ...]) -> None:
    """A registry the flow can run: unique names, known roles, one judge, something that trains."""
    names = [s.NAME for s in order]
    if len(set(names)) != len(names):
        raise ValueError(f"stage names repeat: {names}")
    for s in order:
        if getattr(s, "ROLE", None) not in ROLES:
            raise ValueError(
                f"stage {s.NAME!r}: ROLE must be one of {', '.join(ROLES)}, not {getattr(s, 'ROLE', None)!r}"
            )
    if [s.ROLE for s in order].count("judge") != 1:
        raise ValueError("exactly one stage must have ROLE 'judge'")
    if not any(s.ROLE == "train" for s in order):
        raise ValueError("at least one stage must have ROLE 'train'")


check(ORDER)


def in_role(role: str) -> tuple[str, ...]:
    """Names of the stages with this role, in pipeline order."""
    return tuple(s.NAME for s in ORDER if s.ROLE == role)


def judge() -> str:
    [name] = in_role("judge")
    return name


def get(name: str) -> Stage:
    try:
        return STAGES[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}; stages are {', '.join(NAMES)}") from None


def trains(name: str) -> bool:
    return get(name).TRAINS


def applies(name: str, recipe) -> bool:
    """Whether the stage runs for this recipe (a stage without `applies` always does)."""
    check = getattr(get(name), "applies", None)
    return bool(check(recipe)) if callable(check) else True


def names_for(recipe) -> tuple[str, ...]:
    """The stages that run for this recipe, in pipeline order (those that apply)."""
    return tuple(n for n in NAMES if applies(n, recipe))


def doors(recipe) -> dict[str, object]:
    """The stages' own checks at the run's door (`door(recipe)`, for the stages that apply): what each
    returned. A stage's door raises InputError naming the field."""
    return {s.NAME: s.door(recipe) for s in ORDER if callable(getattr(s, "door", None)) and applies(s.NAME, recipe)}
