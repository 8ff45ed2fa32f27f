"""Rewards for code tasks: `unit_tests` (the fraction of a row's tests that pass, judged in the sandbox)
and `code_block` (gameable on purpose).

`unit_tests` reads each row in its own format (`code_rows.py`: test snippets, MBPP, HumanEval, KodCode's
pytest files, and the stdin/stdout and call-based formats of APPS/TACO, open-r1, DeepCoder, LiveCodeBench
and CodeContests), finds the solution in the
completion as a person would (`solutions.py`: the blocks that define what the tests call, a
continuation of a code prompt judged as prompt + completion, blocks in other languages ignored), and
judges it in the sandbox (`regimen.stages.sandbox`): the tests run in a judge process apart from the
solution's. A row with no tests has no opinion (None), and so has a row whose tests pass with no
solution at all (it pays anything: reported at the door, `door`).

Pay once: that no-solution baseline is judged once per row content, not once per process. It is kept
in a file per judge version (`$REGIMEN_CACHE/judge-baselines/<version>.jsonl`, `~/.cache/regimen` by
default, or the reward's `baseline_cache` folder), keyed by the digest of the row's job (its tests,
set-up, cases, limits), and the version is the digest of the sandbox's own code and the Python that runs
it: an edit to the judge, a new Python, a changed row or limit each judge the baseline again. Only
baselines the sandbox judged (`status == "ok"`) are kept; a failure of the sandbox is judged again
next time. A line is appended with one write (O_APPEND), so processes sharing the folder never mix
lines; a torn last line is skipped. Hand-written rather than a store entry: the reward is called deep in
TRL's loop, with no store at hand, and the file is a cache (removing it costs one baseline per row).

Importing this module registers both rewards in `regimen.stages.rewards` (which imports it lazily).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

from regimen.stages import sandbox
from regimen.stages.core.errors import InputError
from regimen.stages.rewards.code_rows import evaluates, humaneval_snippet, mbpp_snippets, row_job  # noqa: F401  (the formats, re-exported)
from regimen.stages.rewards.registry import RewardFn, completion_text, register, register_factory
from regimen.stages.rewards.solutions import find_solution, needed_names, prompt_code
from regimen.stages.sandbox.harness import needs_fixtures

log = logging.getLogger("regimen.rewards")

# A complete fenced block whose info string is python, python3, py or empty (code_block's notion of a block).
_FENCE = re.compile(
    r"^[ \t]*```[ \t]*(?:python3?|py)?[ \t]*\r?\n(.*?)^[ \t]*```[ \t]*$", re.DOTALL | re.MULTILINE | re.IGNORECASE
)


def extract_code(text: str) -> str:
    """The code of a completion when nothing is known of its tests: its last Python block (see
    `solutions.find_solution` for the rule the reward uses)."""
    return find_solution(text)


def has_code_block(text: str) -> bool:
    """Whether the text holds at least one complete fenced Python (or bare) code block."""
    return _FENCE.search(text) is not None


def row_tests(row: int, columns: dict[str, Any]) -> list[str] | None:
    """The test snippets of row `row` (see `row_job`); None when it has none."""
    job = row_job(row, columns)
    return job.tests if job else None


def solution_for(completion: Any, job: sandbox.Job, prompt: Any = None) -> str:
    """The code to judge for one completion of a row (see `solutions.py`)."""
    text = completion_text(completion)
    if job.mode == "programs":
        return find_solution(text, programs=True)
    code = prompt_code(prompt)
    solution = find_solution(text, needs=needed_names(job.tests, job.entry_point, job.setup), prompt_code=code)
    if code and job.setup == code and not solution.startswith(code):
        # HumanEval's harness runs prompt + completion: the prompt's helpers are there for the solution too
        solution = code.rstrip("\n") + "\n\n\n" + solution
    return solution


_KEYS: dict[int, tuple[sandbox.Job, str]] = {}  # id(job) -> (job, its key): a call asks a job's key up to five times


def _key(job: sandbox.Job) -> str:
    """The digest of a row's job (its tests, set-up, cases, limits), computed once per job object."""
    found = _KEYS.get(id(job))
    if found is not None and found[0] is job:
        return found[1]
    key = hashlib.sha256(json.dumps(dataclasses.asdict(job), sort_keys=True, default=str).encode()).hexdigest()
    if len(_KEYS) >= 4096:
        _KEYS.clear()
    _KEYS[id(job)] = (job, key)
    return key


@functools.cache
def judge_version() -> str:
    """A digest of what can change a baseline's verdict: the sandbox's code and the Python running it."""
    h = hashlib.sha256(sys.version.encode())
    for path in sorted(Path(sandbox.__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


class BaselineCache:
    """The no-solution baselines of rows, on disk (see the module doc), shared by the rewards of a process."""

    _lock = threading.Lock()
    _loaded: dict[Path, dict[str, float]] = {}

    def __init__(self, folder: str | os.PathLike | None, salt: str) -> None:
        base = (
            Path(folder)
            if folder
            else Path(os.environ.get("REGIMEN_CACHE", Path.home() / ".cache" / "regimen")) / "judge-baselines"
        )
        self.path = base / f"{judge_version()}.jsonl"
        self.salt = salt

    def key(self, job: sandbox.Job) -> str:
        return hashlib.sha256((self.salt + _key(job)).encode()).hexdigest()

    def known(self) -> dict[str, float]:
        with self._lock:
            if self.path not in self._loaded:
                table: dict[str, float] = {}
                try:
                    with open(self.path, encoding="utf-8") as f:
                        for line in f:
                            try:
                                entry = json.loads(line)
                                table[str(entry["key"])] = float(entry["share"])
                            except (ValueError, KeyError, TypeError):
                                continue  # a torn or foreign line
                except OSError:
                    pass
                self._loaded[self.path] = table
            return self._loaded[self.path]

    def add(self, shares: dict[str, float]) -> None:
        if not shares:
            return
        self.known().update(shares)
        data = "".join(json.dumps({"key": k, "share": v}) + "\n" for k, v in shares.items()).encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:  # a read-only home: the baselines are judged again next process
            log.warning("unit_tests: the baseline cache %s could not be written (%s)", self.path, exc)


class UnitTestsReward:
    """The `unit_tests` reward with its options (the registered one uses the defaults): a reward function
    with TRL's signature, `reward(prompts, completions, **columns)`, built by `unit_tests_reward(...)`.

    Scores each completion with the fraction of its row's tests (or stdin/stdout cases) that pass, the
    whole batch in parallel (`workers`, default one per CPU); `all_or_nothing`: 1.0 only when all pass.
    Programs: `case_timeout_s` CPU seconds per case, `float_tolerance` for numbers in the output,
    `max_cases` per row. None where the row has no tests, where its tests pass with no solution at all,
    or (logged) where the sandbox itself or the row's set-up code failed; 0 for code that fails to load,
    times out or is killed. Raises InputError when isolation is unavailable and `allow_unisolated` is
    False, and for rows whose tests evaluate strings unless `allow_eval` (those strings then run in the
    solution's process) or need pytest fixtures. `baseline_cache`: where the rows' no-solution baselines
    are kept between processes (True: `$REGIMEN_CACHE/judge-baselines`; a folder; False: this reward's
    memory only). `packages`: installed packages the solution may import (top-level names, such as
    `numpy`: an operator's allow-list, each bound read-only into the sandbox; list their dependencies
    too); a row's tests may always import pytest where it is installed.

    A solution right on some tests only earns that fraction, by design (GRPO ranks answers within a
    group); `all_or_nothing: true` gives MBPP's and HumanEval's pass@1 rule instead.

    Not gameable because the judge runs the tests in its own process and sees only data decoded into
    its own objects from the solution's (tests/test_sandbox.py and tests/test_judge_*.py attack it in
    every way we know).

    The steps, as methods: `jobs` (each row's job, checked at the door once per row content: `refuse`),
    `baseline` (what an empty program passes, once per row content: `pays_anything`, kept on disk),
    `batch` (the solutions judged in the sandbox) and `score` (one result's value); `door` runs the
    checks and the baseline on a whole dataset before a run starts.
    """

    gameable = False

    def __init__(
        self,
        *,
        timeout_s: float = sandbox.SandboxConfig.timeout_s,
        memory_mb: int = sandbox.SandboxConfig.memory_mb,
        workers: int | None = None,
        allow_unisolated: bool = False,
        all_or_nothing: bool = False,
        case_timeout_s: float = 2.0,
        float_tolerance: float | None = None,
        max_cases: int | None = None,
        allow_eval: bool = False,
        baseline_cache: str | bool = True,
        packages: list[str] | tuple[str, ...] = (),
        name: str = "unit_tests",
    ) -> None:
        if isinstance(packages, str) or not all(isinstance(p, str) and p.isidentifier() for p in packages):
            raise InputError(
                f"{name}: packages must be a list of top-level import names (such as numpy), got {packages!r}"
            )
        self.__name__ = name  # TRL logs rewards by __name__
        self.workers, self.all_or_nothing, self.allow_eval = workers, all_or_nothing, allow_eval
        self.config = sandbox.SandboxConfig(
            timeout_s=timeout_s, memory_mb=memory_mb, allow_unisolated=allow_unisolated, packages=tuple(packages)
        )
        self.options = dict(case_timeout_s=case_timeout_s, float_tolerance=float_tolerance, max_cases=max_cases)
        self.pays_anything: dict[str, float] = {}  # job key -> share of its tests an empty program passes
        self.checked: set[str] = set()  # job keys already let through the door's checks (GRPO sees each row many times)
        self.disk = (
            BaselineCache(
                baseline_cache if isinstance(baseline_cache, str) else None,
                f"{timeout_s}/{memory_mb}/{sorted(packages)}/",
            )
            if baseline_cache
            else None
        )

    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        scores: list[float | None] = [None] * len(completions)
        jobs = self.jobs(prompts, len(completions), columns)
        rows = [i for i, j in enumerate(jobs) if j is not None]
        if not rows:
            return scores
        self.baseline([jobs[i] for i in rows])  # type: ignore[misc]
        rows = [i for i in rows if self.pays_anything[_key(jobs[i])] < 1.0]  # type: ignore[arg-type]
        items = [
            dataclasses.replace(
                jobs[i], code=solution_for(completions[i], jobs[i], prompts[i] if prompts is not None else None)
            )  # type: ignore[arg-type]
            for i in rows
        ]
        for i, result in zip(rows, self.batch(items)):
            scores[i] = self.score(result, i)
        return scores

    def jobs(self, prompts: list[Any] | None, n: int, columns: dict[str, Any]) -> list[sandbox.Job | None]:
        """Each row's job (None for a row without tests), each let through the door's checks."""
        jobs = []
        for i in range(n):
            job = row_job(i, columns, prompts[i] if prompts is not None and i < len(prompts) else None, **self.options)
            if job is not None:
                self.refuse(job, f"row {i}")
            jobs.append(job)
        return jobs

    def refuse(self, job: sandbox.Job, where: str) -> None:
        """Raise InputError for a row the judge refuses (strings evaluated as code, pytest fixtures)."""
        key = _key(job)
        if key in self.checked:
            return
        if not self.allow_eval and (found := evaluates(job.tests + [job.setup or ""])):
            raise InputError(
                f"{self.__name__}: {where}: its tests evaluate strings or load pickles ({found}): the solution's text "
                f"would run as the "
                "judge; refused (the reward's `allow_eval: true` runs such strings in the solution's process instead)"
            )
        if fixture := needs_fixtures(job.tests):
            raise InputError(
                f"{self.__name__}: {where}: its test {fixture}() takes arguments (pytest fixtures other than capsys, "
                f"or parameters no parametrize mark gives), which only pytest can supply; refused"
            )
        self.checked.add(key)

    def baseline(self, jobs: list[sandbox.Job]) -> None:
        """How much of each new row's tests an empty program passes (`pays_anything`): from this reward's
        memory, else the disk cache, else judged now (and kept)."""
        new = {_key(j): j for j in jobs if _key(j) not in self.pays_anything}
        if self.disk is not None and new:
            known = self.disk.known()
            for key, job in list(new.items()):
                if (share := known.get(self.disk.key(job))) is not None:
                    self.pays_anything[key] = share
                    del new[key]
        if not new:
            return
        results = self.batch(list(new.values()))
        for key, r in zip(new, results):
            self.pays_anything[key] = r.fraction if r.status == "ok" else 0.0
        if self.disk is not None:
            self.disk.add({self.disk.key(j): r.fraction for j, r in zip(new.values(), results) if r.status == "ok"})

    def batch(self, items: list[sandbox.Job]) -> list[sandbox.SandboxResult]:
        """Judge `items` in the sandbox, in parallel; InputError when isolation is unavailable."""
        if not items:
            return []
        try:
            return sandbox.run_batch(items, workers=self.workers, config=self.config)
        except sandbox.SandboxUnavailable as exc:
            raise InputError(str(exc)) from None

    def score(self, result: sandbox.SandboxResult, row: int) -> float | None:
        """One sample's value: the fraction of its tests passed (all or nothing if asked); None, logged,
        for a failure of the sandbox or of the row's set-up code."""
        if result.status == "infra":
            log.warning("%s: sample %d not scored (None): %s", self.__name__, row, result.error)
            return None
        if self.all_or_nothing:
            return float(result.total > 0 and result.passed == result.total)
        return result.passed / result.total if result.total else None

    def door(self, rows: list[dict[str, Any]], where: list[str]) -> dict[str, list[str]]:
        """The checks at the door on every row (see `code_rows.py`): raises InputError naming the first
        refused row; returns {"pays_anything": [...], "pays_some": [...]}, rows named by `where`."""
        columns = {k: [r.get(k) for r in rows] for k in {k for r in rows for k in r}}
        jobs: list[tuple[str, sandbox.Job]] = []
        for i, row in enumerate(rows):
            try:
                job = row_job(i, columns, row.get("prompt"), **self.options)
            except InputError as exc:
                raise InputError(f"{where[i]}: {str(exc).split(': ', 2)[-1]}") from None
            if job is not None:
                self.refuse(job, where[i])
                jobs.append((where[i], job))
        self.baseline([j for _, j in jobs])
        report: dict[str, list[str]] = {"pays_anything": [], "pays_some": []}
        for label, job in jobs:
            share = self.pays_anything[_key(job)]
            if share >= 1.0:
                report["pays_anything"].append(label)
            elif share > 0:
                report["pays_some"].append(f"{label} ({share:.0%})")
        return report


def unit_tests_reward(**options: Any) -> RewardFn:
    """A `unit_tests` reward with its own options (see `UnitTestsReward` for them and what it scores)."""
    return UnitTestsReward(**options)


_default_unit_tests = unit_tests_reward()


@register("unit_tests")
def unit_tests(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
    """Fraction of the row's tests (or stdin/stdout cases) that pass when the completion's code runs in
    the sandbox (defaults of `unit_tests_reward`); None when the row has no tests. See `unit_tests_reward`."""
    return _default_unit_tests(prompts, completions, **columns)


unit_tests.door = _default_unit_tests.door  # type: ignore[attr-defined]


register_factory("unit_tests", unit_tests_reward)


@register("code_block", gameable=True)
def code_block(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
    """GAMEABLE ON PURPOSE: pays 1.0 for writing a fenced Python code block at all, whether the code
    in it works or not. It is the classic reward whose training curve climbs to its ceiling while
    held-out quality does not move; use it to see the reward-hacking guard fire, never to train."""
    return [1.0 if has_code_block(completion_text(c)) else 0.0 for c in completions]
