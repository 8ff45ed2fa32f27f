"""Judge untrusted Python solutions against test code, isolated from the host and from the judge.

Model-written code is hostile until proven otherwise. `run_batch` judges many samples in parallel,
`run_tests` one; each returns a `SandboxResult(passed, total, error, status, ...)`.

The principle: the code under test never shares an interpreter, a namespace or memory with the code
that judges it, and sees nothing of the host it does not need. Per sample, two processes:

- S (`callee.py`) runs the solution and answers calls;
- J (`judge.py`) runs the row's tests in its own interpreter and namespace, calling the solution's
  functions through a socket that carries only plain data (`wire.py`: None, bool, int, float,
  complex, str, bytes, and lists/tuples/dicts/sets of them, by exact type). J decodes every answer
  into fresh builtin objects, so no object of the solution's making ever reaches a comparison, and
  nothing the solution patches (builtins, `math.isclose`, its own `abs`) changes what the tests call.
  Only J and the trusted set-up code write results; S never holds the result pipe.

The solution may import the standard library and the installed packages an operator allows
(`SandboxConfig.packages`, such as numpy, bound read-only); the tests also pytest, where installed.

Both run in the per-sample namespaces built by `tree.py` (the process tree of a sample), `slot.py` (a
minimal allow-listed root, fresh /tmp, /dev/shm, /proc, IPC and network), as different unprivileged
uids, under rlimits, cgroups (a CPU share per slot, CPU-time accounting, memory and pids limits) and a
seccomp filter (`syscalls.py`); `server.py` runs one slot's job loop and `sample.py` watches one sample.
The parent side: `jobs.py` (what is asked, what comes back), `worker.py` (one server process's handle)
and `pool.py` (worker slots, one warm server process each, kept between calls with the same limits;
`shutdown()` closes them, so does exit).

What a test can do with the solution: call its top-level functions with plain-data arguments (copies;
but after a call, the final state of the test's list, dict, set or bytearray arguments is written back
into the test's own objects: LeetCode's "modify in place", also by a call that returns a value) and get plain-data
results (an instance of a subclass of a plain type, such as a Counter, a namedtuple or an IntEnum
member, arrives as its base type's value; a numpy scalar as its Python value) or its exceptions (as
J's own class for an exception class the solution defines at top level, which the tests can catch by
that name and as its builtin bases; else as the builtin class of the same name, else `SolutionError`);
await its `async def` functions; read its top-level plain-data values; import it as the module
`solution` (`from solution import f`); use the standard-library modules it imported, under their own
names (J imports its own, from a list of pure computation modules; functions it imported are called in
its process, like its own); call its classes and the methods of its objects through proxies (two
objects of its dataclasses compare by their fields' decoded values). A test may pass the standard
library's functions (`len`, `str.upper`, `math.floor`, `int` as a key: they cross by name and S calls
its own) and callables of its own (a lambda, a key function, a bound method): those stay in J, and
when the solution calls one, J calls it with the arguments decoded as ever (an object of the
solution's as a proxy) and sends back what it returns; an object of the test's that is not callable
cannot be passed: that call fails. J never calls a function or imports a module that
the solution's process named: what it reports about its names is a claim, and a claim could name an
object whose equality lies (`unittest.mock._ANY`).

Failure semantics: a solution that fails to load (an exception or SystemExit at import time) scores
0 with `error` saying why; a test snippet that raises fails that test only; a solution whose process
ends (exit, crash, kill) fails the calls from then on, tests already passed stay passed; a sample that
uses more than `timeout_s` CPU seconds, or more than `wall_timeout_s` wall-clock seconds, scores 0
(`status="aborted"`). A failure of the sandbox itself, or of the row's trusted set-up code, gives
`status="infra"` and a logged reason (no score), never an exception for the whole batch.

Availability. Isolation needs Linux, root (namespaces, mounts, the uid drop) and libseccomp (via
`pyseccomp`). Where a probe finds it unavailable, `run_batch` raises `SandboxUnavailable` naming the
reason, unless the caller passes `allow_unisolated=True`; then S and J are still separate processes
talking plain data, with rlimits, a temporary folder each (removed afterwards), the uid drop and
cgroups where root and the syscall filter where libseccomp exists, but with the host's filesystem and
network reachable: the solution can read what the host's files hold (answer keys included), and what
one sample writes to a shared folder (/tmp, /dev/shm) a later one can read. Without root there is no
uid drop either: the solution runs as the caller's user and can signal the caller's processes. That
is logged.
"""

from .jobs import Job, SandboxConfig, SandboxResult, SandboxUnavailable, _default_uid_base, _unavailable_message, as_job  # noqa: F401  (used by tests)
from .pool import isolation_status, run_batch, run_tests, shutdown
from .worker import _Server  # noqa: F401  (used by tests)

__all__ = [
    "Job",
    "SandboxConfig",
    "SandboxResult",
    "SandboxUnavailable",
    "as_job",
    "isolation_status",
    "run_batch",
    "run_tests",
    "shutdown",
]
