"""The shapes of the files the store reads back: a version's manifest, a failed attempt's record, a
verdict, and a stage's running marker. Anything that does not fit is treated as damaged (named by
`regimen status`, left out of reuse; the stage runs again), never trusted field by field.

pydantic validates them (strict types: `true` is not a pid, `1e400` is not a version); unknown fields
are kept, so a newer Regimen's manifests still read.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

PID_MAX = 2**22  # Linux's pid_max ceiling


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")


class Manifest(_Record):
    experiment: StrictStr
    stage: StrictStr
    role: StrictStr | None = None  # the stage's role in the registry (teach, gate, train, judge); absent before 2026-12
    version: StrictInt = Field(ge=1, le=10**9)
    status: Literal["completed", "failed"]
    fingerprint: StrictStr
    files: dict[StrictStr, StrictStr]
    file_stats: dict[StrictStr, tuple[StrictInt, StrictInt]] | None = None
    metrics: dict[StrictStr, StrictFloat | StrictInt | StrictBool | StrictStr | None] = {}
    inputs: dict[StrictStr, Any] = {}
    config: dict[StrictStr, Any] | None = None
    cycle: StrictInt | None = None
    round: StrictInt | None = None
    wall_s: StrictFloat | StrictInt | None = None
    started_at: StrictStr | None = None
    finished_at: StrictStr | None = None

    @field_validator("inputs")
    @classmethod
    def _references(cls, v: dict[str, Any]) -> dict[str, Any]:
        """Inputs are references to earlier versions (mappings) or plain values (e.g. the cycle)."""
        for key, ref in v.items():
            if isinstance(ref, dict) and not all(isinstance(k, str) for k in ref):
                raise ValueError(f"inputs.{key}: not a reference")
        return v


class Failure(_Record):
    stage: StrictStr
    error: StrictStr
    failed_at: StrictStr
    interrupted: StrictBool = False


class Verdict(_Record):
    eval_version: StrictInt = Field(ge=1, le=10**9)
    verdict: StrictStr
    cycle: StrictInt | None = None
    round: StrictInt | None = None


class Running(_Record):
    pid: StrictInt = Field(ge=1, lt=PID_MAX)
    since: StrictStr
    pid_started: StrictFloat | StrictInt | None = (
        None  # the process's start time (psutil), so a reused pid is not "running"
    )

    @field_validator("pid_started")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("not a finite time")
        return v


def parse(model: type[_Record], data: Any) -> dict[str, Any] | None:
    """`data` as a dict when it has `model`'s shape (extra fields kept), else None."""
    if not isinstance(data, dict):
        return None
    try:
        model.model_validate(data)
    except (ValidationError, ValueError, OverflowError):
        return None
    return data


def problem(model: type[_Record], data: Any) -> str | None:
    """What is wrong with `data` as a `model` (first error, naming the field), or None."""
    if not isinstance(data, dict):
        return f"not a JSON object ({type(data).__name__})"
    try:
        model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc']) or 'record'}: {err['msg']}"
    except (ValueError, OverflowError) as exc:
        return str(exc)[:120]
    return None
