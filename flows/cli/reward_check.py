"""`regimen reward-check`: score sample completions with rewards, no model involved.

The dry run of a reward on text that practitioners recommend before any training: a person writes or
collects completions (JSONL, one object per line with `completion`, optionally `prompt`, plus the
columns the rewards read, such as `answer` or `tests`) and sees what each reward pays for them.

Without `--json`: a table of the first rows and a summary per reward (`flows/present/reward_check.py`). With
`--json`: exactly one JSON line per sample on stdout, the sample's fields plus `"rewards": {name: value}`; notes
and warnings go to stderr. Gameable rewards are announced loudly either way. Samples are scored in batches, so
`unit_tests` runs each batch in parallel.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from regimen.flows.cli.app import app
from regimen.flows.present.reward_check import gameable_warning, json_value, print_report
from regimen.stages.core.errors import InputError
from regimen.stages.core.loading import import_problem
from regimen.stages.rewards import RewardFn, get_reward, is_gameable, score
from regimen.stages.rewards.audit import audit, summary
from regimen.stages.tasks import read_jsonl

BATCH_SIZE = 512
# Keys of a sample that are not passed to rewards as dataset columns.
_NOT_COLUMNS = {"prompt", "completion", "rewards", "prompts", "completions"}


@app.command("reward-check")
def reward_check(
    samples: Annotated[
        str,
        typer.Option("--samples", help="JSONL: one object per line with `completion` (+ prompt, answer, tests, ...)"),
    ],
    config: Annotated[str | None, typer.Option("--config", help="take the rewards from this recipe")] = None,
    reward: Annotated[list[str] | None, typer.Option("--reward", help="reward name (repeatable)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON line per sample")] = False,
) -> None:
    """Score completions with rewards, no model: the dry run of a reward on sample text, and the reward audit over
    the samples that carry an answer (exit 1 when it finds a gameable reward, so it can sit in CI)."""
    code = main(samples, config, list(reward or []), as_json)
    raise typer.Exit(code)


def _check_sample(path: Path, line_no: int, row: dict[str, Any]) -> None:
    completion = row["completion"]
    if not (
        isinstance(completion, str) or (isinstance(completion, list) and all(isinstance(m, dict) for m in completion))
    ):
        raise InputError(
            f"{path}:{line_no}: field 'completion' must be a string or a list of chat messages, got "
            f"{type(completion).__name__}"
        )
    prompt = row.get("prompt")
    if prompt is not None and not isinstance(prompt, (str, list)):
        raise InputError(
            f"{path}:{line_no}: field 'prompt' must be a string or a list of chat messages, got {type(prompt).__name__}"
        )


def _recipe_rewards(config: str) -> dict[str, tuple[RewardFn, float]]:
    """The recipe's rewards, by report name, with their weights (the recipe is validated as for a run)."""
    from regimen.stages.recipe import load_recipe
    from regimen.stages.rewards.registry import from_specs

    recipe = load_recipe(config, check_trl=False)
    fns = from_specs(recipe.rewards)
    return {key: (fn, recipe.reward_weights()[key]) for key, fn in fns.items()}


def report_name(name: str) -> str:
    """The name a reward's values are reported under (as `RewardSpec.key` and TRL's logs name it)."""
    from regimen.stages.recipe.schema import RewardSpec

    return RewardSpec(name=name).key


def resolve_rewards(rewards: list[str], config: str | None) -> tuple[dict[str, RewardFn], dict[str, float] | None]:
    """Reward functions by name, and their weights when a recipe gives them. `--reward` names win;
    a recipe given beside them lends its options and weights to the rewards it also lists."""
    from_recipe = _recipe_rewards(config) if config else {}
    if rewards:
        fns: dict[str, RewardFn] = {}
        weights: dict[str, float] = {}
        for name in rewards:
            key = report_name(name)
            if key in fns:
                continue
            if key in from_recipe:
                fns[key], weights[key] = from_recipe[key]
            else:
                if problem := import_problem(name):
                    raise InputError(f"--reward {problem}")
                fns[key], weights[key] = get_reward(name), 1.0
        return fns, (weights if config else None)
    if config:
        return {k: fn for k, (fn, _) in from_recipe.items()}, {k: w for k, (_, w) in from_recipe.items()}
    raise InputError("reward-check: name at least one reward with --reward NAME, or give a recipe with --config")


def main(samples: str, config: str | None, rewards: list[str], as_json: bool) -> int:
    """Score every sample in `samples` with the chosen rewards and print a table or JSON lines, then the reward
    audit over the samples that carry an `answer`. Returns 1 when the audit has a finding, else 0; raises InputError
    (exit 2) on bad input, naming the file, line and field."""
    path = Path(samples)
    rows = list(read_jsonl(path, required=("completion",)))
    for line_no, row in rows:
        _check_sample(path, line_no, row)
    fns, weights = resolve_rewards(list(rewards or []), config)
    started = time.monotonic()

    console = None
    if not as_json:
        from rich.console import Console

        console = Console(highlight=False, emoji=False)
    gameable = [name for name, fn in fns.items() if is_gameable(fn)]
    if gameable:
        if console is not None:
            console.print(gameable_warning(gameable), style="bold red", soft_wrap=True)
        else:
            print(gameable_warning(gameable), file=sys.stderr)

    for (
        name,
        fn,
    ) in fns.items():  # a reward's checks at the door (unit_tests: tests that evaluate strings are refused, ...)
        if callable(door := getattr(fn, "door", None)):
            report = door([row for _, row in rows], [f"{path}:{line_no}" for line_no, _ in rows])
            for kind, what in (
                ("pays_anything", "pass their tests with no solution at all (left out: None)"),
                ("pays_some", "pass some of their tests with no solution at all"),
            ):
                if report.get(kind):
                    note = f"{name}: {len(report[kind])} sample(s) {what}: {', '.join(report[kind][:5])}"
                    console.print(note, style="yellow", soft_wrap=True) if console is not None else print(
                        note, file=sys.stderr
                    )
    values: dict[str, list[float | None]] = {name: [] for name in fns}
    for start in range(0, len(rows), BATCH_SIZE):
        chunk = rows[start : start + BATCH_SIZE]
        samples_ = [row for _, row in chunk]
        keys = sorted({k for row in samples_ for k in row} - _NOT_COLUMNS)
        columns = {k: [row.get(k) for row in samples_] for k in keys}
        prompts = [row.get("prompt", "") for row in samples_]
        completions = [row["completion"] for row in samples_]
        try:
            batch = score(fns, prompts, completions, columns)
        except InputError as exc:
            raise InputError(f"{path} (lines {chunk[0][0]}-{chunk[-1][0]}): {exc}") from None
        except Exception as exc:  # a reward that chokes on this file's data
            raise InputError(
                f"{path} (lines {chunk[0][0]}-{chunk[-1][0]}): a reward failed: {type(exc).__name__}: {exc}"
            ) from exc
        for name in fns:
            values[name].extend(batch[name])
        if as_json:
            out = sys.stdout
            for i, row in enumerate(samples_):
                record = {**row, "rewards": {name: json_value(batch[name][i]) for name in fns}}
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
            out.flush()

    elapsed = time.monotonic() - started
    fresh, _ = resolve_rewards(list(rewards or []), config)  # the audit's own instances (a stateful reward's count)
    report = _audit(fresh, weights, [row for _, row in rows])
    found = 1 if report is not None and report["findings"] else 0  # a finding fails the check: it can sit in CI
    if as_json:
        print(f"reward-check: scored {len(rows)} samples with {', '.join(fns)} in {elapsed:.2f} s", file=sys.stderr)
        if report is not None:
            print(json.dumps({"reward_audit": report}, default=str), file=sys.stderr)
        return found
    assert console is not None
    print_report(console, path, rows, fns, values, weights, gameable, elapsed)
    if report is not None:
        for line in summary(report):
            console.print(line, style="bold red" if line.lstrip().startswith("GAMEABLE") else None, soft_wrap=True)
    return found


def _audit(fns: dict[str, RewardFn], weights: dict[str, float] | None, rows: list[dict[str, Any]]) -> dict | None:
    """The reward audit (`stages/rewards/audit.py`) over the samples that carry a reference `answer`: what each
    reward pays made-up completions (the empty answer, a wrong one, a list of candidates, ...); None without
    references. Samples repeating a prompt count once."""
    seen, distinct = set(), []
    for row in rows:
        key = json.dumps(row.get("prompt"), sort_keys=True, default=str)
        if row.get("answer") not in (None, "") and key not in seen:
            seen.add(key)
            distinct.append(row)
    if len(distinct) < 2:
        return None
    return audit(fns, weights or dict.fromkeys(fns, 1.0), distinct, lambda r: str(r["answer"]))
