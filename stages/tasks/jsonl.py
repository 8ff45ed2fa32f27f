"""Local JSONL task files: one object per line with `prompt`, `answer` and any columns rewards need.

`train_file` is a file, a glob (`data/day=*/train.jsonl`) or a folder (every `*.jsonl` below it): data
that grows night after night by new partitions. Files are read in name order. The data's identity (what
enters fingerprints) is its rows, not where they live: moving the folder changes nothing.

Read line by line (`read_jsonl`), so every problem is reported with its file and line, and a single
huge line is refused before it costs memory. Any other format or source (the hub, parquet, CSV, JSON
with a column mapping) goes through `datasets.load_dataset`: `data.task: hf`.
"""

from __future__ import annotations

import glob
import hashlib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from regimen.stages.core.fingerprint import file_digest
from regimen.stages.tasks import (
    Task,
    TaskOptions,
    as_episodes,
    check_rows,
    check_split,
    read_jsonl,
    same_columns,
    seeded_split,
)

NAME = "jsonl"


class Options(TaskOptions):
    task: Literal["jsonl"] = "jsonl"
    train_file: str = Field(
        description="rows with `prompt`, `answer` and reward columns: a file, a glob, or a folder of *.jsonl"
    )
    heldout_file: str | None = Field(
        None, description="held-out rows; without it, heldout_fraction of train_file is held out"
    )
    heldout_fraction: float = Field(
        0.25, gt=0, lt=1, description="without heldout_file: share of rows held out (seeded split)"
    )

    @model_validator(mode="after")
    def _files(self) -> Options:
        if not files(self.train_file):
            raise ValueError(f"train_file {self.train_file!r}: no such file, and no *.jsonl matches it")
        if self.heldout_file and not Path(self.heldout_file).is_file():
            raise ValueError(f"heldout_file {self.heldout_file!r} does not exist")
        return self


def files(spec: str) -> list[str]:
    """The files `spec` names: itself, what a glob matches, or every *.jsonl under a folder; name order."""
    path = Path(spec)
    if path.is_file():
        return [spec]
    if path.is_dir():
        return sorted(str(p) for p in path.rglob("*.jsonl") if p.is_file())
    return sorted(p for p in glob.glob(spec, recursive=True) if Path(p).is_file()) if glob.has_magic(spec) else []


def _rows(spec: str, max_prompt_chars: int) -> list[dict[str, Any]]:
    rows = [row for path in files(spec) for _, row in read_jsonl(path)]
    check_rows(rows, spec, max_prompt_chars=max_prompt_chars)
    return rows


def _load_files(opts: Options) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    train = _rows(opts.train_file, opts.max_prompt_chars)
    heldout = _rows(opts.heldout_file, opts.max_prompt_chars) if opts.heldout_file else None
    every = same_columns(train + (heldout or []))
    return every[: len(train)], (every[len(train) :] if heldout is not None else None)


def load(opts: Options) -> Task:
    dropped = 0
    train, heldout = _load_files(opts)
    if opts.episodes:  # rows told apart by their place: a prompt may repeat
        train = as_episodes(train)
        heldout = as_episodes(heldout, start=len(train)) if heldout is not None else None
    if heldout is not None:
        n = len(train)
        train = check_split(train, heldout, opts.train_file, opts.heldout_file)
        dropped = n - len(train)
    else:
        train, heldout = seeded_split(train, opts.heldout_fraction, opts.seed, opts.train_file)
        n = len(train)
        train = check_split(train, heldout, opts.train_file, f"the held-out share of {opts.train_file}")
        dropped = n - len(train)
    return Task(train, heldout, NAME, dropped_heldout=dropped)


def identity(opts: Options) -> dict[str, Any]:
    """The options without paths, and the rows' content: each file's sha256, in name order."""
    ident = opts.model_dump(mode="json", exclude={"train_file", "heldout_file"})
    ident["train_sha256"] = hashlib.sha256(
        "\n".join(file_digest(f) for f in files(opts.train_file)).encode()
    ).hexdigest()
    if opts.heldout_file:
        ident["heldout_sha256"] = file_digest(opts.heldout_file)
    return ident
