"""Checks before anything trains, so a bad input is named in seconds, not after SFT.

- Data at the door: the task loads (types per row, sizes, duplicates, train/held-out overlap are
  checked by the task itself), and the rows carry what the recipe needs: an `answer` on every held-out
  row for `eval.metric: exact_match`, a reference on every training row for the oracle teacher.
- Every reward is called on a few training rows (with the task's reference completions where it has
  them): it must return one real number or None per completion; NaN, strings, wrong lengths and
  exceptions are refused, naming the reward, the row and the value.
- The embedded model's context fits the task: its longest prompt and what it may generate
  (`model.tiny.max_position_embeddings`, named with a size that fits).
- An environment (`environment:`) is made as training makes it, reset on the first training and held-out rows, and
  its tools rendered as the chat template renders them (`training/episodes.try_environment`).
- A store in a bucket answers as it must, first of all: the bucket exists, the credentials are taken, the
  endpoint answers, and a second conditional create of one key is refused (the experiment's lease and
  the version claims rely on it); each failure is one line naming the bucket and the endpoint.
- A reward with checks of its own on every row (`door`: `unit_tests` refuses tests that evaluate strings
  or need pytest fixtures, and reports rows whose tests pass with no solution at all) runs them on the
  training and held-out rows.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from regimen.stages.core.errors import InputError
from regimen.stages.rewards import from_specs, preflight
from regimen.stages.tasks.hf import _local_paths
from regimen.stages.tasks.registry import load_task

log = logging.getLogger("regimen.preflight")

ROWS = 4


def _shown(row: dict[str, Any]) -> str:
    text = row["prompt"] if isinstance(row["prompt"], str) else str(row["prompt"][-1].get("content", ""))
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def _rewards_at_the_door(recipe, task) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """Every reward called on a few training rows with their reference answers, as TRL calls it (with an environment:
    each row's own, reset, before any episode)."""
    rows = task.train[:ROWS]
    completions = [task.reference(r) or "" for r in rows]
    fns = from_specs(recipe.rewards)
    extra = None
    if recipe.environment is not None:
        from regimen.stages.training.episodes import reset_environments

        rows, extra = reset_environments(recipe, rows)
    return fns, preflight(fns, rows, completions, extra)


def check(recipe, *, offline: bool = False) -> dict[str, Any]:
    """Raise InputError for the first problem found; returns a short summary of what was checked. `offline`
    (`regimen check`): nothing that needs a server or the network (the store, a dataset from the hub), and what was
    skipped is said in the summary's `skipped`."""
    if offline:
        if from_hub(recipe.data):
            return {
                "skipped": [
                    f"data: {recipe.data.path} is loaded from the hub, which needs the network (so are the rewards' "
                    "calls on its rows and the environment's resets)"
                ]
            }
    else:
        check_store(recipe.store)
    task = load_task(recipe.data)
    if not task.train or not task.heldout:
        raise InputError(
            f"data: the task has {len(task.train)} training and {len(task.heldout)} held-out rows; both must be "
            f"non-empty"
        )
    if recipe.eval.metric == "exact_match":
        missing = next((i for i, r in enumerate(task.heldout, 1) if r.get("answer") in (None, "")), None)
        if missing is not None:
            raise InputError(
                f"data: held-out row {missing} (prompt {_shown(task.heldout[missing - 1])}) has no 'answer', which "
                f"eval.metric exact_match compares against "
                "(map your column with data.columns, or set eval.metric to one of the rewards)"
            )
    if recipe.teacher.kind == "oracle":
        missing = next((i for i, r in enumerate(task.train, 1) if task.reference(r) is None), None)
        if missing is not None:
            raise InputError(
                f"data: training row {missing} (prompt {_shown(task.train[missing - 1])}) has no reference "
                f"('completion', 'solution' or 'answer') for the oracle teacher "
                "(map your column with data.columns, or use teacher.kind: model, self or none)"
            )
    check_context(recipe, task)
    tools = None
    if recipe.environment is not None:
        from regimen.stages.training.episodes import try_environment

        tools = try_environment(recipe, task.train, task.heldout)
    fns, values = _rewards_at_the_door(recipe, task)
    summary: dict[str, Any] = {
        "train_rows": len(task.train),
        "heldout_rows": len(task.heldout),
        "rewards": {k: v for k, v in values.items()},
        "skipped": ["store: not reached (a check runs nothing remote)"] if offline and "://" in recipe.store else [],
    }
    if tools is not None:
        summary["tools"] = tools
    for name, fn in fns.items():
        if callable(door := getattr(fn, "door", None)):  # a reward's own checks on every row (unit_tests: code_rows.py)
            where = [f"data: training row {i}" for i in range(1, len(task.train) + 1)] + [
                f"data: held-out row {i}" for i in range(1, len(task.heldout) + 1)
            ]
            report = door(task.train + task.heldout, where)
            summary[f"door/{name}"] = report
            if report.get("pays_anything"):
                log.warning(
                    "%s: %d row(s) pass their tests with no solution at all, so they pay anything: left out of scoring "
                    "(%s)",
                    name,
                    len(report["pays_anything"]),
                    _few(report["pays_anything"]),
                )
            if report.get("pays_some"):
                log.warning(
                    "%s: %d row(s) pass some of their tests with no solution at all (those tests pay anything): %s",
                    name,
                    len(report["pays_some"]),
                    _few(report["pays_some"]),
                )
    return summary


def from_hub(data) -> bool:
    """Whether the recipe's data comes from the hub (an `hf` task whose path and files are not local)."""
    if getattr(data, "task", None) != "hf":
        return False

    return not ([f for f in _local_paths(data.data_files) if "://" not in f] or Path(data.path).exists())


def check_context(recipe, task) -> None:
    """The embedded model's context holds the task's longest prompt (one token a character, its chat template's
    markers included) and what it may generate after it; else InputError naming the field and a size that fits.
    (A real model's context is its own: its tokenizer truncates, as TRL's max_prompt_length says.)"""
    if recipe.model.name_or_path != "tiny":
        return
    tiny = recipe.model.tiny

    def length(prompt: Any) -> int:
        if isinstance(prompt, str):
            return len(prompt)
        return sum(len(str(m.get("content", ""))) + 2 for m in prompt) + 2  # `U:`-style markers, then `A:`

    longest = max(task.train + task.heldout, key=lambda r: length(r["prompt"]))
    need = length(longest["prompt"]) + int(recipe.max_new_tokens()) + 1
    if need > tiny.max_position_embeddings:
        fits = -(-need // 32) * 32
        raise InputError(
            f"model.tiny.max_position_embeddings={tiny.max_position_embeddings} is too small for this task: its "
            f"longest prompt ({_shown(longest)}) is {length(longest['prompt'])} tokens, plus up to "
            f"{recipe.max_new_tokens()} generated; set it to at least {need} (e.g. {fits})"
        )


def check_store(url: str) -> None:
    """A remote store (`s3://...`) is reachable and honours conditional writes (`Store.probe`, `Backend.probe`);
    StoreError or InputError naming the bucket otherwise. A local folder is not touched here."""
    from fsspec.core import split_protocol

    if split_protocol(str(url))[0] in (None, "file", "local"):
        return
    from regimen.stages.store import Store

    Store(url).probe()


def _few(labels: list[str], n: int = 5) -> str:
    shown = ", ".join(label.removeprefix("data: ") for label in labels[:n])
    return shown + (f", and {len(labels) - n} more" if len(labels) > n else "")
