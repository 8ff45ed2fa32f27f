"""Stage 4, grpo: full GRPO with `trl.GRPOTrainer` and a KL penalty (`beta > 0`).

Trainer checkpoints go to the stage's work folder every `save_steps`; a rerun resumes from the last good
one and records `resumed_from_step`. A held-out probe runs inside training (`training/probe.py`): its
curve is logged beside the training reward, the reward-hacking guard reads both as training goes and
stops the stage when the reward climbs while the probe does not, and the version keeps the best-probing
policy (`probe.keep: best`, the default) rather than the last. Rewards with weight 0 are monitors: TRL
computes and logs them, and they do not train. The training curve (`train_log.jsonl`) and the batches TRL
scored (`trajectories.jsonl`) are kept.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regimen.stages.core.contract import StageOutput
from regimen.stages.decide.verdicts import GUARD_VERDICTS, HACKING, SHARPENING, describe
from regimen.stages.rewards import GAMEABLE_WARNING, gameable_names
from regimen.stages.tasks.registry import load_task
from regimen.stages.training import sampler, trajectories
from regimen.stages.training.model import load_tokenizer
from regimen.stages.training.pass_rates import PassRates
from regimen.stages.training.policy import is_main_process, save_policy

NAME = "grpo"
ROLE = "train"
TRAINS = True
KEY_METRICS = (
    "train_reward_first",
    "train_reward_last",
    "kl_last",
    "frac_reward_zero_std_mean",
    "best_step",
    "completions_per_s",
)


def config_section(recipe) -> dict[str, Any]:
    from regimen.stages.training.grpo_trainer import config_section as shared

    return {
        **shared(recipe),
        "probe": {
            **recipe.probe.model_dump(mode="json"),
            "target": recipe.cycle.target if recipe.probe.stop_at_target else None,
            "guard": recipe.cycle.guard.model_dump(mode="json"),
            "metric": recipe.eval.metric,
            "max_new_tokens": recipe.max_new_tokens(),
        },
        "curriculum": sampler.config(recipe),
    }


def barrier(trainer) -> None:
    """Wait for every rank under `accelerate launch` (a no-op in one process)."""
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None and accelerator.num_processes > 1:
        accelerator.wait_for_everyone()


@dataclass
class Built:
    """What `build` makes and the later steps read: the trainer and what watches and feeds it."""

    trainer: Any
    fns: list[Any]  # the reward functions, as TRL calls them
    probe: Any  # training/probe.HeldoutProbe: the held-out curve, the guard, the best-probing policy
    recorder: Any  # training/trajectories.Recorder: the batches TRL scored
    sampler: Any  # training/sampler.Sampler: how GRPO picks its prompts (a curriculum's stream, or the rows)


def run(recipe, inputs: dict[str, Any], dirs) -> StageOutput:
    """Build the trainer, train (resuming), measure, hear the guard's verdict, keep the best policy."""
    built = build(recipe, inputs, dirs)
    resumed, train_s = train(built, dirs)
    metrics, extra = measure(recipe, built, resumed, train_s)
    write_logs(built, dirs)
    if stopped := guard_verdict(built, metrics, extra):
        return stopped
    keep_best(recipe, built, dirs, metrics, extra)
    return StageOutput(metrics, extra=extra)


def build(recipe, inputs: dict[str, Any], dirs) -> Built:
    """The task's rows (as chats for an environment), the held-out probe, the curriculum, the trainer."""
    from regimen.stages.training.grpo_trainer import build_trainer
    from regimen.stages.training.probe import HeldoutProbe, probe_rows

    policy = inputs["policy"]["model"]
    recorder = trajectories.Recorder()
    task = load_task(recipe.data, inputs.get("heldout"))
    probe = HeldoutProbe(
        recipe,
        probe_rows(task.heldout, recipe.probe.prompts, recipe.data.seed),
        load_tokenizer(policy),
        dirs.checkpoints,
        progress=getattr(dirs, "progress", None),
        train_rows=probe_rows(task.train, recipe.probe.train_prompts, recipe.data.seed + 1),
    )
    seen = PassRates.read((inputs.get("pass_rates") or {}).get("path"))  # the dry run's (or the round before's) table
    train_rows = task.train
    if recipe.environment is not None:  # TRL's tool loop works on conversations
        from regimen.stages.training.episodes import chat_rows

        train_rows = chat_rows(train_rows)
    prompts = sampler.build(recipe, task, train_rows, seen, recorder)
    trainer, fns = build_trainer(
        recipe,
        policy,
        dirs.checkpoints,
        recorder,
        callbacks=[probe],
        sampler=prompts,
        alike=recipe.curriculum.skip_all_alike,
        watch=getattr(dirs, "progress", None),
    )
    probe.trainer = trainer
    return Built(trainer, fns, probe, recorder, prompts)


def train(built: Built, dirs) -> tuple[int, float]:
    """Train from the last good checkpoint (if any): (the step it resumed from, seconds spent)."""
    from regimen.stages.training.checkpoints import train_resumable

    trainer, probe = built.trainer, built.probe
    t0 = time.perf_counter()
    keepers = [cb for cb in trainer.callback_handler.callbacks if callable(getattr(cb, "restore", None))]
    resumed = train_resumable(
        trainer,
        dirs.checkpoints,
        trainer.args.max_steps,
        on_finished=probe.recheck,
        restore=lambda path: [cb.restore(path) for cb in keepers],
    )
    return resumed, time.perf_counter() - t0


def measure(recipe, built: Built, resumed: int, train_s: float) -> tuple[dict[str, float], dict[str, Any]]:
    """The stage's metrics (the curves', the pace's, the probe's, the curriculum's) and its manifest extras."""
    from regimen.stages.training.grpo_trainer import curve_metrics
    from regimen.stages.training.probe import HeldoutProbe

    trainer, probe = built.trainer, built.probe
    history = trainer.state.log_history
    curve = HeldoutProbe.curve(history)
    last_step = trainer.state.global_step
    extra: dict[str, Any] = {"resumed_from_step": resumed, "heldout_probe": curve}
    metrics = curve_metrics(history)
    steps_run = last_step - resumed
    metrics.update(
        {
            "steps": float(last_step),
            "steps_run": float(steps_run),
            "beta": float(trainer.args.beta),
            "train_s": train_s,
            "probe_s": probe.probe_s,
            "completions_per_s": steps_run
            * trainer.args.generation_batch_size
            / trainer.args.steps_per_generation
            / train_s
            if train_s > 0 and steps_run
            else 0.0,
        }
    )
    if recipe.environment is not None:  # tool calls past a bound in the steps this process ran (environments/bounds)
        metrics.update({"tool_timeouts": 0.0, "tool_truncated": 0.0, **built.recorder.tool_bounds})
    if curve:
        metrics["probe_first"] = curve[0]["heldout_accuracy"]
        metrics["probe_last"] = curve[-1]["heldout_accuracy"]
    if probe.stopped_at_target is not None:
        extra["stopped_at_target"] = probe.stopped_at_target
        metrics["stopped_at_target"] = float(probe.stopped_at_target)
    extra["sampler"] = built.sampler.manifest()  # which sampler picked GRPO's prompts, and why
    if (summary := built.sampler.summary()) is not None:
        extra["curriculum"] = summary
        metrics.update({f"curriculum_{k}": float(v) for k, v in summary.items() if isinstance(v, (int, float))})
        metrics.update({f"curriculum_band_{k}": float(v) for k, v in summary.get("bands", {}).items()})
    elif built.sampler.wanted:
        extra["note"] = built.sampler.reason
    if gameable := gameable_names(built.fns):
        extra["warning"] = GAMEABLE_WARNING.format(names=", ".join(gameable))
    return metrics, extra


def write_logs(built: Built, dirs) -> None:
    """The training curve, the scored batches and the pass rates, written by the main process."""
    rates = built.sampler.rates
    if is_main_process(built.trainer):
        with open(Path(dirs.out) / "train_log.jsonl", "w") as fh:
            for h in built.trainer.state.log_history:
                fh.write(json.dumps(h) + "\n")
        trajectories.write(dirs.out, built.recorder.rows())
        if built.recorder.groups is not None:
            built.recorder.groups.write(dirs.out)
        if rates is not None:
            rates.write(dirs.out)


def guard_verdict(built: Built, metrics: dict[str, float], extra: dict[str, Any]) -> StageOutput | None:
    """What the reward-hacking guard found, into the manifest; the stage's failure when a finding stopped it."""
    probe = built.probe
    # what stopped it, else the whole curves' reading
    found = probe.fired or probe.final_look(built.trainer.state.log_history) or probe.warned or probe.noted
    if found:
        # hacking, overfitting or sharpening: what the evaluation's verdict is told
        extra["guard_finding"] = found["finding"]
        extra["guard_evidence"] = found
    if probe.noted and not probe.fired and not probe.warned:
        extra["guard_note"] = (
            f"the guard saw sharpening at step {probe.noted['step']} (harmless; training went on): "
            f"{describe(SHARPENING)}"
        )
    if probe.warned and not probe.fired:
        extra["guard_warning"] = probe.warning
        extra["guard_warned_at_step"] = probe.warned["step"]
    if not probe.fired:
        return None
    extra["guard_fired_at_step"] = probe.fired["step"]  # a finding that stops the stage (hacking by default)
    metrics["guard_fired_at_step"] = float(probe.fired["step"])
    if not probe.fired_and_stopped():
        return None
    fired, kind = probe.fired, probe.fired["finding"]
    verdict = GUARD_VERDICTS[kind]
    extra["guard_stop"] = fired  # what stopped it, as data: the flow reads it from `StageStopped.finding`
    reason = (
        f"{verdict}: at GRPO step {fired['step']} of {built.trainer.state.max_steps} the training reward had risen "
        f"{fired['train_reward_rise']:+.3f} (from {fired['train_reward_start']:.3f} to "
        f"{fired['train_reward_now']:.3f}) while held-out probe accuracy changed {fired['heldout_gain']:+.3f} (from "
        f"{fired['heldout_accuracy_start']:.3f} "
        f"to {fired['heldout_accuracy_now']:.3f}); training stopped: {describe(kind)}"
        + (" (the high-reward wrong answers are in the failed attempt's trajectories)" if kind == HACKING else "")
    )
    return StageOutput(metrics, status="failed", diagnosis=reason, extra=extra)


def keep_best(recipe, built: Built, dirs, metrics: dict[str, float], extra: dict[str, Any]) -> None:
    """Save the best-probing policy (`probe.keep: best`, when the probe's curve vouches for it and the
    model is whole on each rank), else the last one, as the version's model."""
    from regimen.stages.training.probe import restore_best

    trainer, probe = built.trainer, built.probe
    last_step = trainer.state.global_step
    barrier(trainer)  # every rank reads best/ only once rank 0 has finished writing it
    best = probe.best()
    if (
        best is not None
        and {"step": best["step"], "heldout_accuracy": best["heldout_accuracy"]} not in extra["heldout_probe"]
    ):
        best = None  # a best/ this run's probe curve does not vouch for is never loaded
    kept = "last"
    if recipe.probe.keep == "best" and best is not None and not probe.sharded:
        if (
            best["step"] != last_step
            and restore_best(trainer.accelerator.unwrap_model(trainer.model), probe.best_dir) is not None
        ):
            kept = "best"
        elif best["step"] == last_step:
            kept = "best"
    elif recipe.probe.keep == "best" and probe.sharded:
        extra["note"] = (
            "the model is sharded (FSDP/DeepSpeed): the version keeps the last step, not the best-probing one"
        )
    save_policy(trainer, trainer.processing_class, Path(dirs.out) / "model", merge=recipe.model.merge_lora)
    barrier(trainer)
    if is_main_process(trainer):
        shutil.rmtree(probe.best_dir, ignore_errors=True)
    extra["kept"] = kept
    if kept == "best":
        metrics["best_step"] = float(best["step"])
        metrics["best_probe_accuracy"] = float(best["heldout_accuracy"])
        extra.update({"best_step": best["step"], "best_probe_accuracy": best["heldout_accuracy"]})
