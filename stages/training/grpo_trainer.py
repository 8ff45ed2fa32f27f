"""A `trl.GRPOTrainer` over the task's training prompts with the recipe's rewards and weights, the
callbacks the GRPO stages share (step counter for trajectories, wall clock, fault injection for tests),
and the training curve's summary numbers. Used by the smoke test and by full GRPO."""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from regimen.stages.recipe.trl import for_stage, stage_time
from regimen.stages.rewards import from_specs
from regimen.stages.rewards import identity as rewards_identity
from regimen.stages.rewards.registry import error_counts
from regimen.stages.tasks.registry import identity
from regimen.stages.training import limits, progress, trajectories
from regimen.stages.training.alike import AllAlike
from regimen.stages.training.checkpoints import MarkComplete
from regimen.stages.training.model import load_tokenizer
from regimen.stages.training.policy import peft_config

# Regimen's own rollout_func (training/reuse.py) is tested here against the TRL pinned in constraints.txt
warnings.filterwarnings("ignore", message="You are using 'rollout_func'", category=UserWarning)


class StepCounter(TrainerCallback):
    """Tells the trajectory recorder which step a scored batch belongs to."""

    def __init__(self, recorder: trajectories.Recorder):
        self.recorder = recorder

    def on_step_begin(self, args, state, control, **kwargs):
        self.recorder.step = state.global_step + 1


class Clock(TrainerCallback):
    """Adds `wall_s` (seconds since this process started training) to each log entry."""

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0 = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if hasattr(self, "t0") and state.log_history:
            # the Trainer stored a copy of `logs`
            state.log_history[-1]["wall_s"] = round(time.perf_counter() - self.t0, 3)


class RewardErrors(TrainerCallback):
    """Adds `rewards/<name>/errors` to each log entry: completions a guarded reward scored 0 because its scorer
    raised, counted since training began (the reward's own count, `registry.error_counts`)."""

    def __init__(self, fns: dict[str, Any]):
        self.fns, self.count = fns, error_counts
        self.start = error_counts(fns)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.log_history and self.start:
            for name, n in self.count(self.fns).items():
                state.log_history[-1][f"rewards/{name}/errors"] = n - self.start[name]


class FaultInjection(TrainerCallback):
    """Test hooks: `REGIMEN_FAULT=<stage>@<step>` raises after that step; `REGIMEN_KILL=<stage>@<step>`
    SIGKILLs the process there (a crash at a known step, for resume tests and benchmarks)."""

    def __init__(self, stage: str):
        def at(var: str) -> int | None:
            name, _, step = os.environ.get(var, "").partition("@")
            return int(step) if name == stage and step.isdigit() else None

        self.fault, self.kill = at("REGIMEN_FAULT"), at("REGIMEN_KILL")

    def on_step_end(self, args, state, control, **kwargs):
        if self.kill is not None and state.global_step >= self.kill:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault is not None and state.global_step >= self.fault:
            raise RuntimeError(f"injected fault (REGIMEN_FAULT) at step {state.global_step}")


def build_trainer(
    recipe,
    policy: str,
    output_dir: Path,
    recorder: trajectories.Recorder,
    *,
    stage: str = "grpo",
    callbacks: list | None = None,
    heldout: dict[str, Any] | None = None,
    sampler=None,
    alike: bool = False,
    watch=None,
    **overrides: Any,
):
    """A GRPOTrainer over the task's training prompts with the recipe's rewards and weights.

    `sampler` (`training/sampler.Sampler`, made by the stage, which loaded the task once) is how GRPO picks its
    prompts: a curriculum's stream (an IterableDataset read in order: `shuffle_dataset` off, and no batches skipped on
    resume, since its own state comes back from the checkpoint) or the rows TRL's sampler shuffles. Without one (the
    smoke test), the task's rows."""
    fns = from_specs(recipe.rewards)  # in the recipe's order, as the config's reward_weights (rewards[].weight)
    args = for_stage(recipe, "grpo", output_dir, **overrides)
    # every scored group with its rewards and advantages (groups.jsonl): which groups taught something
    recorder.groups = trajectories.Groups(
        list(recipe.reward_weights().values()), args.num_generations, getattr(args, "scale_rewards", "group")
    )
    recorder.listen(recorder.groups.listener(recorder), len(fns))
    if sampler is None:
        from regimen.stages.tasks.registry import load_task
        from regimen.stages.training import sampler as sampling

        task = load_task(recipe.data, heldout)  # training rows never include a frozen held-out prompt
        rows = task.train
        if recipe.environment is not None:  # TRL's tool loop works on conversations
            from regimen.stages.training.episodes import chat_rows

            rows = chat_rows(rows)
        sampler = sampling.rows(rows, "the smoke test: the training rows, shuffled")
    for key, (value, _) in stage_time(recipe, "grpo", args, streams=sampler.streams).items():
        setattr(args, key, value)  # what Regimen sets when the trainer is built (`regimen check` shows it)
    out_of_loss = _out_of_loss(recipe, args, recorder) if alike else None
    train, first = sampler.dataset, sampler.callbacks
    env: dict[str, Any] = {}
    if recipe.environment is not None:  # multi-turn episodes through TRL's own environment support
        from regimen.stages.environments.registry import factory

        env["environment_factory"] = factory(recipe.environment)
    if sampler.rollout is not None:  # the screen's answers reused as the group's first attempts (training/reuse.py)
        env["rollout_func"] = sampler.rollout
    trainer = trainer_class()(
        model=policy,
        **env,
        reward_funcs=[recorder.wrap(name, fn) for name, fn in fns.items()],
        args=args,
        train_dataset=train,
        processing_class=load_tokenizer(policy),
        peft_config=peft_config(recipe),
        callbacks=[
            *first,
            MarkComplete(),
            StepCounter(recorder),
            Clock(),
            RewardErrors(fns),
            FaultInjection(stage),
            *limits.callbacks(recipe, output_dir),
            *(callbacks or []),
        ],
    )
    trainer.out_of_loss = out_of_loss
    if sampler.rollout is not None:
        sampler.rollout.trainer = trainer  # the screen samples through it before TRL first calls rollout_func
    return progress.quiet(trainer, stage, watch), fns


def _out_of_loss(recipe, args, recorder):
    """curriculum.skip_all_alike: all-alike groups give no gradient (`training/alike.py`), told by the rewards."""
    weights = list(recipe.reward_weights().values())
    out = AllAlike(weights, args.num_generations, getattr(args, "multi_objective_aggregation", "sum_then_normalize"))
    recorder.listen(out.listener(), len(weights))
    return out


@functools.cache
def trainer_class():
    """TRL's `GRPOTrainer` with one public method overridden: `compute_loss` leaves out the samples of all-alike
    groups when `out_of_loss` (`training/alike.AllAlike`) is set; otherwise it is TRL's, unchanged."""
    from trl import GRPOTrainer

    class Trainer(GRPOTrainer):
        out_of_loss = None

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if self.out_of_loss is not None and self.model.training:
                inputs = self.out_of_loss.drop(inputs)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    return Trainer


def config_section(recipe) -> dict[str, Any]:
    """What GRPO and its smoke test share in their fingerprints: the data, the rewards, TRL's GRPO settings, the
    adapter and the model's precision (each adds its own part: the smoke test's steps, GRPO's probe and curriculum)."""
    return {
        "data": identity(recipe.data),
        "rewards": rewards_identity(recipe.rewards),
        "grpo": recipe.grpo,
        "peft": recipe.peft,
        "model": {"dtype": recipe.model.dtype, "merge_lora": recipe.model.merge_lora},
    }


def curve_metrics(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """Summary numbers of the training curve (the first and last logging windows, averages)."""
    logs = [h for h in log_history if "reward" in h]
    if not logs:
        return {}
    first, last = logs[0], logs[-1]

    def mean(key: str) -> float:
        vals = [h[key] for h in logs if key in h and h[key] is not None]
        return statistics.fmean(vals) if vals else math.nan

    out = {
        "train_reward_first": first["reward"],
        "train_reward_last": last["reward"],
        "train_reward_mean": mean("reward"),
        "reward_std_last": last.get("reward_std", math.nan),
        "frac_reward_zero_std_mean": mean("frac_reward_zero_std"),
        "frac_reward_zero_std_last": last.get("frac_reward_zero_std", math.nan),
        "kl_last": last.get("kl", math.nan),
        "loss_last": last.get("loss", math.nan),
    }
    for key in last:
        if key.startswith("rewards/") and key.endswith("/mean"):
            out[f"train_{key}"] = last[key]
    return out
