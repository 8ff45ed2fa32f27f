"""A stage the tests add to the registry (and nowhere else) to show the flow runs it where its role says:
a gate that checks the policy's folder holds weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from regimen.stages.core.contract import StageDirs, StageOutput

NAME = "weights-gate"
ROLE = "gate"
TRAINS = False
KEY_METRICS = ("weight_files",)


def config_section(recipe) -> dict[str, Any]:
    return {"model": recipe.model.name_or_path}


def run(recipe, inputs: dict[str, Any], dirs: StageDirs) -> StageOutput:
    found = sorted(p.name for p in Path(inputs["policy"]["model"]).glob("*.safetensors"))
    (dirs.out / "weights.txt").write_text("\n".join(found))
    if not found:
        return StageOutput({"weight_files": 0.0}, status="failed", diagnosis="the policy has no weights")
    return StageOutput({"weight_files": float(len(found))})
