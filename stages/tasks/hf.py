"""Any dataset `datasets.load_dataset` reads: a hub id (where the hub is reachable), or a builder such as
`json`, `parquet` or `csv` over local `data_files`; a split, a held-out split or a seeded held-out share,
a column mapping into Regimen's columns, and an optional system prompt that turns text prompts into
conversations (`[system, user]`), which every stage renders with the tokenizer's chat template.

    data:
      task: hf
      path: parquet
      data_files: data/train.parquet
      split: train
      heldout_split: null        # or a split name
      heldout_fraction: 0.1
      columns: {prompt: question, answer: answer}
      system_prompt: "Answer with the number only."
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from regimen.stages.core.errors import InputError
from regimen.stages.core.fingerprint import file_digest
from regimen.stages.tasks import Task, TaskOptions, as_episodes, check_rows, check_split, seeded_split

NAME = "hf"
REGIMEN_COLUMNS = (
    "prompt",
    "answer",
    "tests",
    "test_list",
    "test_setup_code",
    "test_imports",
    "test",
    "entry_point",
    "completion",
    "solution",
    "input_output",
    "verification_info",
    "public_tests",
    "private_tests",
    "generated_tests",
)


class Options(TaskOptions):
    task: Literal["hf"] = "hf"
    path: str = Field(description="a hub id, or a builder such as json/parquet/csv (with data_files)")
    data_files: str | list[str] | dict[str, str | list[str]] | None = Field(
        None, description="as load_dataset takes it: a path, a list, or a mapping split -> path(s)"
    )
    name: str | None = Field(None, description="the dataset's config name")
    revision: str | None = Field(None, description="hub datasets: a branch, tag or commit")
    split: str = "train"
    heldout_split: str | None = Field(
        None, description="a split held out for evaluation; without it, heldout_fraction of `split`"
    )
    heldout_fraction: float = Field(0.1, gt=0, lt=1)
    columns: dict[str, str] = Field({}, description="Regimen column -> dataset column, e.g. {prompt: question}")
    system_prompt: str | None = Field(None, description="when set, text prompts become [system, user] conversations")

    @model_validator(mode="after")
    def _local_files(self) -> Options:
        for f in _local_paths(self.data_files):
            if not glob.has_magic(f) and "://" not in f and not Path(f).exists():
                raise ValueError(f"data_files {f!r} does not exist")
        return self


def _local_paths(data_files: Any) -> list[str]:
    if data_files is None:
        return []
    if isinstance(data_files, str):
        return [data_files]
    if isinstance(data_files, list):
        return [str(f) for f in data_files]
    return [str(f) for v in data_files.values() for f in ([v] if isinstance(v, str) else v)]


def _describe(opts: Options, split: str) -> str:
    files = _local_paths(opts.data_files)
    return (
        f"{opts.path}{'/' + opts.name if opts.name else ''}"
        + (f" ({', '.join(files)})" if files else "")
        + f" split {split!r}"
    )


def _load_split(opts: Options, split: str) -> list[dict[str, Any]]:
    import datasets

    source = _describe(opts, split)
    # it logs its own traceback for a broken file; ours names the file in one line
    quiet = logging.getLogger("datasets")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        ds = datasets.load_dataset(
            opts.path, opts.name, data_files=opts.data_files, split=split, revision=opts.revision
        )
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise InputError(f"data: cannot load {source}: {str(exc).splitlines()[0][:300]}") from None
    except Exception as exc:  # noqa: BLE001 - datasets' own errors (DatasetGenerationError, arrow errors): name the source
        cause = exc.__cause__ or exc
        raise InputError(
            f"data: cannot load {source}: {type(cause).__name__}: "
            f"{str(cause).splitlines()[0][:300] if str(cause) else ''}"
        ) from None
    finally:
        quiet.setLevel(level)
    if len(ds) == 0:
        raise InputError(f"data: {source} is empty")
    missing = {ours: theirs for ours, theirs in opts.columns.items() if theirs not in ds.column_names}
    if missing:
        ours, theirs = next(iter(missing.items()))
        raise InputError(
            f"data.columns.{ours}: column {theirs!r} is not in {source} (its columns: {', '.join(ds.column_names)})"
        )
    rename = {theirs: ours for ours, theirs in opts.columns.items() if theirs != ours}
    rows = []
    for row in ds.to_list():
        out = {k: v for k, v in row.items() if k not in rename and k not in opts.columns}
        out.update({ours: row[theirs] for ours, theirs in opts.columns.items()})
        if opts.system_prompt is not None and isinstance(out.get("prompt"), str):
            out["prompt"] = [
                {"role": "system", "content": opts.system_prompt},
                {"role": "user", "content": out["prompt"]},
            ]
        rows.append(out)
    check_rows(rows, source, max_prompt_chars=opts.max_prompt_chars)
    return rows


def load(opts: Options) -> Task:
    dropped = 0
    train = _load_split(opts, opts.split)
    if opts.episodes:  # rows told apart by their place: a prompt may repeat
        train = as_episodes(train)
    if opts.heldout_split:
        heldout = _load_split(opts, opts.heldout_split)
        heldout = as_episodes(heldout, start=len(train)) if opts.episodes else heldout
        n = len(train)
        train = check_split(train, heldout, _describe(opts, opts.split), _describe(opts, opts.heldout_split))
        dropped = n - len(train)
    else:
        train, heldout = seeded_split(train, opts.heldout_fraction, opts.seed, _describe(opts, opts.split))
        n = len(train)
        train = check_split(train, heldout, _describe(opts, opts.split), "its held-out share")
        dropped = n - len(train)
    return Task(train, heldout, NAME, dropped_heldout=dropped)


def identity(opts: Options) -> dict[str, Any]:
    """The options plus the data's content: local files by their sha256 (in name order, not by path: a
    moved folder is the same data, a new partition is new data); a hub dataset by its rows as loaded."""
    files = sorted(
        {
            p
            for f in _local_paths(opts.data_files)
            for p in (glob.glob(f, recursive=True) if glob.has_magic(f) else [f])
            if "://" not in p
        }
    )
    if files or Path(opts.path).exists():
        ident = opts.model_dump(mode="json", exclude={"data_files"} | ({"path"} if Path(opts.path).exists() else set()))
        found = files or [str(p) for p in sorted(Path(opts.path).rglob("*")) if p.is_file()]
        ident["files_sha256"] = [file_digest(f) for f in found]
        return ident
    ident = opts.model_dump(mode="json")
    ident["rows_sha256"] = _rows_digest(json.dumps(ident, sort_keys=True))
    return ident


@functools.lru_cache(maxsize=16)
def _rows_digest(key: str) -> str:
    """A hub dataset's identity: the sha256 of its rows as loaded (its content, not a library's cache key)."""
    opts = Options.model_validate(json.loads(key))
    task = load(opts)
    h = hashlib.sha256()
    for side in (task.train, task.heldout):
        for row in side:
            h.update(json.dumps(row, sort_keys=True, default=str).encode() + b"\n")
        h.update(b"--\n")
    return h.hexdigest()
