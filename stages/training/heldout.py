"""Held-out measurement shared by SFT (the policy it made), evaluation and the probe inside GRPO: greedy
completions for held-out prompts, exact match against `answer` (or a reward reaching 1.0, over the rows
the reward scores: a row it has no opinion on, None, is left out and counted as `heldout_unscored`), and
each reward's held-out mean."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

from regimen.stages.rewards import answer, from_specs, score
from regimen.stages.rewards.registry import error_counts
from regimen.stages.training import trajectories

METRIC_DIR = Path(__file__).parent / "metrics" / "exact_match"
CODE_FILES = ("metrics/exact_match/exact_match.py",)


@cache
def exact_match_metric():
    """The shipped exact-match module, loaded by path (never from the hub)."""
    import evaluate

    return evaluate.load(str(METRIC_DIR))


def heldout_eval(
    model, tokenizer, recipe, rows: list[dict[str, Any]], *, desc: str = "held-out eval"
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy completions for `rows`; `heldout_accuracy` by `eval.metric`; each reward's held-out mean."""
    from regimen.stages.training.episodes import complete, transcript

    prompts = [r["prompt"] for r in rows]
    outs, envs = complete(model, tokenizer, recipe, rows, batch_size=recipe.eval.batch_size, desc=desc)
    completions = [c[0] for c in outs]
    fns = from_specs(recipe.rewards)
    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("prompt", "completion")}
    if envs is not None:
        columns["environments"] = [e[0] for e in envs]  # the episode reward reads each episode's environment
        from regimen.stages.training.episodes import tool_errors
    before = error_counts(fns)
    values = score(fns, prompts, completions, columns)
    metrics: dict[str, float] = {
        f"rewards/{name}/errors": float(n - before[name]) for name, n in error_counts(fns).items()
    }
    if recipe.eval.metric == "exact_match":
        refs = [str(r.get("answer", "")) for r in rows]
        metrics["heldout_accuracy"] = float(
            exact_match_metric().compute(predictions=completions, references=refs)["exact_match"]
        )
        correct = [v or 0.0 for v in answer(None, completions, answer=refs)]
    else:  # a reward as the metric: rows it has no opinion on (None: no tests, or tests that pay anything) are left out
        correct = [None if v is None else float(v >= 1.0) for v in values[recipe.eval.metric]]
        scored = [c for c in correct if c is not None]
        metrics["heldout_accuracy"] = sum(scored) / len(scored) if scored else 0.0
        metrics["heldout_unscored"] = float(len(correct) - len(scored))
    for name, vals in values.items():
        scored = [v for v in vals if v is not None]
        metrics[f"heldout_reward/{name}"] = sum(scored) / len(scored) if scored else math.nan
    metrics["heldout_size"] = float(len(rows))
    if envs is not None:
        from regimen.stages.environments.bounds import counts

        metrics["tool_errors"] = float(tool_errors(completions))
        metrics.update(counts(completions))  # tool calls past the time limit, replies cut to the size limit
    metrics.update(accuracy_by_group(rows, correct))
    rendered = [_rendered(tokenizer, p) for p in prompts]
    from regimen.stages.decide.reading import row_ids
    from regimen.stages.rewards import weighted_total
    from regimen.stages.training.pass_rates import prompt_id

    context: dict[str, list[Any]] = {
        "id": row_ids(prompts, prompt_id),  # the row's identity: two evaluations are compared row for row by it
        "answer": [r.get("answer") for r in rows],
        "correct": correct,
        "total": weighted_total(values, recipe.reward_weights()),  # what the rewards pay, as training weighs them
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
    from regimen.stages.training.sampling import encode_prompts

    return encode_prompts(tokenizer, [prompt])[0]
