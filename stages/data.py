"""Task data: the generated addition task (with its exact solver as teacher) and JSONL task files.

Rows are plain dicts with `prompt` and `answer` (plus any columns rewards need, e.g. `tests`).
The train and held-out splits never share a prompt.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from collections.abc import Iterator
from typing import Any

from stages.errors import InputError


def addition_prompt(a: int, b: int) -> str:
    return f"Q: {a}+{b}="


def addition_rows(n: int, *, seed: int, max_operand: int, exclude: set[str] | None = None) -> list[dict[str, Any]]:
    """`n` distinct addition problems `Q: a+b=` → `a+b`, drawn with `seed`, avoiding `exclude`."""
    rng = random.Random(seed)
    space = (max_operand + 1) ** 2
    exclude = exclude or set()
    if n > space - len(exclude):
        raise InputError(f"data: asked for {n} distinct problems but max_operand={max_operand} allows only {space - len(exclude)}")
    rows, seen = [], set(exclude)
    while len(rows) < n:
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        prompt = addition_prompt(a, b)
        if prompt in seen:
            continue
        seen.add(prompt)
        rows.append({"prompt": prompt, "answer": str(a + b)})
    return rows


def solve_addition(prompt: str) -> str | None:
    """The task's reference solver (the oracle teacher)."""
    try:
        body = prompt.split("Q:", 1)[1].strip().rstrip("=")
        a, b = body.split("+")
        return str(int(a) + int(b))
    except (IndexError, ValueError):
        return None


def read_jsonl(path: str | Path, *, required: tuple[str, ...] = ()) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line_number, object)` for each non-blank line of a JSONL file. Raises InputError naming
    the file, the line and the field for a missing file, an empty file, invalid JSON, a line that is
    not an object, or a missing required field."""
    path = Path(path)
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    seen = False
    with f:
        try:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"{path}:{line_no}: invalid JSON ({exc.msg} at column {exc.colno})") from None
                if not isinstance(row, dict):
                    raise InputError(f"{path}:{line_no}: each line must be a JSON object, got {type(row).__name__}")
                for key in required:
                    if key not in row:
                        raise InputError(f"{path}:{line_no}: missing field {key!r}")
                seen = True
                yield line_no, row
        except UnicodeDecodeError as exc:
            raise InputError(f"{path}: not UTF-8 text ({exc.reason})") from None
    if not seen:
        raise InputError(f"{path}: the file holds no samples (it is empty)")


def load_jsonl(path: str | Path, *, required: tuple[str, ...] = ("prompt",)) -> list[dict[str, Any]]:
    """Rows of a JSONL task file; errors name the file, the line and the field."""
    return [row for _, row in read_jsonl(path, required=required)]


def digest_rows(rows: list[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


class Task:
    """A task's rows: `train` for SFT traces and GRPO prompts, `heldout` for evaluation only."""

    def __init__(self, train: list[dict[str, Any]], heldout: list[dict[str, Any]], kind: str):
        self.train, self.heldout, self.kind = train, heldout, kind

    def reference(self, row: dict[str, Any]) -> str | None:
        """The oracle teacher's completion for a row: the task's solver, else the row's own reference."""
        if self.kind == "addition":
            return solve_addition(row["prompt"])
        for key in ("completion", "solution", "answer"):
            if row.get(key) not in (None, ""):
                return str(row[key])
        return None


def load_task(data) -> Task:
    """The recipe's `data` section as rows (generated deterministically, or read from JSONL)."""
    if data.task == "addition":
        heldout = addition_rows(data.heldout_size, seed=data.seed * 1000 + 1, max_operand=data.max_operand)
        train = addition_rows(data.train_size, seed=data.seed * 1000 + 2, max_operand=data.max_operand, exclude={r["prompt"] for r in heldout})
        return Task(train, heldout, "addition")
    train = load_jsonl(data.train_file)
    if data.heldout_file:
        heldout = load_jsonl(data.heldout_file)
    else:
        rows = shuffled(train, seed=data.seed)
        n = max(1, round(len(rows) * data.heldout_fraction))
        if n >= len(rows):
            raise InputError(f"data: {data.train_file} has too few rows ({len(rows)}) to hold out {data.heldout_fraction:.0%}")
        heldout, train = rows[:n], rows[n:]
    overlap = {json.dumps(r["prompt"], sort_keys=True) for r in train} & {json.dumps(r["prompt"], sort_keys=True) for r in heldout}
    if overlap:
        raise InputError(f"data: {len(overlap)} prompt(s) appear in both {data.train_file} and {data.heldout_file}; held-out prompts must never be trained on")
    return Task(train, heldout, "jsonl")


def data_identity(data) -> dict[str, Any]:
    """What the data is, for fingerprints: the section, plus the files' digests for JSONL tasks."""
    ident = data.model_dump(mode="json")
    if data.task == "jsonl":
        from stages.store import sha256_file

        ident["train_sha256"] = sha256_file(Path(data.train_file))
        if data.heldout_file:
            ident["heldout_sha256"] = sha256_file(Path(data.heldout_file))
    return ident


def shuffled(rows: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    out = list(rows)
    random.Random(seed).shuffle(out)
    return out
