"""Stage 5, eval: greedy held-out accuracy of the GRPO policy, each reward's held-out mean, the
training reward beside it, and the cycle's verdict (which catches reward hacking)."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

from stages import trajectories
from stages.cycle import Evaluation, decide
from stages.data import Task, data_identity, load_task
from stages.rewards import answer, from_specs, score

METRIC_DIR = Path(__file__).parent / "metrics" / "exact_match"


@cache
def exact_match_metric():
    """The shipped exact-match module, loaded by path (never from the hub)."""
    import evaluate

    return evaluate.load(str(METRIC_DIR))


def max_new_tokens(recipe) -> int:
    return recipe.eval.max_new_tokens or int(recipe.grpo_settings().get("max_completion_length") or 64)


def heldout_eval(model, tokenizer, recipe, task: Task, *, desc: str = "held-out eval") -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Greedy completions for every held-out prompt; exact match against `answer` when the task has
    answers (else the first reward reaching 1.0 counts as correct); each reward's held-out mean."""
    from stages.sampling import generate

    rows = task.heldout
    prompts = [r["prompt"] for r in rows]
    completions = [c[0] for c in generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens(recipe), batch_size=recipe.eval.batch_size, desc=desc)]
    fns = from_specs(recipe.rewards)
    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("prompt", "completion")}
    values = score(fns, prompts, completions, columns)
    metrics: dict[str, float] = {}
    if recipe.eval.metric == "exact_match":
        refs = [str(r.get("answer", "")) for r in rows]
        metrics["heldout_accuracy"] = float(exact_match_metric().compute(predictions=completions, references=refs)["exact_match"])
        correct = _exact(completions, refs)
    else:
        vals = values[recipe.eval.metric]
        correct = [float(v is not None and v >= 1.0) for v in vals]
        metrics["heldout_accuracy"] = sum(correct) / len(correct)
    for name, vals in values.items():
        scored = [v for v in vals if v is not None]
        metrics[f"heldout_reward/{name}"] = sum(scored) / len(scored) if scored else math.nan
    metrics["heldout_size"] = float(len(rows))
    traj = trajectories.rows_from_batch(prompts, completions, values, answer=[r.get("answer") for r in rows], correct=correct)
    return metrics, traj


def _exact(completions: list[str], refs: list[str]) -> list[float]:
    return [v or 0.0 for v in answer(None, completions, answer=refs)]


def config_section(recipe) -> dict[str, Any]:
    return {
        "data": data_identity(recipe.data),
        "rewards": [r.model_dump() for r in recipe.rewards],
        "eval": recipe.eval.model_dump(),
        "max_new_tokens": max_new_tokens(recipe),
        "cycle": recipe.cycle.model_dump(),
    }


def run(recipe, inputs: dict[str, Any], dirs) -> Any:
    from stages.model import load_model, load_tokenizer
    from stages.runner import StageOutput

    policy = inputs["policy"]["model"]
    task = load_task(recipe.data)
    model, tokenizer = load_model(policy, dtype=recipe.model.dtype), load_tokenizer(policy)
    metrics, rows = heldout_eval(model, tokenizer, recipe, task)
    metrics["train_reward"] = _num(inputs.get("train_reward"))
    metrics["train_reward_first"] = _num(inputs.get("train_reward_first"))
    trajectories.write(dirs.out, rows[: max(recipe.eval.trajectories, 1)])
    history = [Evaluation.from_dict(e) for e in inputs.get("history", [])]
    history.append(Evaluation(inputs["cycle"], inputs["round"], metrics["heldout_accuracy"], inputs.get("train_reward"), inputs.get("train_reward_first")))
    decision = decide(history, recipe.cycle)
    return StageOutput(metrics, extra={"verdict": decision.verdict, "decision": decision.as_dict()})


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)
