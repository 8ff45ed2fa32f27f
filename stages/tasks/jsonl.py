"""Local JSONL task files: one object per line with `prompt`, `answer` and any columns rewards need.

Read line by line (`read_jsonl`), so every problem is reported with its file and line, and a single
huge line is refused before it costs memory. Any other format or source (the hub, parquet, CSV, JSON
with a column mapping) goes through `datasets.load_dataset`: `data.task: hf`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from regimen.stages.fingerprint import file_digest
from regimen.stages.tasks import Task, TaskOptions, check_rows, check_split, read_jsonl, same_columns, seeded_split

NAME = "jsonl"


class Options(TaskOptions):
    task: Literal["jsonl"] = "jsonl"
    train_file: str = Field(description="rows with `prompt`, `answer` and reward columns")
    heldout_file: str | None = Field(None, description="held-out rows; without it, heldout_fraction of train_file is held out")
    heldout_fraction: float = Field(0.25, gt=0, lt=1, description="without heldout_file: share of rows held out (seeded split)")

    @model_validator(mode="after")
    def _files(self) -> Options:
        for name in ("train_file", "heldout_file"):
            value = getattr(self, name)
            if value and not Path(value).is_file():
                raise ValueError(f"{name} {value!r} does not exist")
        return self


def _rows(path: str, max_prompt_chars: int) -> list[dict[str, Any]]:
    rows = [row for _, row in read_jsonl(path)]
    check_rows(rows, path, max_prompt_chars=max_prompt_chars)
    return rows


def _load_files(opts: Options) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    train = _rows(opts.train_file, opts.max_prompt_chars)
    heldout = _rows(opts.heldout_file, opts.max_prompt_chars) if opts.heldout_file else None
    every = same_columns(train + (heldout or []))
    return every[: len(train)], (every[len(train):] if heldout is not None else None)


def load(opts: Options) -> Task:
    train, heldout = _load_files(opts)
    if heldout is not None:
        check_split(train, heldout, opts.train_file, opts.heldout_file)
    else:
        train, heldout = seeded_split(train, opts.heldout_fraction, opts.seed, opts.train_file)
        check_split(train, heldout, opts.train_file, f"the held-out share of {opts.train_file}")
    return Task(train, heldout, NAME)


def identity(opts: Options) -> dict[str, Any]:
    ident = opts.model_dump(mode="json")
    ident["train_sha256"] = file_digest(opts.train_file)
    if opts.heldout_file:
        ident["heldout_sha256"] = file_digest(opts.heldout_file)
    return ident
