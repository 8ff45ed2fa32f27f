"""Run one stage through the store: reuse a completed version with the same fingerprint, or run the
stage in a staging folder and commit it as a new version (or record a failed attempt).

The fingerprint hashes the stage's name, its part of the recipe, its inputs' digests and the code
version. That single key is how a re-triggered flow (UI retry, CLI rerun, nightly run) resumes without
redoing finished stages, and it doubles as Prefect's task cache key.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import time
import traceback
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from stages.config import STAGES, Recipe
from stages.errors import RegimenError, StageStopped
from stages.store import Store, fingerprint, now_iso

STAGE_MODULES = {
    "sft": "stages.sft",
    "reward-dry-run": "stages.dry_run",
    "grpo-smoke": "stages.smoke",
    "grpo": "stages.grpo",
    "eval": "stages.evaluate",
}
TRAINING_STAGES = {"sft", "grpo-smoke", "grpo"}


@dataclass
class StageOutput:
    """What a stage returns. Files are whatever it wrote into `dirs.out`."""

    metrics: dict[str, float]
    status: str = "completed"  # or "failed": a gate's verdict, with a diagnosis
    diagnosis: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more manifest fields (verdict, resumed_from_step, ...)


@dataclass
class StageDirs:
    out: Path  # staging folder: becomes the version (model/, metrics.json, trajectories.jsonl)
    checkpoints: Path  # resumable work folder for Trainer checkpoints, kept across attempts


@dataclass
class StageResult:
    manifest: dict[str, Any]
    reused: bool
    wall_s: float
    path: Path

    @property
    def ref(self) -> dict[str, Any]:
        """How later stages name this result in their inputs."""
        m = self.manifest
        ref = {"stage": m["stage"], "version": m["version"], "fingerprint": m["fingerprint"], "path": str(self.path)}
        if (self.path / "model").is_dir():
            ref["model"] = str(self.path / "model")
        return ref


@cache
def code_version() -> str:
    """Package version plus a digest of the stage code, so a code change invalidates reuse."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg = version("regimen-rl")
    except PackageNotFoundError:
        pkg = "0+unknown"
    h = hashlib.sha256()
    for p in sorted(Path(__file__).parent.rglob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return f"{pkg}+{h.hexdigest()[:12]}"


def stage_module(stage: str):
    if stage not in STAGE_MODULES:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    return importlib.import_module(STAGE_MODULES[stage])


def input_digests(inputs: dict[str, Any]) -> dict[str, Any]:
    """Inputs as they enter the fingerprint: references by digest, never by local path."""
    out: dict[str, Any] = {}
    for key, value in inputs.items():
        if isinstance(value, dict) and "fingerprint" in value:
            out[key] = {"stage": value.get("stage"), "fingerprint": value["fingerprint"]}
        elif isinstance(value, list):
            out[key] = [input_digests(v) if isinstance(v, dict) else v for v in value]
        else:
            out[key] = value
    return out


def stage_fingerprint(stage: str, recipe: Recipe, inputs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    section = stage_module(stage).config_section(recipe)
    launch = launch_info(stage, recipe)
    key = fingerprint({"stage": stage, "config": section, "inputs": input_digests(inputs), "code": code_version(), "launch": launch})
    return key, section


def launch_info(stage: str, recipe: Recipe) -> dict[str, Any]:
    if stage in TRAINING_STAGES:
        return {"launcher": recipe.launcher, "num_processes": recipe.num_processes()}
    return {"launcher": "inprocess", "num_processes": 1}


def execute(
    stage: str,
    recipe: Recipe,
    inputs: dict[str, Any],
    store: Store,
    *,
    experiment: str | None = None,
    cycle: int = 1,
    round_: int = 1,
    reuse: bool = True,
) -> StageResult:
    """Reuse or run `stage`; raise StageStopped when a gate fails or the stage raises."""
    t0 = time.perf_counter()
    experiment = experiment or recipe.experiment
    key, section = stage_fingerprint(stage, recipe, inputs)
    if reuse and (found := store.find(experiment, stage, key)):
        return StageResult(found, True, time.perf_counter() - t0, store.local_path(found))

    manifest: dict[str, Any] = {
        "experiment": experiment,
        "stage": stage,
        "cycle": cycle,
        "round": round_,
        "fingerprint": key,
        "inputs": inputs,
        "config": section,
        "launch": launch_info(stage, recipe),
        "code_version": code_version(),
        "started_at": now_iso(),
    }
    dirs = StageDirs(out=store.staging_dir(experiment, stage), checkpoints=store.work_dir(experiment, stage, key))
    module = stage_module(stage)
    with store.running(experiment, stage, {"fingerprint": key, "cycle": cycle, "round": round_, "checkpoints": str(dirs.checkpoints)}):
        try:
            output: StageOutput = launch(stage, module, recipe, inputs, dirs)
        except RegimenError as exc:
            store.record_failure(dirs.out, {**manifest, "finished_at": now_iso()}, str(exc))
            raise
        except BaseException as exc:  # noqa: BLE001 - recorded, then re-raised as the stage's failure
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            store.record_failure(dirs.out, {**manifest, "finished_at": now_iso()}, detail)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise StageStopped(stage, f"the stage raised {detail}") from exc
    wall = time.perf_counter() - t0
    (dirs.out / "metrics.json").write_text(json.dumps(output.metrics, indent=1))
    manifest.update(output.extra)
    manifest.update({"metrics": output.metrics, "finished_at": now_iso(), "wall_s": round(wall, 3)})
    if output.status != "completed":
        store.record_failure(dirs.out, {**manifest, "diagnosis": output.diagnosis}, output.diagnosis or "failed")
        raise StageStopped(stage, output.diagnosis or "the stage reported failure")
    committed = store.commit(dirs.out, manifest)
    _clean_work(dirs.checkpoints)
    return StageResult(committed, False, wall, store.local_path(committed))


def launch(stage: str, module, recipe: Recipe, inputs: dict[str, Any], dirs: StageDirs) -> StageOutput:
    """Run the stage in this process, or under `accelerate launch` for training stages when asked."""
    if recipe.launcher == "accelerate" and stage in TRAINING_STAGES:
        from stages.launchers import run_with_accelerate

        return run_with_accelerate(stage, recipe, inputs, dirs)
    return module.run(recipe, inputs, dirs)


def _clean_work(path: Path) -> None:
    """Checkpoints are only for resuming: once the version is committed they are dead weight."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
