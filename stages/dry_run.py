"""Stage 2, reward-dry-run: first attack the rewards (`rewards/audit.py`: made-up completions built from the rows'
reference answers; a reward that pays without the answer stops the run here, `dry_run.gameable: stop`), then
sample the current policy as GRPO will (group size, temperature, length), score the samples with the recipe's
rewards, and stop before RL when GRPO could learn nothing: hopeless (mean reward ~0), trivial (~1), or groups
without variance (every attempt scores alike)."""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import Any

from regimen.stages.core.contract import StageOutput
from regimen.stages.rewards import GAMEABLE_WARNING, Scorer, columns, gameable_names
from regimen.stages.rewards import identity as rewards_identity
from regimen.stages.rewards.audit import MAX_ROWS, audit, summary
from regimen.stages.rewards.scoring import completion_ids
from regimen.stages.tasks import shuffled
from regimen.stages.tasks.registry import identity, load_task
from regimen.stages.training import trajectories
from regimen.stages.training.episodes import complete, transcript
from regimen.stages.training.model import load_policy
from regimen.stages.training.pass_rates import PassRates, row_id

log = logging.getLogger("regimen.dry_run")

NAME = "reward-dry-run"
ROLE = "gate"
TRAINS = False
KEY_METRICS = ("mean_reward", "reward_std", "frac_reward_zero_std")
GENERATION_FIELDS = (
    "num_generations",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_completion_length",
    "repetition_penalty",
    "generation_kwargs",
    "seed",
)
"""GRPO's sampling settings: the dry run samples with all of them, as GRPO will."""


def config_section(recipe) -> dict[str, Any]:
    return {
        "data": identity(recipe.data),
        "rewards": rewards_identity(recipe.rewards),
        "dry_run": recipe.dry_run.model_dump(mode="json"),
        "generation": {k: recipe.grpo_value(k) for k in GENERATION_FIELDS},
        "dtype": recipe.model.dtype,
    }


def group_stats(totals: list[float], group: int) -> dict[str, float]:
    """Mean and spread of the weighted reward, and the share of groups where every attempt scored the same.
    Samples no reward scored (NaN totals) are left out; a group with none scored counts as no variance."""
    finite = [t for t in totals if math.isfinite(t)]
    groups = [[x for x in totals[i : i + group] if math.isfinite(x)] for i in range(0, len(totals), group)]
    zero = sum(1 for g in groups if len({round(x, 9) for x in g}) <= 1)
    scored = [g for g in groups if g]
    return {
        "mean_reward": statistics.fmean(finite) if finite else math.nan,
        "reward_std": statistics.pstdev(finite) if len(finite) > 1 else 0.0,
        "mean_group_std": statistics.fmean(statistics.pstdev(g) if len(g) > 1 else 0.0 for g in scored)
        if scored
        else 0.0,
        "frac_reward_zero_std": zero / len(groups) if groups else 1.0,
        "unscored": float(len(totals) - len(finite)),
    }


def diagnose(stats: dict[str, float], cfg, *, prompts: int, group: int, temperature: float) -> str | None:
    """A diagnosis a person can act on, or None when GRPO has something to learn from."""
    mean, zero = stats["mean_reward"], stats["frac_reward_zero_std"]
    shape = f"{prompts} prompts x {group} attempts at temperature {temperature}"
    if math.isnan(mean):
        return f"no reward scored any of {shape} (all None): check that the data has the columns the rewards need"
    if mean < cfg.min_mean_reward:
        return (
            f"mean reward {mean:.3f} over {shape} is below dry_run.min_mean_reward={cfg.min_mean_reward}: the task is "
            f"too hard "
            "for this policy; run more SFT (sft.max_steps), use easier prompts, or add an easier reward (e.g. format) "
            "beside the hard one"
        )
    if mean > cfg.max_mean_reward:
        return (
            f"mean reward {mean:.3f} over {shape} is above dry_run.max_mean_reward={cfg.max_mean_reward}: the task is "
            f"trivial for this policy; nothing is left to learn — use harder prompts"
        )
    if zero > cfg.max_frac_zero_std:
        return (
            f"{zero:.0%} of groups have no reward variance ({shape}; limit "
            f"dry_run.max_frac_zero_std={cfg.max_frac_zero_std}): "
            "GRPO learns only from groups whose attempts differ; use larger groups (grpo.num_generations) or a higher "
            "grpo.temperature"
        )
    return None


def _audit(recipe, rows: list[dict[str, Any]], reference_of) -> dict[str, Any]:
    """The reward audit on training rows (said line by line in the log); skipped for episodes."""
    if recipe.environment is not None:
        return {
            "skipped": "episodes: the rewards judge an environment's episodes, made-up text cannot stand in for them",
            "findings": [],
            "seconds": 0.0,
        }
    began = time.perf_counter()
    cfg = recipe.dry_run
    multi_line = any("\n" in str(reference_of(r) or "").strip() for r in rows[:MAX_ROWS])
    scorer = Scorer(recipe)  # its own instances: a reward that keeps state is left as GRPO gets it
    report = audit(
        scorer.fns,
        scorer.weights,
        rows,
        reference_of,
        correct=scorer.verdict(),
        budget=cfg.audit_budget // 10 if multi_line else cfg.audit_budget,
        material=cfg.audit_material,
        abstention=cfg.abstention,
        seed=int(recipe.grpo_value("seed") or 0),
    )
    for line in summary(report):
        log.info("%s", line)
    return {**report, "seconds": time.perf_counter() - began}


def _gameable_diagnosis(report: dict[str, Any]) -> str:
    """The audit's findings as a stop's diagnosis: each names the reward and what paid, with one example."""
    parts = [
        f"{f['message']} (witness: row {f['row']!r}, completion {str(f['completion'])[:200]!r})"
        for f in report["findings"]
    ]
    return (
        "the reward audit found a gameable reward: " + "; ".join(parts) + ". Fix the reward (or add a correctness "
        "reward beside it), or set dry_run.gameable: warn to train on it anyway"
    )


def run(recipe, inputs: dict[str, Any], dirs) -> StageOutput:
    g, cfg = recipe.grpo_value, recipe.dry_run
    group, seed = int(g("num_generations")), int(g("seed") or 0)
    task = load_task(recipe.data, inputs.get("heldout"))
    rows = shuffled(task.train, seed=seed)[: cfg.num_prompts]
    scorer = Scorer(recipe)
    fns = scorer.fns
    report = _audit(recipe, shuffled(task.train, seed=seed + 1), task.reference)
    audit_s = report.pop("seconds")  # its share of the dry run's wall time: bench/reward_audit.py reads it
    if report["findings"] and cfg.gameable == "stop":  # before any sampling: nothing GRPO would learn is worth it
        return StageOutput(
            {"audit_findings": float(len(report["findings"])), "audit_s": audit_s},
            status="failed",
            diagnosis=_gameable_diagnosis(report),
            extra={"reward_audit": report},
        )
    model, tokenizer = load_policy(inputs["policy"]["model"], recipe)
    samples, envs = complete(
        model,
        tokenizer,
        recipe,
        rows,
        num_return_sequences=group,
        do_sample=True,
        temperature=float(g("temperature")),
        top_p=float(g("top_p") or 1.0),
        top_k=int(g("top_k") or 0),
        max_new_tokens=int(g("max_completion_length")),
        batch_size=recipe.eval.batch_size,
        desc="dry run",
        seed=seed,
        extra={
            **{k: g(k) for k in ("min_p", "repetition_penalty") if g(k) is not None},
            **(g("generation_kwargs") or {}),
        },
    )
    prompts = [r["prompt"] for r in rows for _ in range(group)]
    completions = [c for s in samples for c in s]
    cols = {**columns(rows, repeat=group), "completion_ids": completion_ids(tokenizer, completions)}
    if envs is not None:  # episodes: the policy's own, each scored by its environment
        cols["environments"] = [e for es in envs for e in es]
    scores = scorer(prompts, completions, cols)
    per_reward, totals = scores.values, scores.totals
    stats = group_stats(totals, group)

    rates = PassRates()  # each sampled prompt's group: where GRPO's curriculum starts
    rates.add_groups([row_id(r) for r in rows for _ in range(group)], totals, group, 0, "dry_run")
    rates.write(dirs.out)
    for name, vals in per_reward.items():
        scored = [v for v in vals if v is not None]
        stats[f"rewards/{name}/mean"] = statistics.fmean(scored) if scored else math.nan
        stats[f"rewards/{name}/none"] = float(len(vals) - len(scored))
    stats.update({"num_prompts": float(len(rows)), "num_generations": float(group)})
    if envs is not None:
        from regimen.stages.training.episodes import bound_counts as counts
        from regimen.stages.training.episodes import tool_errors

        stats["tool_errors"] = float(tool_errors(completions))
        stats.update(counts(completions))  # tool calls past the time limit, replies cut to the size limit
    context: dict[str, list[Any]] = {"total": totals, "group": [i // group for i in range(len(prompts))]}
    if envs is not None:
        context["episode"] = [transcript(c, e) for c, e in zip(completions, cols["environments"])]
    trajectories.write(dirs.out, trajectories.rows_from_batch(prompts, completions, per_reward, **context))
    extra: dict[str, Any] = {"reward_audit": report}
    stats["audit_findings"] = float(len(report["findings"]))
    stats["audit_s"] = audit_s
    warnings = []
    if gameable := gameable_names(fns):
        warnings.append(GAMEABLE_WARNING.format(names=", ".join(gameable)))
    if report["findings"]:  # dry_run.gameable: warn
        warnings.append(f"reward audit (dry_run.gameable: warn, going on): {_gameable_diagnosis(report)}")
    if warnings:
        extra["warning"] = " ".join(warnings)
    diagnosis = diagnose(stats, cfg, prompts=len(rows), group=group, temperature=float(g("temperature")))
    return StageOutput(stats, status="failed" if diagnosis else "completed", diagnosis=diagnosis, extra=extra)
