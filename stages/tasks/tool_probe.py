"""`tool_probe`: a task where the tool matters (the `probe` environment, `stages/environments/probe.py`).
Each row hides a line f(x) = a*x + b; the user asks `f(x)=?` for one x and shows no example, so only the
`probe(x)` tool can tell the answer. The oracle teacher's trace calls `probe` at the asked point, reads the
value and answers with it: an assistant tool call, the tool's result, the final answer (multi-turn SFT
trains on the assistant turns only). Without the tool the answer is a guess.

The weak teacher (`teacher.kind: weak`) uses the tool on about a third of the questions and guesses on
the rest (it answers x itself): which ones is decided by a digest of the question, which no student can
learn to predict. A student trained to convergence on its traces has learnt the tool's format
and calls the tool about as often as its teacher did; sampled, its groups mix right and wrong episodes,
which is what GRPO needs to learn that the tool pays. (A student stopped early on the oracle's traces
sits on the steep edge where the format is learnt, and a float kernel or a data draw moves it off.)"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Literal

from pydantic import Field, model_validator

from regimen.stages.tasks import Task, TaskOptions

NAME = "tool_probe"


class Options(TaskOptions):
    task: Literal["tool_probe"] = "tool_probe"
    train_size: int = Field(2000, gt=0, le=10**7, description="distinct training questions")
    heldout_size: int = Field(200, gt=0, le=10**7, description="distinct held-out questions (never trained on)")
    max_a: int = Field(9, ge=1, le=10**4, description="slopes are drawn from 1..max_a")
    max_b: int = Field(99, ge=0, le=10**6, description="intercepts from 0..max_b")
    max_x: int = Field(99, ge=1, le=10**6, description="the asked point from 0..max_x")

    @model_validator(mode="after")
    def _fits(self) -> Options:
        if self.train_size + self.heldout_size > 10**5:
            raise ValueError("train_size + heldout_size: at most 100000 distinct questions")
        return self


def question(case: int, x: int) -> list[dict[str, str]]:
    """`#<case> f(<x>)=?`: the case number (5 digits) tells rows apart (each hides its own line) and says nothing of
    it."""
    return [{"role": "user", "content": f"#{case:05d} f({x})=?"}]


def rows(n: int, *, seed: int, opts: Options, cases: list[int]) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for case in cases[:n]:
        a, b, x = rng.randint(1, opts.max_a), rng.randint(0, opts.max_b), rng.randint(0, opts.max_x)
        out.append({"prompt": question(case, x), "answer": str(a * x + b), "a": a, "b": b, "x": x})
    return out


def oracle(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool-using trace: call probe at the asked point, then answer with what it returned."""
    value = str(int(row["a"]) * int(row["x"]) + int(row["b"]))
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "probe", "arguments": {"x": int(row["x"])}}}],
        },
        {"role": "tool", "name": "probe", "content": value},
        {"role": "assistant", "content": value},
    ]


WEAK_TOOL_SHARE = 0.35
"""The share of questions on which the weak teacher calls the tool."""


def weak_solution(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The weak teacher's trace: the oracle's on about WEAK_TOOL_SHARE of the questions (by a digest of the
    question), else a guess without the tool: x itself."""
    share = int(hashlib.sha256(repr(row["prompt"]).encode()).hexdigest()[:8], 16) / 16**8
    return oracle(row) if share < WEAK_TOOL_SHARE else [{"role": "assistant", "content": str(int(row["x"]))}]


def load(opts: Options) -> Task:
    # distinct prompts
    cases = random.Random(opts.seed * 1000 + 10).sample(range(10**5), opts.heldout_size + opts.train_size)
    heldout = rows(opts.heldout_size, seed=opts.seed * 1000 + 11, opts=opts, cases=cases[: opts.heldout_size])
    train = rows(opts.train_size, seed=opts.seed * 1000 + 12, opts=opts, cases=cases[opts.heldout_size :])
    return Task(train, heldout, NAME, reference=oracle, weak_reference=weak_solution)


def identity(opts: Options) -> dict[str, Any]:
    return opts.model_dump(mode="json")
