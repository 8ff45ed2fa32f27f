"""What the parent asks the sandbox and what it gets back: the limits of a sample (`SandboxConfig`), a job
(`Job`: the code, its tests, the entry point, trusted set-up code), its result (`SandboxResult`), and the
checks on what callers hand in (`as_job`). Stdlib only."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

JUDGE_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py")
"""What a row's tests may import besides the standard library, in the judge: pytest (`pytest.raises`,
`pytest.approx`) and what it imports, where installed; bound read-only into every sample's root."""


class SandboxUnavailable(RuntimeError):
    """Isolation is unavailable on this host and the caller did not allow unisolated execution."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one sample (the solution and all its tests together). Defaults suit MBPP/HumanEval."""

    timeout_s: float = 5.0
    """CPU seconds the sample may use (solution, judge and every process they start, counted by the
    slot's CPU cgroup; without one, RLIMIT_CPU per process, this rounded up plus two seconds)."""
    wall_timeout_s: float | None = None
    """Wall-clock backstop for samples that sleep or wait; default 3 × timeout_s + 2 s."""
    memory_mb: int = 512
    """Address-space limit of each of the solution's processes; the slot's memory cgroup allows this plus
    256 MiB for the judge, and within it the OOM killer takes the solution's processes first."""
    nproc: int = 32
    """Processes (threads count) the solution's uid may have."""
    cpus_per_slot: float = 1.0
    """CPU share of one worker slot (cgroup CPU quota), so a sample cannot starve its neighbours."""
    file_size_mb: int = 16
    """Largest file the solution may write (RLIMIT_FSIZE)."""
    open_files: int = 64
    """RLIMIT_NOFILE."""
    tmpfs_mb: int = 64
    """Size of the sample's fresh /tmp (the working folders live there); /dev/shm gets a quarter."""
    output_limit: int = 16384
    """Bytes of stdout+stderr kept per sample; more is discarded (the solution can go on printing)."""
    allow_unisolated: bool = False
    """Run without namespaces, mounts or the syscall filter where they are unavailable, instead of
    raising SandboxUnavailable. The solution and the judge stay separate processes."""
    isolation: bool = True
    """False skips the namespaces even where they work (tests); it still needs `allow_unisolated=True`."""
    use_cgroups: bool = True
    """Use cgroups (CPU share and accounting, memory, pids) for each worker slot where the host has them."""
    uid_base: int | None = None
    """First unprivileged uid; slot k uses uid_base + 2k (solution) and uid_base + 2k + 1 (judge).
    Default: derived from the parent's pid so that two processes scoring at once do not share uids."""
    packages: tuple[str, ...] = ()
    """Installed packages (top-level import names, such as "numpy") the solution may import: an operator's
    allow-list. Each is found where this interpreter would import it from and bound read-only into the
    sample's root (`slot.PACKAGES_DIR`), with its `<name>.libs` folder of shared libraries if it has one;
    nothing else of its site-packages. List a package's own dependencies too. Isolated samples only."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "nproc", "file_size_mb", "open_files", "tmpfs_mb", "output_limit"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxConfig.{name} must be positive, got {getattr(self, name)!r}")
        if self.open_files < 8:
            raise ValueError("SandboxConfig.open_files must be at least 8")
        if self.wall_timeout_s is not None and not self.wall_timeout_s > 0:
            raise ValueError(f"SandboxConfig.wall_timeout_s must be positive, got {self.wall_timeout_s!r}")
        if not isinstance(self.packages, tuple) or not all(
            isinstance(n, str) and n.isidentifier() for n in self.packages
        ):
            raise ValueError(f"SandboxConfig.packages must be a tuple of top-level import names, got {self.packages!r}")
        if not self.cpus_per_slot >= 0:
            raise ValueError(f"SandboxConfig.cpus_per_slot must be >= 0 (0: no quota), got {self.cpus_per_slot!r}")

    @property
    def package_paths(self) -> list[str]:
        """Where the allowed packages (and the judge's, `JUDGE_PACKAGES`) are installed: a folder or a
        single-file module each, plus `<name>.libs` folders; names not installed are left out."""
        paths = []
        for name in (*JUDGE_PACKAGES, *self.packages):
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError):
                continue
            if spec is None or spec.origin in (None, "built-in", "frozen"):
                continue
            path = os.path.realpath(
                list(spec.submodule_search_locations)[0] if spec.submodule_search_locations else spec.origin
            )
            if path not in paths:
                paths.append(path)
            libs = os.path.join(os.path.dirname(path), f"{name}.libs")
            if os.path.isdir(libs) and libs not in paths:
                paths.append(os.path.realpath(libs))
        return paths

    @property
    def wall_s(self) -> float:
        return self.wall_timeout_s if self.wall_timeout_s is not None else 3 * self.timeout_s + 2


@dataclass(frozen=True)
class Job:
    """One sample to judge."""

    code: str
    """The solution: Python source, run in its own process."""
    tests: list[str]
    """Test snippets, run in order by the judge; a snippet passes when it runs to its end without raising."""
    entry_point: str | None = None
    """The function under test: the one solution name that may shadow a builtin or a set-up name."""
    setup: str | None = None
    """Trusted code the judge runs before the tests (a HumanEval prompt's helpers, MBPP's
    test_setup_code/test_imports); its names are never shadowed by the solution's."""
    mode: str = "functions"
    """"functions": the tests call the solution's functions; "programs": the solution is a program run
    once per case of `cases` with the case's input as stdin, its stdout compared with the case's output."""
    cases: list[tuple[str, str]] | None = None
    """Programs: (stdin, expected stdout) per case, in order; the judge holds the expected outputs only."""
    case_timeout_s: float = 2.0
    """Programs: CPU seconds one case may use (its wall-clock limit is three times this plus one second)."""
    float_tolerance: float | None = None
    """Programs: numbers in the output may differ from the expected ones by this much (absolute or relative)."""
    float_rule: str | None = None
    """Programs: "apps" compares numbers as APPS's grader does (`harness.same_output`); None: as written."""

    @property
    def count(self) -> int:
        """How many results the judge reports: test snippets, or cases."""
        return len(self.cases or []) if self.mode == "programs" else len(self.tests)


@dataclass
class SandboxResult:
    passed: int
    """Test snippets that ran to their end without raising (0 whenever the run ended abnormally)."""
    total: int
    error: str | None = None
    """None when every snippet ran; else why not (load failure, timeout, early exit, infra)."""
    status: str = "ok"
    """ok: the judge finished (tests may still have failed); aborted: the sample timed out or the
    judge was killed (scores 0); infra: the sandbox itself or the row's set-up code failed (not the
    solution's fault; no score)."""
    tests: list[bool] = field(default_factory=list)
    """Per snippet: ran to its end without raising."""
    test_errors: list[str | None] = field(default_factory=list)
    """Per snippet: the exception it raised (`AssertionError`, `NameError: ...`), None when it passed
    or did not run."""
    output: str = ""
    """Captured stdout+stderr of the solution and the judge, at most `output_limit` bytes."""
    duration_s: float = 0.0
    isolated: bool = True
    cpu_s: float | None = None
    """CPU seconds the sample used, where the slot has a CPU cgroup."""
    slot: int | None = None
    """The worker slot that ran it."""

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def _default_uid_base() -> int:
    return 1_000_000 + (os.getpid() % 100_000) * 256


def _unavailable_message(reason: str) -> str:
    return (
        f"sandbox: cannot isolate untrusted code on this host ({reason}). Refusing to run model-written "
        "code without namespaces, a minimal filesystem and a syscall filter. To run it anyway, at your own "
        "risk, allow unisolated execution explicitly (allow_unisolated=True; in a recipe, the unit_tests "
        "reward's `allow_unisolated: true` option)."
    )


def as_job(item: Any, index: int = 0) -> Job:
    """A Job from a Job, a `(code, tests)` pair, or a dict of Job's fields (`code` and `tests` or
    `cases` at least). Raises TypeError naming the item."""
    fields = set(Job.__dataclass_fields__)
    if isinstance(item, Job):
        job = item
    elif isinstance(item, dict):
        unknown = set(item) - fields
        if unknown or "code" not in item or not ({"tests", "cases"} & set(item)):
            raise TypeError(
                f"run_batch: item {index}: a dict needs `code` and `tests` (or `cases`) and only Job's fields, got "
                f"{sorted(item)}"
            )
        job = Job(**{"tests": [], **item})
    elif isinstance(item, (tuple, list)) and len(item) == 2:
        job = Job(item[0], item[1])
    else:
        raise TypeError(f"run_batch: item {index} must be a (code, tests) pair, a dict or a Job")
    if not isinstance(job.code, str):
        raise TypeError(f"run_batch: item {index}: code must be a str, got {type(job.code).__name__}")
    if not isinstance(job.tests, (list, tuple)) or not all(isinstance(t, str) for t in job.tests):
        raise TypeError(f"run_batch: item {index}: tests must be a list of str")
    if job.entry_point is not None and not (isinstance(job.entry_point, str) and job.entry_point.isidentifier()):
        raise TypeError(f"run_batch: item {index}: entry_point must be a Python identifier, got {job.entry_point!r}")
    if job.setup is not None and not isinstance(job.setup, str):
        raise TypeError(f"run_batch: item {index}: setup must be a str")
    if job.mode not in ("functions", "programs"):
        raise TypeError(f"run_batch: item {index}: mode must be 'functions' or 'programs', got {job.mode!r}")
    cases = None
    if job.mode == "programs":
        if not isinstance(job.cases, (list, tuple)) or not all(
            isinstance(c, (list, tuple)) and len(c) == 2 and all(isinstance(x, str) for x in c) for c in job.cases
        ):
            raise TypeError(
                f"run_batch: item {index}: a program's cases must be a list of (stdin, expected stdout) strings"
            )
        cases = [(c[0], c[1]) for c in job.cases]
    if not (isinstance(job.case_timeout_s, (int, float)) and job.case_timeout_s > 0):
        raise TypeError(f"run_batch: item {index}: case_timeout_s must be positive")
    if job.float_tolerance is not None and not (
        isinstance(job.float_tolerance, (int, float)) and job.float_tolerance >= 0
    ):
        raise TypeError(f"run_batch: item {index}: float_tolerance must be a non-negative number or None")
    if job.float_rule not in (None, "apps"):
        raise TypeError(f"run_batch: item {index}: float_rule must be 'apps' or None, got {job.float_rule!r}")
    return Job(
        job.code,
        list(job.tests),
        job.entry_point or None,
        job.setup or None,
        job.mode,
        cases,
        float(job.case_timeout_s),
        None if job.float_tolerance is None else float(job.float_tolerance),
        job.float_rule,
    )


def _infra(total: int, reason: str) -> SandboxResult:
    return SandboxResult(
        passed=0, total=total, error=reason, status="infra", tests=[False] * total, test_errors=[None] * total
    )
