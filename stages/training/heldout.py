"""Held-out measurement shared by SFT (the policy it made), evaluation and the probe inside GRPO: greedy
completions for held-out prompts, scored by `rewards/scoring.py` (the same verdict the probe and the dry run use:
exact match against `answer`, or a reward reaching 1.0 over the rows it scores; a row it has no opinion on, None,
is left out and counted as `heldout_unscored`), and each reward's held-out mean."""

from __future__ import annotations

import math
from typing import Any

from regimen.stages.decide.reading import row_ids
from regimen.stages.rewards import Scorer, columns
from regimen.stages.rewards.registry import error_counts
from regimen.stages.rewards.scoring import completion_ids
from regimen.stages.training import trajectories
from regimen.stages.training.episodes import complete, transcript
from regimen.stages.training.pass_rates import prompt_id
from regimen.stages.training.sampling import encode_prompts


def heldout_eval(
    model, tokenizer, recipe, rows: list[dict[str, Any]], *, desc: str = "held-out eval", metric_only: bool = False
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy completions for `rows`; `heldout_accuracy` by `eval.metric`; each reward's held-out mean (`metric_only`:
    only the metric's reward, for a stage whose identity holds no other)."""
    prompts = [r["prompt"] for r in rows]
    outs, envs = complete(model, tokenizer, recipe, rows, batch_size=recipe.eval.batch_size, desc=desc)
    completions = [c[0] for c in outs]
    scorer = Scorer(recipe, only=[recipe.eval.metric] if metric_only else None)
    cols = {**columns(rows), "completion_ids": completion_ids(tokenizer, completions)}
    if envs is not None:
        cols["environments"] = [e[0] for e in envs]  # the episode reward reads each episode's environment
        from regimen.stages.training.episodes import schema_calls, tool_errors
    before = error_counts(scorer.fns)
    scores = scorer(prompts, completions, cols)
    values, correct = scores.values, scores.correct
    metrics: dict[str, float] = {
        f"rewards/{name}/errors": float(n - before[name]) for name, n in error_counts(scorer.fns).items()
    }
    metrics["heldout_accuracy"] = scores.accuracy
    if recipe.eval.metric != "exact_match":  # a reward as the metric: rows it has no opinion on are left out
        metrics["heldout_unscored"] = float(scores.unscored)
    for name, vals in values.items():
        scored = [v for v in vals if v is not None]
        metrics[f"heldout_reward/{name}"] = sum(scored) / len(scored) if scored else math.nan
    metrics["heldout_size"] = float(len(rows))
    if envs is not None:
        from regimen.stages.environments.bounds import counts

        metrics["tool_errors"] = float(tool_errors(completions))
        metrics["tool_call_rate"] = schema_calls(completions, [e[0] for e in envs])  # calls that fit the tools' schema
        metrics.update(counts(completions))  # tool calls past the time limit, replies cut to the size limit
    metrics.update(accuracy_by_group(rows, correct))
    rendered = [_rendered(tokenizer, p) for p in prompts]

    context: dict[str, list[Any]] = {
        "id": row_ids(prompts, prompt_id),  # the row's identity: two evaluations are compared row for row by it
        "answer": [r.get("answer") for r in rows],
        "correct": correct,
        "total": scores.totals,  # what the rewards pay, as training weighs them
        "rendered_prompt": rendered,
    }
    for column, _ in GROUPS:  # a mixture's task, a curriculum level: what the page filters by
        if any(r.get(column) is not None for r in rows):
            context[column] = [r.get(column) for r in rows]
    if envs is not None:
        context["episode"] = [transcript(c, e[0]) for c, e in zip(completions, envs)]
    traj = trajectories.rows_from_batch(prompts, completions, values, **context)
    return metrics, traj


GROUPS = (("source_dataset", "heldout_accuracy/{}"), ("level", "heldout_accuracy/level{}"))
"""Row columns held-out accuracy is also reported by, when the rows hold more than one value: a mixture's tasks
(`heldout_accuracy/<task>`) and curriculum levels (`heldout_accuracy/level<k>`)."""


def accuracy_by_group(rows: list[dict[str, Any]], correct: list[float | None]) -> dict[str, float]:
    out: dict[str, float] = {}
    for column, key in GROUPS:
        values = {r.get(column) for r in rows} - {None}
        if len(values) < 2:
            continue
        for value in sorted(values, key=str):
            scored = [c for r, c in zip(rows, correct) if r.get(column) == value and c is not None]
            if scored:
                out[key.format(value)] = sum(scored) / len(scored)
    return out


def spread(rows: list[dict[str, Any]], n: int) -> list[int]:
    """Indices of `n` rows taken in turn from each group (a mixture's task, a level), so a sample of
    trajectories shows every task; rows without groups: the first `n`."""
    column = next((c for c, _ in GROUPS if len({r.get(c) for r in rows} - {None}) > 1), None)
    if column is None:
        return list(range(min(n, len(rows))))
    queues: dict[Any, list[int]] = {}
    for i, r in enumerate(rows):
        queues.setdefault(r.get(column), []).append(i)
    out: list[int] = []
    while len(out) < min(n, len(rows)):
        for q in queues.values():
            if q and len(out) < n:
                out.append(q.pop(0))
    return out


def _rendered(tokenizer, prompt: Any) -> str | None:
    """What the model actually saw for a conversation (the chat template's rendering); None for text."""
    if isinstance(prompt, str):
        return None

    return encode_prompts(tokenizer, [prompt])[0]
