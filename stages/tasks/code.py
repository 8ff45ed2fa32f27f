"""A code task the embedded model learns on a CPU: write the Python function behind a few examples.

    prompt:      f(0)=3          completion:  ```python
                 f(1)=5                       def f(x):
                 f(2)=7                         return 2*x+3
                 f(3)=9                       ```

Functions come from two families: lines `a*x+b` (a in 1..9) and parabolas `a*x*x+b` (a in 1..3), with
b in 0..b_max-1. Each problem carries unit tests at points the prompt does not show (x = 4, 5, 7, 9, 12),
so a nearly-right function (a wrong slope, a line where a parabola is needed) fails them. Held-out
problems are whole functions never trained on (a seeded share of them).

The weak teacher (`teacher.kind: task-weak`) is a solver restricted to the easy cases: it fits the line
through f(0) and f(1). It is right on every line and wrong on every parabola (a line through their first
two points), so its held-out accuracy is the share of lines, and a student that only imitates it stays
there; the unit tests know better.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field

from regimen.stages.tasks import Task, TaskOptions, check_split

NAME = "code"
TEST_POINTS = (4, 5, 7, 9, 12)
SHOWN = (0, 1, 2, 3)


class Options(TaskOptions):
    task: Literal["code"] = "code"
    b_max: int = Field(50, gt=0, le=100, description="intercepts are drawn from 0..b_max-1")
    quad_max: int = Field(3, ge=0, le=9, description="parabolas a*x*x+b for a in 1..quad_max (0: lines only)")
    heldout_fraction: float = Field(0.2, gt=0, lt=1, description="share of functions held out (seeded)")


def expression(family: str, a: int, b: int) -> str:
    core = f"{a}*x" if family == "lin" else f"{a}*x*x"
    return f"{core}+{b}" if b else core


def value(family: str, a: int, b: int, x: int) -> int:
    return a * x + b if family == "lin" else a * x * x + b


def program(expr: str) -> str:
    return f"```python\ndef f(x):\n  return {expr}\n```"


def problem(family: str, a: int, b: int) -> dict[str, Any]:
    return {
        "prompt": "".join(f"f({x})={value(family, a, b, x)}\n" for x in SHOWN),
        "answer": expression(family, a, b),
        "solution": program(expression(family, a, b)),
        "tests": [f"assert f({x}) == {value(family, a, b, x)}" for x in TEST_POINTS],
        "entry_point": "f",
        "family": family,
    }


def weak_solution(row: dict[str, Any]) -> str | None:
    """The weak teacher: the line through f(0) and f(1), whatever the function is."""
    try:
        values = {int(k[2:-1]): int(v) for k, v in (line.split("=") for line in row["prompt"].strip().splitlines())}
        a, b = values[1] - values[0], values[0]
    except (ValueError, KeyError, AttributeError):
        return None
    if a <= 0:
        return program(str(b))
    return program(expression("lin", a, b))


def load(opts: Options) -> Task:
    functions = [("lin", a, b) for b in range(opts.b_max) for a in range(1, 10)]
    functions += [("quad", a, b) for b in range(opts.b_max) for a in range(1, opts.quad_max + 1)]
    random.Random(opts.seed).shuffle(functions)
    n = max(1, round(len(functions) * opts.heldout_fraction))
    heldout = [problem(*f) for f in functions[:n]]
    train = [problem(*f) for f in functions[n:]]
    check_split(train, heldout, "the code task's training functions", "its held-out functions")
    return Task(train, heldout, NAME, reference=lambda row: row.get("solution"), weak_reference=weak_solution)


def identity(opts: Options) -> dict[str, Any]:
    return opts.model_dump(mode="json")
