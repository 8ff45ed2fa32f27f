"""SFT traces for distillation-style SFT: from the task's reference solver (`oracle`), from the task's weak
solver (`weak`: right on a known part of the task), from a teacher model by rejection sampling (`model`),
or from the current policy itself (`self`: reward-filtered self-distillation, for when no stronger model
exists). And the teacher's own held-out accuracy, so a student can be seen to beat its teacher."""

from __future__ import annotations

import math
from typing import Any

from regimen.stages.rewards import Scorer, columns
from regimen.stages.tasks import Task, shuffled
from regimen.stages.training.model import load_policy
from regimen.stages.training.sampling import generate


def traces(recipe, task: Task, *, cycle: int, policy_path: str) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """(prompt, completion) rows for SFT and counts of generated and kept traces.
    Each cycle draws the prompts in a fresh order (seeded by the cycle), so cycle N+1 sees new traces first."""
    t = recipe.teacher
    rows = shuffled(task.train, seed=recipe.data.seed * 7919 + cycle)
    if t.max_prompts:
        rows = rows[: t.max_prompts]
    if t.kind in ("oracle", "weak"):
        solve = task.reference if t.kind == "oracle" else task.weak_reference
        shown = [r["prompt"] for r in rows]
        if recipe.environment is not None:  # the prompt as an episode shows it: reset's observation appended (TRL's)
            from regimen.stages.training.episodes import reset_environments

            shown = [r["prompt"] for r in reset_environments(recipe, rows)[0]]
        kept = [{"prompt": p, "completion": ref} for p, r in zip(shown, rows) if (ref := solve(r)) is not None]
        return kept, {"traces_generated": float(len(rows)), "traces_kept": float(len(kept))}
    source = t.name_or_path if t.kind == "model" else policy_path
    return _rejection_sample(recipe, rows, source)


def as_sft_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TRL's prompt-completion rows; a conversation's completion becomes an assistant message, so
    SFTTrainer applies the chat template and computes the loss on the assistant turn only."""
    out = []
    for r in rows:
        if isinstance(r["completion"], list):  # a multi-turn trace (tool calls, tool replies): the turns as they are
            prompt = r["prompt"] if isinstance(r["prompt"], list) else [{"role": "user", "content": str(r["prompt"])}]
            out.append({"prompt": prompt, "completion": r["completion"]})
        elif isinstance(r["prompt"], list):
            out.append({"prompt": r["prompt"], "completion": [{"role": "assistant", "content": r["completion"]}]})
        else:
            out.append({"prompt": r["prompt"], "completion": r["completion"]})
    return out


def teacher_accuracy(recipe, task: Task) -> float | None:
    """The teacher's own held-out accuracy by the recipe's eval metric (None for `self` and `none`)."""
    t = recipe.teacher
    rows = task.heldout
    if recipe.environment is not None:
        return None  # a teacher's episodes are judged by replaying them (not yet): no figure rather than a wrong one
    if t.kind in ("oracle", "weak"):
        solve = task.reference if t.kind == "oracle" else task.weak_reference
        completions = [solve(r) or "" for r in rows]
        return Scorer(recipe)([r["prompt"] for r in rows], completions, columns(rows)).accuracy  # as evaluation counts
    if t.kind == "model":
        from regimen.stages.training.heldout import heldout_eval
        from regimen.stages.training.model import load_policy

        model, tokenizer = load_policy(t.name_or_path, recipe)
        metrics, _ = heldout_eval(model, tokenizer, recipe, rows, desc="teacher's held-out accuracy")
        return metrics["heldout_accuracy"]
    return None


def _rejection_sample(recipe, rows: list[dict[str, Any]], source: str) -> tuple[list[dict[str, Any]], dict[str, float]]:
    t = recipe.teacher
    model, tokenizer = load_policy(source, recipe)
    prompts = [r["prompt"] for r in rows]
    sampling = {
        "num_return_sequences": t.samples_per_prompt,
        "do_sample": True,
        "temperature": t.temperature,
        "max_new_tokens": recipe.max_new_tokens(),
        "batch_size": recipe.eval.batch_size,
        "desc": f"teacher ({t.kind})",
        "seed": recipe.data.seed,
    }
    cols = columns(rows, repeat=t.samples_per_prompt)
    if recipe.environment is None:
        samples = generate(model, tokenizer, prompts, **sampling)
        shown = prompts
    else:  # episodes through the environment, each judged by its own: kept when it passes teacher.min_reward
        from regimen.stages.training.episodes import chat_rows, complete

        samples, envs = complete(model, tokenizer, recipe, chat_rows(rows), **sampling)
        cols["environments"] = [e for es in envs for e in es]
        shown = [r["prompt"] for r in chat_rows(rows)]
    flat_prompts = [p for p, group in zip(shown, samples) for _ in group]
    flat = [c for group in samples for c in group]
    totals = Scorer(recipe)(flat_prompts, flat, cols).totals
    kept, seen = [], set()
    for prompt, completion, total in zip(flat_prompts, flat, totals):
        key = (str(prompt), str(completion))
        if not math.isnan(total) and total >= t.min_reward and key not in seen:
            seen.add(key)
            kept.append({"prompt": prompt, "completion": completion})
    del model
    return kept, {"traces_generated": float(len(flat)), "traces_kept": float(len(kept))}
