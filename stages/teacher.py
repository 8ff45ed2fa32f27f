"""SFT traces for distillation-style SFT: from the task's reference solver (`oracle`), from a teacher
model by rejection sampling (`model`), or from the current policy itself (`self`: reward-filtered
self-distillation, for when no stronger model exists)."""

from __future__ import annotations

from typing import Any

from stages.data import Task, shuffled
from stages.rewards import from_specs, score, weighted_total


def traces(recipe, task: Task, *, cycle: int, policy_path: str) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """(prompt, completion) rows for SFT and counts of generated and kept traces.
    Each cycle draws the prompts in a fresh order (seeded by the cycle), so cycle N+1 sees new traces first."""
    t = recipe.teacher
    rows = shuffled(task.train, seed=recipe.data.seed * 7919 + cycle)
    if t.kind == "oracle":
        kept = [{"prompt": r["prompt"], "completion": ref} for r in rows if (ref := task.reference(r)) is not None]
        return kept, {"traces_generated": float(len(rows)), "traces_kept": float(len(kept))}
    if t.max_prompts:
        rows = rows[: t.max_prompts]
    source = t.name_or_path if t.kind == "model" else policy_path
    return _rejection_sample(recipe, rows, source)


def _rejection_sample(recipe, rows: list[dict[str, Any]], source: str) -> tuple[list[dict[str, Any]], dict[str, float]]:
    from stages.evaluate import max_new_tokens
    from stages.model import load_model, load_tokenizer
    from stages.sampling import generate

    t = recipe.teacher
    model, tokenizer = load_model(source, dtype=recipe.model.dtype), load_tokenizer(source)
    prompts = [r["prompt"] for r in rows]
    samples = generate(model, tokenizer, prompts, num_return_sequences=t.samples_per_prompt, do_sample=True,
                       temperature=t.temperature, max_new_tokens=max_new_tokens(recipe), batch_size=recipe.eval.batch_size,
                       desc=f"teacher ({t.kind})", seed=recipe.data.seed)
    flat_prompts = [p for p, group in zip(prompts, samples) for _ in group]
    flat = [c for group in samples for c in group]
    columns = {k: [r.get(k) for r in rows for _ in range(t.samples_per_prompt)] for k in rows[0] if k not in ("prompt", "completion")}
    fns = from_specs(recipe.rewards)
    totals = weighted_total(score(fns, flat_prompts, flat, columns), recipe.reward_weights())
    kept, seen = [], set()
    for prompt, completion, total in zip(flat_prompts, flat, totals):
        key = (str(prompt), completion)
        if total == total and total >= t.min_reward and key not in seen:  # NaN never passes
            seen.add(key)
            kept.append({"prompt": prompt, "completion": completion})
    del model
    return kept, {"traces_generated": float(len(flat)), "traces_kept": float(len(kept))}
