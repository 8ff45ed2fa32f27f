"""Rewards for code tasks: `unit_tests` (the fraction of a row's tests that pass, judged in the sandbox)
and `code_block` (gameable on purpose), plus the helpers that turn datasets' test formats into jobs.

A row's tests are a list of Python snippets that the sandbox's judge runs, in order, in its own process,
calling the solution's functions in another process (see `regimen.stages.sandbox`); a snippet
passes when it runs to its end without raising. Each row is read in its own format, so one dataset may
mix them (a column that is None or empty for a row does not hide that row's own format):
- `tests`: the list itself (a single string is one snippet; a string holding a JSON list is that list),
  with the row's `entry_point`, if any, as the function under test;
- `test_list` (MBPP): its asserts; `test_imports` and `test_setup_code` run once before them, as
  trusted set-up code;
- `test` + `entry_point` (HumanEval): one snippet that defines `check` and calls it on the entry point;
  the row's prompt, when it is Python code (or holds a fenced block of it), is the trusted set-up code,
  so helpers it defines (`poly`, `encode_cyclic`) are the dataset's, not the solution's.
A row with none of them has no opinion from `unit_tests` (None).

Importing this module registers both rewards in `regimen.stages.rewards` (which imports it lazily).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from regimen.stages import sandbox
from regimen.stages.errors import InputError
from regimen.stages.rewards.registry import RewardFn, completion_text, register, register_factory

log = logging.getLogger("regimen.rewards")

PROBLEMS_PATH = Path(__file__).parent.parent / "tasks" / "problems" / "code_problems.jsonl"
"""The small code-problem set shipped with Regimen (prompt, answer, tests, entry_point)."""

# A fenced block whose info string is python, python3, py or empty; the closing fence on its own line.
_FENCE = re.compile(r"^[ \t]*```[ \t]*(?:python3?|py)?[ \t]*\r?\n(.*?)^[ \t]*```[ \t]*$", re.DOTALL | re.MULTILINE | re.IGNORECASE)
_OPEN_FENCE = re.compile(r"^[ \t]*```[ \t]*(?:python3?|py)?[ \t]*\r?\n(.*)\Z", re.DOTALL | re.MULTILINE | re.IGNORECASE)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def extract_code(text: str) -> str:
    """The code of a completion: its last fenced ```python block (```py, ```python3 and a bare ```
    count too); an opening fence that is never closed (a truncated answer) runs to the end; with no
    fence at all, the whole completion."""
    last_end = 0
    code = None
    for match in _FENCE.finditer(text):
        code, last_end = match.group(1), match.end()
    unclosed = _OPEN_FENCE.search(text, last_end)
    if unclosed:
        code = unclosed.group(1)
    return textwrap.dedent(code) if code is not None else text


def has_code_block(text: str) -> bool:
    """Whether the text holds at least one complete fenced Python (or bare) code block."""
    return _FENCE.search(text) is not None


def humaneval_snippet(test: str, entry_point: str) -> str:
    """HumanEval's `check(candidate)` test plus its entry point, as one snippet."""
    if not _IDENTIFIER.match(entry_point or ""):
        raise InputError(f"unit_tests: entry_point {entry_point!r} is not a Python identifier")
    return f"{test.rstrip()}\n\ncheck({entry_point})\n"


def mbpp_snippets(test_list: Sequence[str], test_setup_code: str = "", test_imports: Sequence[str] = ()) -> list[str]:
    """MBPP's `test_list` asserts as snippets; setup code and imports, if any, precede each one."""
    prefix = "".join(f"{line}\n" for line in test_imports) + (f"{test_setup_code.rstrip()}\n" if test_setup_code and test_setup_code.strip() else "")
    return [prefix + t for t in test_list]


def prompt_code(prompt: Any) -> str | None:
    """The Python code of a HumanEval-style prompt: the prompt itself when it compiles, else its last
    fenced code block when that compiles (a chat prompt: its user and system messages); else None."""
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, (list, tuple)):
        text = "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict) and m.get("role", "user") in ("user", "system"))
    else:
        return None
    for candidate in (text, extract_code(text) if has_code_block(text) else None):
        if candidate and candidate.strip():
            try:
                compile(candidate, "<prompt>", "exec")
            except (SyntaxError, ValueError):
                continue
            return candidate
    return None


def _entry_point(value: Any, row: int) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not _IDENTIFIER.match(value):
        raise InputError(f"unit_tests: row {row}: entry_point {value!r} is not a Python identifier")
    return value


def _snippets(value: Any, row: int, column: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("["):
            try:
                parsed = json.loads(stripped)
            except ValueError:
                parsed = None
            if isinstance(parsed, list):
                value = parsed
        if isinstance(value, str):
            return [value] if stripped else None
    if isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value):
        return list(value) or None
    raise InputError(f"unit_tests: row {row}: `{column}` must be a list of Python snippets (strings), got {type(value).__name__}")


def row_job(row: int, columns: dict[str, Any], prompt: Any = None) -> sandbox.Job | None:
    """What the judge needs for row `row` (its code left empty): tests, entry point and trusted set-up
    code, from whichever format the row itself uses (see the module doc); None when it has no tests."""

    def col(name: str) -> Any:
        values = columns.get(name)
        return None if values is None else values[row]

    tests = _snippets(col("tests"), row, "tests")
    if tests:
        return sandbox.Job("", tests, _entry_point(col("entry_point"), row))
    test_list = _snippets(col("test_list"), row, "test_list")
    if test_list:
        imports = col("test_imports") or []
        imports = [imports] if isinstance(imports, str) else list(imports)
        setup_code = col("test_setup_code") or ""
        setup = "".join(f"{line}\n" for line in imports) + (f"{setup_code.rstrip()}\n" if setup_code.strip() else "")
        return sandbox.Job("", test_list, None, setup or None)
    test, entry = col("test"), col("entry_point")
    if test and entry:
        snippet = humaneval_snippet(test, entry)
        return sandbox.Job("", [snippet], entry, prompt_code(prompt))
    return None


def row_tests(row: int, columns: dict[str, Any]) -> list[str] | None:
    """The test snippets of row `row` (see `row_job`); None when it has none."""
    job = row_job(row, columns)
    return job.tests if job else None


def unit_tests_reward(
    *,
    timeout_s: float = sandbox.SandboxConfig.timeout_s,
    memory_mb: int = sandbox.SandboxConfig.memory_mb,
    workers: int | None = None,
    allow_unisolated: bool = False,
    name: str = "unit_tests",
) -> RewardFn:
    """A `unit_tests` reward with its own sandbox limits (the registered one uses the defaults).

    Scores each completion with the fraction of its row's test snippets that pass, the whole batch
    in parallel (`workers`, default one per CPU). None where the row has no tests, or (logged) where
    the sandbox itself or the row's set-up code failed; 0 for code that fails to load, times out or is
    killed. Raises InputError when isolation is unavailable and `allow_unisolated` is False.

    Not gameable because the judge runs the tests in its own process and sees only plain data from
    the solution's (tests/test_sandbox.py and tests/test_judge_*.py attack it in every way we know).
    """
    config = sandbox.SandboxConfig(timeout_s=timeout_s, memory_mb=memory_mb, allow_unisolated=allow_unisolated)

    def unit_tests(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        scores: list[float | None] = [None] * len(completions)
        items: list[sandbox.Job] = []
        rows: list[int] = []
        for i, completion in enumerate(completions):
            job = row_job(i, columns, prompts[i] if prompts is not None and i < len(prompts) else None)
            if job is not None:
                items.append(dataclasses.replace(job, code=extract_code(completion_text(completion))))
                rows.append(i)
        if not items:
            return scores
        try:
            results = sandbox.run_batch(items, workers=workers, config=config)
        except sandbox.SandboxUnavailable as exc:
            raise InputError(str(exc)) from None
        for i, result in zip(rows, results):
            if result.status == "infra":
                log.warning("%s: sample %d not scored (None): %s", name, i, result.error)
            else:
                scores[i] = result.passed / result.total
        return scores

    unit_tests.__name__ = name
    unit_tests.__doc__ = unit_tests_reward.__doc__
    unit_tests.gameable = False  # type: ignore[attr-defined]
    return unit_tests


_default_unit_tests = unit_tests_reward()


@register("unit_tests")
def unit_tests(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
    """Fraction of the row's test snippets that pass when the completion's code runs in the sandbox
    (defaults of `SandboxConfig`); None when the row has no tests. See `unit_tests_reward`."""
    return _default_unit_tests(prompts, completions, **columns)


register_factory("unit_tests", unit_tests_reward)


@register("code_block", gameable=True)
def code_block(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
    """GAMEABLE ON PURPOSE: pays 1.0 for writing a fenced Python code block at all, whether the code
    in it works or not. It is the classic reward whose training curve climbs to its ceiling while
    held-out quality does not move; use it to see the reward-hacking guard fire, never to train."""
    return [1.0 if has_code_block(completion_text(c)) else 0.0 for c in completions]


def load_code_problems(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Read a JSONL file of code problems (default: the set shipped with Regimen). Each line is an
    object with `prompt` (str), `tests` (a non-empty list of snippets) and optionally `answer` (a
    reference solution) and `entry_point`. Raises InputError naming the file, line and field."""
    from regimen.stages.tasks import read_jsonl

    path = Path(path) if path is not None else PROBLEMS_PATH
    rows = []
    for line_no, row in read_jsonl(path):
        if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise InputError(f"{path}:{line_no}: field 'prompt' must be a non-empty string")
        tests = row.get("tests")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise InputError(f"{path}:{line_no}: field 'tests' must be a non-empty list of Python snippets (strings)")
        for key in ("answer", "entry_point"):
            if key in row and not isinstance(row[key], str):
                raise InputError(f"{path}:{line_no}: field {key!r} must be a string")
        rows.append(row)
    return rows
