"""Tasks: where a recipe's rows come from, checked at the door.

A task is a module with `NAME`, `Options` (a pydantic model of its `data:` fields, `task: Literal[NAME]`),
`load(options) -> Task` and `identity(options) -> dict` (what enters fingerprints: the options plus the
data's digest). `registry.py` lists them; adding a task touches its module and the registry, nothing else.

Rows are plain dicts with `prompt` (text, or a conversation: a list of `{role, content}` messages) and
usually `answer`, plus any columns rewards need (`tests`, `test_list`, `entry_point`, ...). The train and
held-out splits never share a prompt, also after whitespace and case normalisation.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from regimen.stages.core.errors import InputError

log = logging.getLogger("regimen.data")

MAX_ROW_BYTES = 1 << 20


class TaskOptions(BaseModel):
    """Fields every task's `data:` section has."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    seed: int = Field(0, ge=0, le=2**32 - 1, description="seed of generated data and of held-out splits")
    max_prompt_chars: int = Field(
        8000, gt=0, le=10**7, description="a longer prompt is refused (it would cost memory, not teach)"
    )
    episodes: bool = Field(
        False,
        description="each row is one episode of an environment: rows are told apart by their place (an `episode` "
        "column), not by their prompt, so a prompt may repeat (the environment makes each episode different) and the "
        "held-out set is a set of fresh episodes; on by default for jsonl and hf data with an environment",
    )

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """As pydantic's, without `episodes` while it is off: the data's identity (fingerprints) stays what it was
        before the field existed."""
        out = super().model_dump(**kwargs)
        if not self.episodes:
            out.pop("episodes", None)
        return out


@dataclass
class Task:
    """A task's rows: `train` for SFT traces and GRPO prompts, `heldout` for evaluation only."""

    train: list[dict[str, Any]]
    heldout: list[dict[str, Any]]
    name: str
    reference: Callable[[dict[str, Any]], str | None] = field(default=lambda row: row_reference(row))
    """The oracle teacher's completion for a row."""
    weak_reference: Callable[[dict[str, Any]], str | None] | None = None
    """The task's weak teacher (right on a known part of the task), where it has one."""
    dropped_heldout: int = 0
    """Training rows left out because their prompt is in the experiment's frozen held-out set."""


def row_reference(row: dict[str, Any]) -> Any:
    """A row's own reference completion: `completion`, `solution` or `answer`, the first that is set. A conversational
    completion (TRL's format: a list of messages, tool calls and tool replies included) is kept as the messages it is,
    never turned into the text of a Python list."""
    for key in ("completion", "solution", "answer"):
        value = row.get(key)
        if value in (None, "", []):
            continue
        if key == "completion" and isinstance(value, list) and all(isinstance(m, dict) for m in value):
            return [dict(m) for m in value]
        return str(value)
    return None


def shuffled(rows: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    out = list(rows)
    random.Random(seed).shuffle(out)
    return out


def normalized_prompt(prompt: Any) -> str:
    """The prompt as compared for duplicates and train/held-out overlap: whitespace and case folded."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
    return " ".join(text.split()).casefold()


EPISODE = "episode"
"""The column that tells an episode task's rows apart (`TaskOptions.episodes`): the row's place in its data."""


def row_key(row: dict[str, Any]) -> str:
    """A row's identity for splits, overlap and pass rates: its normalised prompt; an episode's place beside it."""
    key = normalized_prompt(row["prompt"])
    return f"{key}\x00episode={row[EPISODE]}" if row.get(EPISODE) is not None else key


def as_episodes(rows: list[dict[str, Any]], start: int = 0) -> list[dict[str, Any]]:
    """Rows numbered as episodes (`EPISODE`), from `start`, unless they carry their own numbers."""
    return [r if r.get(EPISODE) is not None else {**r, EPISODE: start + i} for i, r in enumerate(rows)]


def check_prompt(prompt: Any, where: str, max_chars: int) -> None:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise InputError(f"{where}: 'prompt' is empty")
        size = len(prompt)
    elif isinstance(prompt, list) and prompt:
        for i, m in enumerate(prompt):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise InputError(
                    f"{where}: 'prompt' message {i} must be {{role: str, content: str}}, got {str(m)[:80]!r}"
                )
        size = sum(len(m["content"]) for m in prompt)
    else:
        kind = "null" if prompt is None else type(prompt).__name__
        raise InputError(f"{where}: 'prompt' must be text or a list of chat messages, got {kind}")
    if size > max_chars:
        raise InputError(
            f"{where}: 'prompt' is {size} characters, over data.max_prompt_chars={max_chars} "
            "(raise it if the model's context allows)"
        )


def check_rows(rows: list[dict[str, Any]], source: str, *, max_prompt_chars: int) -> None:
    """Types per row, named by source and row: prompt text or messages, answer a string or number."""
    if not rows:
        raise InputError(f"{source}: no rows")
    for i, row in enumerate(rows, 1):
        where = f"{source}: row {i}"
        if "prompt" not in row:
            raise InputError(
                f"{where}: missing column 'prompt' (columns: {', '.join(sorted(row)) or 'none'}; map yours with "
                f"data.columns)"
            )
        check_prompt(row["prompt"], where, max_prompt_chars)
        if "answer" in row and row["answer"] is not None and not isinstance(row["answer"], (str, int, float)):
            raise InputError(f"{where}: 'answer' must be text or a number, got {type(row['answer']).__name__}")


def same_columns(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row with every column any row has (absent ones as None): `datasets.Dataset.from_list` and the
    stages read the first row's columns, so a column only later rows carry would silently vanish."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k) for k in keys} for r in rows]


def check_split(
    train: list[dict[str, Any]], heldout: list[dict[str, Any]], train_source: str, heldout_source: str
) -> list[dict[str, Any]]:
    """The training rows without those whose prompt is also a held-out prompt (after normalisation):
    held-out prompts are never trained on. Dropped rows and repeated prompts are reported, not refused."""
    held = {row_key(r) for r in heldout}
    train_keys = [row_key(r) for r in train]
    seen: set[str] = set()
    dups = sum(1 for k in train_keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
    if dups:
        log.warning(
            "%s: %d training prompt(s) repeat an earlier one (after whitespace and case normalisation)",
            train_source,
            dups,
        )
    kept = [r for r, k in zip(train, train_keys) if k not in held]
    if len(kept) < len(train):
        log.warning(
            "data: %d training row(s) of %s are held-out prompts of %s (after whitespace and case normalisation): left "
            "out of training",
            len(train) - len(kept),
            train_source,
            heldout_source,
        )
    if not kept:
        raise InputError(f"data: every training row of {train_source} is a held-out prompt of {heldout_source}")
    return kept


def seeded_split(
    rows: list[dict[str, Any]], fraction: float, seed: int, source: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, heldout): a seeded share of the distinct prompts held out. Rows whose prompts are the same
    after normalisation go to the same side, so the split never puts copies of a row on both."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row_key(row), []).append(row)
    keys = shuffled(list(groups), seed=seed)
    n = max(1, round(len(keys) * fraction))
    if n >= len(keys):
        raise InputError(f"data: {source} has too few distinct prompts ({len(keys)}) to hold out {fraction:.0%}")
    held = set(keys[:n])
    return [r for r in shuffled(rows, seed=seed) if row_key(r) not in held], [groups[k][0] for k in keys[:n]]


def with_frozen_heldout(task: Task, frozen: list[dict[str, Any]]) -> Task:
    """The task evaluated on a frozen held-out set: `heldout` is exactly `frozen`, and training rows whose
    prompt equals a frozen one (after normalisation) are dropped and counted (`dropped_heldout`)."""
    keys = {row_key(r) for r in frozen}
    train = [r for r in task.train if row_key(r) not in keys]
    if not train:
        raise InputError(
            "data: every training row is a prompt of the experiment's frozen held-out set; add new rows, "
            "or start a new set with `regimen heldout refresh`"
        )
    return Task(
        train,
        list(frozen),
        task.name,
        task.reference,
        task.weak_reference,
        dropped_heldout=len(task.train) - len(train),
    )


def read_jsonl(
    path: str | Path, *, required: tuple[str, ...] = (), max_row_bytes: int = MAX_ROW_BYTES
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line_number, object)` for each non-blank line of a JSONL file. Raises InputError naming
    the file, the line and the field for a missing file, an empty file, invalid JSON, a line that is
    not an object, a line over `max_row_bytes`, or a missing required field."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    seen = False
    with f:
        line_no = 0
        while True:
            raw = f.readline(max_row_bytes + 1)
            if not raw:
                break
            line_no += 1
            if len(raw) > max_row_bytes and not raw.endswith(b"\n"):
                raise InputError(
                    f"{path}:{line_no}: the line is over {max_row_bytes // 1024} KiB; rows that large would cost "
                    f"memory, not teach"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{path}:{line_no}: not UTF-8 text ({exc.reason})") from None
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
    if not seen:
        raise InputError(f"{path}: the file holds no samples (it is empty)")
