"""Run one stage through the store: reuse an intact completed version with the same fingerprint, or run
the stage in a staging folder and commit it as a new version (or record a failed attempt).

The fingerprint (`core/fingerprint.py`) is computed once per stage call by the caller or here; it is how a
re-triggered flow (UI retry, CLI rerun, nightly run) resumes without redoing finished stages (the store decides
reuse, never Prefect's task cache: every task runs with `NO_CACHE`). A version whose files no longer match their digests
is reported and never reused: the stage runs again."""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import shutil
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regimen.stages import registry
from regimen.stages.core import signals
from regimen.stages.core.contract import StageDirs, StageOutput
from regimen.stages.core.errors import RegimenError, StageInterrupted, StageStopped, StoreError
from regimen.stages.core.fingerprint import (
    code_version,
    content_digest,
    cpu_capability,
    digest,
    environment,
    input_digests,
)
from regimen.stages.recipe.trl import device_for
from regimen.stages.store import StageHandle, Store, now_iso

log = logging.getLogger("regimen.runner")


@dataclass
class StageResult:
    manifest: dict[str, Any]
    reused: bool
    wall_s: float
    path: Path
    damaged: list[dict[str, Any]] | None = None  # versions with this fingerprint that failed their digest check
    wait_s: float = 0.0  # time spent waiting for this machine's compute slot, apart from `wall_s` (the work)

    @property
    def ref(self) -> dict[str, Any]:
        """How later stages name this result in their inputs."""
        m = self.manifest
        ref = {"stage": m["stage"], "version": m["version"], "fingerprint": m["fingerprint"], "path": str(self.path)}
        if (self.path / "model").is_dir():
            ref["model"] = str(self.path / "model")
        if content := content_digest(m):
            ref["content"] = content
        return ref


def launch_info(stage: str, recipe) -> dict[str, Any]:
    """How a stage is launched, as it enters the fingerprint: DDP, FSDP or DeepSpeed (the accelerate
    config file's content) and extra launch options can change what a training stage produces."""
    if registry.trains(stage):
        info: dict[str, Any] = {"launcher": recipe.launcher, "num_processes": recipe.num_processes()}
        if recipe.launcher == "accelerate":
            from regimen.stages.core.fingerprint import file_digest

            acc = recipe.accelerate
            info.update(
                config_sha256=file_digest(acc.config_file) if acc.config_file else None, extra_args=list(acc.extra_args)
            )
        return info
    return {"launcher": "inprocess", "num_processes": 1}


def stage_key(stage: str, recipe, inputs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(fingerprint, config section) of `stage` for this recipe and these inputs."""
    module = registry.get(stage)
    section = (
        module.config_section(recipe, inputs) if _takes_inputs(module.config_section) else module.config_section(recipe)
    )
    key = digest(
        {
            "stage": stage,
            "config": section,
            "inputs": input_digests(inputs),
            "code": code_version(module.__name__),
            "launch": launch_info(stage, recipe),
        }
    )
    return key, section


def _takes_inputs(fn) -> bool:
    return len(inspect.signature(fn).parameters) >= 2


@dataclass(frozen=True)
class StageCall:
    """What the runner is asked to do: reuse or run `stage` of `experiment` on these inputs. The experiment
    comes from whoever started the run (the CLI, a deployment's parameters), never from the recipe."""

    stage: str
    recipe: Any
    inputs: dict[str, Any]
    experiment: str
    cycle: int = 1
    round: int = 1
    reuse: bool = True
    key: tuple[str, dict[str, Any]] | None = None  # (fingerprint, config section), when the caller computed it
    slot: Callable[[], Any] | None = field(default=None, compare=False, repr=False)  # held while the stage computes
    progress: Callable[[str, dict[str, Any]], None] | None = field(default=None, compare=False, repr=False)

    def manifest(self, fp: str, section: dict[str, Any]) -> dict[str, Any]:
        """The manifest's first part, as it is before the stage runs."""
        return {
            "experiment": self.experiment,
            "stage": self.stage,
            "role": registry.get(self.stage).ROLE,  # what retention keeps an evaluation by (not its inputs' shape)
            "cycle": self.cycle,
            "round": self.round,
            "fingerprint": fp,
            "inputs": self.inputs,
            "config": section,
            "launch": launch_info(self.stage, self.recipe),
            "code_version": code_version(registry.get(self.stage).__name__),
            "libraries": environment(),  # the resolved versions (those that compute results are in code_version too)
            "started_at": now_iso(),
        }


def execute(call: StageCall, store: Store) -> StageResult:
    """Reuse or run `call.stage` through the store's handle on it; raise StageStopped when a gate fails or
    the stage raises. `call.slot`, when given, makes a context manager held while the stage computes
    (never while it is reused)."""
    t0 = time.perf_counter()
    fp, section = call.key or stage_key(call.stage, call.recipe, call.inputs)
    handle = store.stage(call.experiment, call.stage)
    damaged: list[dict[str, Any]] = []
    if call.reuse:
        found, damaged = handle.find_intact(fp)
        if damaged:
            try:
                handle.note_damaged(damaged)  # so a plain `regimen status` names them
            except StoreError as exc:
                log.warning("could not record the damaged versions for status: %s", exc)
        for d in damaged:
            log.warning(
                "%s v%s is damaged (%s): not reused; the stage runs again",
                call.stage,
                d["version"],
                ", ".join(d["problems"][:3]),
            )
        if found:
            return StageResult(found, True, time.perf_counter() - t0, handle.local_path(found))

    with contextlib.ExitStack() as held:
        if call.slot:
            waited = time.perf_counter()
            try:
                held.enter_context(call.slot())
            except BaseException as exc:  # Ctrl-C, SIGTERM or a cancel while waiting: say so, exit 130/143
                if how := interruption(exc):
                    _record_failure(
                        handle,
                        None,
                        {
                            "experiment": call.experiment,
                            "stage": call.stage,
                            "cycle": call.cycle,
                            "round": call.round,
                            "fingerprint": fp,
                            "started_at": now_iso(),
                            "finished_at": now_iso(),
                            "interrupted": True,
                        },
                        f"interrupted ({how}) while waiting for this machine's compute slot",
                    )
                    raise StageInterrupted(
                        call.stage,
                        how,
                        "interrupted while waiting for this machine's compute slot: nothing of the stage ran",
                    ) from exc
                raise
            # waiting is not working: the wait is reported apart, the stage's wall time starts once the slot is held
            wait = time.perf_counter() - waited
            return _run(call, handle, call.manifest(fp, section), damaged, t0 + wait, wait)
        return _run(call, handle, call.manifest(fp, section), damaged, t0)


def _run(
    call: StageCall,
    handle: StageHandle,
    manifest: dict[str, Any],
    damaged: list[dict[str, Any]],
    t0: float,
    wait: float = 0.0,
) -> StageResult:
    stage, recipe, fp = call.stage, call.recipe, manifest["fingerprint"]
    module = registry.get(stage)
    dirs = StageDirs(out=handle.staging_dir(), checkpoints=handle.work_dir(fp), progress=call.progress)
    if module.TRAINS:  # a remote store's newest checkpoint, when this host has nothing as new (another host trained)
        from regimen.stages.training.checkpoints import fetch_remote

        fetch_remote(dirs.checkpoints)
    device = _device(recipe, module)
    manifest["device"] = device["device"]
    # which float kernels torch chose: a tiny model's training depends on it
    manifest["torch_cpu_capability"] = cpu_capability()
    held = {
        k: {f: v.get(f) for f in ("stage", "version", "fingerprint")}
        for k, v in call.inputs.items()
        if isinstance(v, dict)
    }
    running = {"fingerprint": fp, "cycle": call.cycle, "round": call.round, "checkpoints": str(dirs.checkpoints)}
    with handle.running({**running, "inputs": held}):  # gc never removes what a running stage holds
        output = _launch_recorded(call, module, dirs, handle, manifest)
    wall = time.perf_counter() - t0
    (dirs.out / "metrics.json").write_text(json.dumps(output.metrics, indent=1))
    manifest.update(output.extra)
    manifest.update({"metrics": output.metrics, "finished_at": now_iso(), "wall_s": round(wall, 3)})
    if wait:
        manifest["wait_s"] = round(wait, 3)  # waiting for the machine's compute slot: not the stage's work
    if device["cuda"]:
        import torch

        manifest["peak_gpu_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    if output.status != "completed":
        _record_failure(handle, dirs.out, {**manifest, "diagnosis": output.diagnosis}, output.diagnosis or "failed")
        raise StageStopped(stage, output.diagnosis or "the stage reported failure", output.extra.get("guard_stop"))
    committed = _commit(handle, dirs, manifest)
    handle.drop_work(fp)  # checkpoints are only for resuming (here and in a remote store's bucket)
    return StageResult(committed, False, wall, handle.local_path(committed), damaged or None, wait)


def _commit(handle: StageHandle, dirs: StageDirs, manifest: dict[str, Any]) -> dict[str, Any]:
    """The version committed; when the store refuses (a bucket down, full, or its credentials revoked mid-run), the
    attempt is recorded (in the store, else on this host: `_record_failure`) and the stop says what the run left."""
    try:
        return handle.commit(dirs.out, manifest)
    except StoreError as exc:
        left = handle.left_behind(manifest["stage"])
        _record_failure(handle, None, {**manifest, "finished_at": now_iso()}, f"commit refused: {exc}")
        raise StoreError(
            f"{exc}; the stage had finished, its outputs stay on this host ({dirs.out}); in the store it left {left}; "
            "a rerun trains the stage again (or resumes it from its last checkpoint)"
        ) from None


def _launch_recorded(
    call: StageCall, module, dirs: StageDirs, handle: StageHandle, manifest: dict[str, Any]
) -> StageOutput:
    """The stage's output; when it raises, the failed attempt is recorded and the error said as the
    stage's: StageInterrupted (Ctrl-C, SIGTERM, cancel), StageStopped (anything else), SystemExit as is."""
    try:
        with signals.noticed():  # a SIGTERM that a finaliser swallowed still stops the stage (core/signals.py)
            output = _launch(call.stage, module, call.recipe, call.inputs, dirs)
            signals.deliver()
        return output
    except RegimenError as exc:
        from regimen.stages.run.launcher import LentToMachineZero

        # machine_rank >= 1 ran its ranks to the end: no failed attempt, nothing to commit
        if isinstance(exc, LentToMachineZero):
            raise
        _record_failure(handle, dirs.out, {**manifest, "finished_at": now_iso()}, str(exc))
        raise
    except BaseException as exc:  # noqa: BLE001 - recorded, then re-raised as the stage's failure
        detail = (
            _out_of_space(dirs, handle.cache_dir()) or "".join(traceback.format_exception_only(type(exc), exc)).strip()
        )
        interrupted = interruption(exc)
        if interrupted:
            detail = f"interrupted ({interrupted})"
        _record_failure(
            handle, dirs.out, {**manifest, "finished_at": now_iso(), "interrupted": bool(interrupted)}, detail
        )
        if interrupted:
            raise StageInterrupted(call.stage, interrupted, resume_hint(dirs.checkpoints)) from exc
        if isinstance(exc, SystemExit):
            raise
        if detail.startswith("no space left"):
            raise StageStopped(call.stage, detail) from exc
        raise StageStopped(call.stage, f"the stage raised {detail}") from exc


def _device(recipe, module) -> dict[str, Any]:
    """Where this stage computes (recorded in its manifest); on CUDA the peak-memory counter is reset."""
    if recipe.launcher == "accelerate" and module.TRAINS:
        return {"device": f"accelerate launch x{recipe.num_processes()}", "cuda": False}

    device = device_for(recipe)
    if device.startswith("cuda"):
        import torch

        torch.cuda.reset_peak_memory_stats()
    return {"device": device, "cuda": device.startswith("cuda")}


def interruption(exc: BaseException) -> str | None:
    """'Ctrl-C', 'SIGTERM' or 'cancelled' when `exc` is an interruption rather than a failure."""
    if isinstance(exc, KeyboardInterrupt):
        return "Ctrl-C"
    name = type(exc).__name__
    if name == "TerminationSignal":  # prefect.exceptions.TerminationSignal: SIGTERM while a flow runs
        return "SIGTERM"
    if name in ("CancelledError", "Abort"):
        return "cancelled"
    return None


def _out_of_space(dirs: StageDirs, cache: Path) -> str | None:
    """A write failure is often the disk (torch reports it as 'file write failed'): say so plainly."""
    for path in (dirs.checkpoints, dirs.out, cache):
        try:
            if shutil.disk_usage(path).free < 256 * 1024:
                return (
                    f"no space left on the device holding {path} (free some space; a rerun resumes from the last "
                    "complete checkpoint)"
                )
        except OSError:
            continue
    return None


def resume_hint(checkpoints: Path) -> str:
    from regimen.stages.training.checkpoints import last_checkpoint

    last = last_checkpoint(checkpoints)
    return f"rerun resumes from step {last[0]}" if last else "rerun starts the stage over (no checkpoint yet)"


def _record_failure(handle: StageHandle, staging: Path | None, manifest: dict[str, Any], error: str) -> None:
    """Keep the failed attempt; recording is best-effort and never hides the stage's own error."""
    try:
        handle.record_failure(staging, manifest, error)
    except Exception as exc:  # noqa: BLE001 - e.g. a read-only store or a full disk: keep the record elsewhere, keep the real error
        kept = _record_elsewhere(manifest, error)
        log.error(
            "could not record the failed attempt of %s in the store (%s); %s; the stage's error was: %s",
            manifest["stage"],
            str(exc)[:200],
            f"recorded in {kept} instead" if kept else "not recorded anywhere",
            error,
        )


def _record_elsewhere(manifest: dict[str, Any], error: str) -> str | None:
    """A failed attempt the store could not take, kept in the user's cache (`$REGIMEN_CACHE/unrecorded`)."""
    try:
        base = Path(os.environ.get("REGIMEN_CACHE", Path.home() / ".cache" / "regimen")) / "unrecorded"
        base.mkdir(parents=True, exist_ok=True)
        path = (
            base / f"{manifest.get('experiment')}-{manifest['stage']}-{time.strftime('%Y%m%dT%H%M%S')}-"
            f"{uuid.uuid4().hex[:6]}.json"
        )
        path.write_text(
            json.dumps({**manifest, "status": "failed", "error": error, "failed_at": now_iso()}, indent=1, default=str)
        )
        return str(path)
    except OSError:
        return None


def _launch(stage: str, module, recipe, inputs: dict[str, Any], dirs: StageDirs) -> StageOutput:
    """Run the stage in this process, or under `accelerate launch` for training stages when asked."""
    if recipe.launcher == "accelerate" and module.TRAINS:
        from regimen.stages.run.launcher import run_with_accelerate

        return run_with_accelerate(stage, recipe, inputs, dirs)
    return module.run(recipe, inputs, dirs)
