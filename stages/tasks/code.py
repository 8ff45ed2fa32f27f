"""A code task the embedded model learns on a CPU: write the Python function behind a few examples.

    prompt:      f(0)=3          completion:  ```python
                 f(1)=5                       def f(x):
                 f(2)=7                         return 2*x+3
                 f(3)=9                       ```

Functions are lines `a*x+b` (a in 1..9, b in 0..b_max-1) and, optionally, parabolas `a*x*x+b` (a in
1..quad_max). Each problem carries unit tests at points the prompt does not show (x = 4, 5, 7, 9, 12),
so a nearly-right function (a slope off by one, a line where a parabola is needed) fails them all.
Held-out problems are whole functions never trained on (a seeded share of them). Completions stay
short (about 40 characters), so the character-level model trains on them in minutes.

With `io: stdio` the same functions are stdin/stdout problems, as APPS, TACO and CodeContests pose
them: the answer is a program that reads x and prints f(x) (```python x=int(input()) print(2*x+3)```),
and each row carries APPS's `input_output` cases at the same unseen points, so the judge runs the
program once per case and compares its output.

The weak teacher (`teacher.kind: weak`) is a solver restricted to the easy cases: it reads the intercept
and the slope from the examples, and is exact for slopes up to `weak_max_slope`; above that it is unsure
by one and writes a slope of a-1, a or a+1 (a fixed choice per problem, seeded by the problem itself),
so it is right on a known part of the task: all small slopes and a third of the large ones (a parabola
it takes for the line through f(0) and f(1)). A student that only imitates it learns the same
uncertainty and stays near its accuracy; the unit tests know which slope is right.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from regimen.stages.core.errors import InputError
from regimen.stages.tasks import Task, TaskOptions, check_split, read_jsonl

NAME = "code"
PROBLEMS_PATH = Path(__file__).parent / "problems" / "code_problems.jsonl"
"""The small code-problem set shipped with Regimen (prompt, answer, tests, entry_point): the recipes'
`train_file` for the `unit_tests` reward."""
TEST_POINTS = (4, 5, 7, 9, 12)
SHOWN = (0, 1, 2, 3)
_EXAMPLE = re.compile(r"^f\((-?\d+)\)=(-?\d+)$")


class Options(TaskOptions):
    task: Literal["code"] = "code"
    io: Literal["function", "stdio"] = Field(
        "function",
        description="function: write def f(x), judged by unit tests; "
        "stdio: write a program that reads x and prints f(x), judged on stdin/stdout cases (APPS's input_output)",
    )
    b_max: int = Field(50, gt=0, le=100, description="intercepts are drawn from 0..b_max-1")
    quad_max: int = Field(0, ge=0, le=9, description="parabolas a*x*x+b for a in 1..quad_max (0: lines only)")
    heldout_fraction: float = Field(0.2, gt=0, lt=1, description="share of functions held out (seeded)")
    weak_max_slope: int = Field(
        4, ge=0, le=9, description="the weak teacher is exact for slopes up to this; unsure by one above"
    )


def expression(family: str, a: int, b: int) -> str:
    core = f"{a}*x" if family == "lin" else f"{a}*x*x"
    return f"{core}+{b}" if b else core


def value(family: str, a: int, b: int, x: int) -> int:
    return a * x + b if family == "lin" else a * x * x + b


def program(expr: str, io: str = "function") -> str:
    if io == "stdio":
        return f"```python\nx=int(input())\nprint({expr})\n```"
    return f"```python\ndef f(x):\n  return {expr}\n```"


def problem(family: str, a: int, b: int, io: str = "function") -> dict[str, Any]:
    row = {
        "prompt": "".join(f"f({x})={value(family, a, b, x)}\n" for x in SHOWN),
        "answer": expression(family, a, b),
        "solution": program(expression(family, a, b), io),
        "family": family,
        "slope": a,
    }
    if io == "stdio":  # APPS's format: stdin/stdout cases, judged as the program's output
        row["input_output"] = json.dumps(
            {"inputs": [f"{x}\n" for x in TEST_POINTS], "outputs": [f"{value(family, a, b, x)}\n" for x in TEST_POINTS]}
        )
    else:
        row.update(tests=[f"assert f({x}) == {value(family, a, b, x)}" for x in TEST_POINTS], entry_point="f")
    return row


def weak_solution(row: dict[str, Any], max_slope: int = 4, io: str = "function") -> str | None:
    """The weak teacher: intercept f(0), slope f(1)-f(0); exact up to `max_slope`, unsure by one above."""
    try:
        values = dict(
            tuple(int(v) for v in _EXAMPLE.match(line).groups()) for line in row["prompt"].strip().splitlines()
        )  # type: ignore[union-attr]
        a, b = values[1] - values[0], values[0]
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    if a > max_slope:
        a += int(hashlib.sha256(row["prompt"].encode()).hexdigest(), 16) % 3 - 1
    return program(expression("lin", a, b), io) if a > 0 else program(str(b), io)


def load(opts: Options) -> Task:
    functions = [("lin", a, b) for b in range(opts.b_max) for a in range(1, 10)]
    functions += [("quad", a, b) for b in range(opts.b_max) for a in range(1, opts.quad_max + 1)]
    random.Random(opts.seed).shuffle(functions)
    n = max(1, round(len(functions) * opts.heldout_fraction))
    heldout = [problem(*f, io=opts.io) for f in functions[:n]]
    train = [problem(*f, io=opts.io) for f in functions[n:]]
    train = check_split(train, heldout, "the code task's training functions", "its held-out functions")
    return Task(
        train,
        heldout,
        NAME,
        reference=lambda row: row.get("solution"),
        weak_reference=lambda row: weak_solution(row, opts.weak_max_slope, opts.io),
    )


def identity(opts: Options) -> dict[str, Any]:
    return opts.model_dump(mode="json")


def load_code_problems(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Read a JSONL file of code problems (default: the set shipped with Regimen). Each line is an
    object with `prompt` (str), `tests` (a non-empty list of snippets) and optionally `answer` (a
    reference solution) and `entry_point`. Raises InputError naming the file, line and field."""
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
