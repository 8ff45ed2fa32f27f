"""The embedded default task: two-number addition (`Q: 37+48=` → `85`), generated in code, with an exact
solver as the oracle teacher. Train and held-out problems are disjoint by construction."""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field, model_validator

from regimen.stages.core.errors import InputError
from regimen.stages.tasks import Task, TaskOptions

NAME = "addition"


class Options(TaskOptions):
    task: Literal["addition"] = "addition"
    train_size: int = Field(9000, gt=0, le=10**8, description="distinct training problems")
    heldout_size: int = Field(200, gt=0, le=10**8, description="distinct held-out problems (never trained on)")
    max_operand: int = Field(99, gt=0, le=10**6, description="operands are drawn from 0..max_operand")

    @model_validator(mode="after")
    def _fits(self) -> Options:
        if self.train_size + self.heldout_size > (self.max_operand + 1) ** 2:
            raise ValueError(
                f"train_size + heldout_size exceeds the {(self.max_operand + 1) ** 2} distinct problems max_operand "
                f"allows"
            )
        return self


def prompt(a: int, b: int) -> str:
    return f"Q: {a}+{b}="


def rows(n: int, *, seed: int, max_operand: int, exclude: set[str] | None = None) -> list[dict[str, Any]]:
    """`n` distinct addition problems drawn with `seed`, avoiding `exclude`."""
    rng = random.Random(seed)
    space = (max_operand + 1) ** 2
    exclude = exclude or set()
    if n > space - len(exclude):
        raise InputError(
            f"data: asked for {n} distinct problems but max_operand={max_operand} allows only {space - len(exclude)}"
        )
    out, seen = [], set(exclude)
    while len(out) < n:
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        p = prompt(a, b)
        if p in seen:
            continue
        seen.add(p)
        out.append({"prompt": p, "answer": str(a + b)})
    return out


def solve(row: dict[str, Any]) -> str | None:
    """The task's reference solver (the oracle teacher)."""
    try:
        body = row["prompt"].split("Q:", 1)[1].strip().rstrip("=")
        a, b = body.split("+")
        return str(int(a) + int(b))
    except (IndexError, ValueError, AttributeError):
        return None


def load(opts: Options) -> Task:
    heldout = rows(opts.heldout_size, seed=opts.seed * 1000 + 1, max_operand=opts.max_operand)
    train = rows(
        opts.train_size, seed=opts.seed * 1000 + 2, max_operand=opts.max_operand, exclude={r["prompt"] for r in heldout}
    )
    return Task(train, heldout, NAME, reference=solve)


def identity(opts: Options) -> dict[str, Any]:
    return opts.model_dump(mode="json")
