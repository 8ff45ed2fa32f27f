"""J, the judge: runs a row's tests against the solution, which lives in another process.

J is a fork of the sandbox's trusted set-up process, never of the solution: the solution's process (S)
cannot reach J's interpreter, namespace or memory (another uid, not dumpable, another process), and J
never touches an object S made. What J gets from S comes over a socket (`channel.py`, `wire.py`) and is
decoded by J's own code into J's own objects: plain data, the standard library's value types, or proxies
that are compared by identity only. The namespace the tests run in is J's:

- `__builtins__` is J's own builtins module: nothing S patched (`builtins.abs`, `enumerate`, the
  namespace's `__builtins__`) exists here;
- the trusted set-up code (`setup`: a HumanEval prompt's helpers, MBPP's `test_setup_code` and
  `test_imports`) runs first, before any name of the solution is bound;
- then each top-level name S reports, unless it would shadow a builtin, a name the set-up defined or a
  name the tests themselves bind at module level anywhere (`def expected`, `from math import isclose`,
  `x = ...`: a snippet that fails before the line that binds it must not leave the name to the
  solution for the snippets after it). The function under test is the exception, it is always the
  solution's: the row's declared `entry_point`, or, without one, a builtin name the tests test as a
  function of their own (`assert max([1, 2]) == 2`, with no other function of the solution's called
  anywhere in the tests: `under_test`), so a wrong `def max` fails and a solution without it fails too.
  A function becomes a proxy that calls it in S; an exception class becomes a class J makes of its own
  from the names S reports (`raised.solution_exceptions`: tests catch it, and what S raises of it
  arrives as it); data, a class or an object of the solution's becomes J's decoded copy or proxy; a module becomes J's
  own import of the standard-library module of that name, and only under that name (`import math` binds `math`; `import
  math as m` binds nothing), and only for the pure computation modules in `TEST_MODULES`. J never calls a function, nor
  imports a module, that S chose. When the row declares an entry point, that is the only function of the solution's the
  tests get (besides the standard-library modules J imports itself). If the function under test is not the solution's,
  calling it raises NameError. The same names, by the same rules, are also the module `solution` that a test file may
  import (`from solution import f`, as KodCode's do).

Each test snippet then runs in that namespace, in order (`harness.py`: also the unittest TestCases and
pytest-style functions it defines); it passes when it runs to its end without raising. A program
(stdin/stdout problems, `mode: programs`) is run by S once per case with the case's input, and J
compares its output with the expected one, which S never sees. J reports on its own pipe, which S never
holds (one line each): `loaded` | `loadfail <why>`, then `pass <i>` / `fail <i> <why>` for every snippet
or case, `gone <why>` once if S ended early, and `done <n>`; `infra <why>` when the trusted set-up code
itself fails.

Stdlib only: the server imports it by path (`python -I -S`).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import io
import keyword
import os
import sys

try:
    from . import harness, wire
    from .channel import (
        AsyncFunctionProxy,
        Channel,
        FunctionProxy,
        SolutionEnded,
        SolutionError,
        missing,
        original_streams,
        solution_exceptions,
    )
except ImportError:  # imported by the server as a top-level module
    import harness  # type: ignore[no-redef]
    import wire  # type: ignore[no-redef]
    from channel import (
        AsyncFunctionProxy,
        Channel,
        FunctionProxy,
        SolutionEnded,
        SolutionError,
        missing,
        original_streams,
        solution_exceptions,
    )  # type: ignore[no-redef]

INFO_LIMIT = 300
"""Characters of an error description sent to the server per line."""
TEST_MODULES = frozenset(
    {
        "array",
        "base64",
        "binascii",
        "bisect",
        "calendar",
        "cmath",
        "collections",
        "copy",
        "datetime",
        "decimal",
        "difflib",
        "enum",
        "fractions",
        "functools",
        "hashlib",
        "heapq",
        "itertools",
        "json",
        "keyword",
        "math",
        "numbers",
        "operator",
        "os",
        "random",
        "re",
        "statistics",
        "string",
        "struct",
        "sys",
        "textwrap",
        "time",
        "typing",
        "unicodedata",
        "zlib",
    }
)
"""Standard-library modules (and their submodules) a test may use because the solution imported them."""
_Channel = Channel  # the name the tests know it by
__all__ = ["Channel", "SolutionEnded", "SolutionError", "bind_solution", "run", "test_names", "under_test"]


def _test_module(name: str, module: object):
    """J's own import of `module`, when S reports that its top-level name `name` is that module and the
    module is one the tests may use (see TEST_MODULES); else None."""
    if type(module) is not str or module.rpartition(".")[2] != name:
        return None
    parts = module.split(".")
    if parts[0] not in TEST_MODULES or not all(p.isidentifier() and not p.startswith("_") for p in parts):
        return None
    try:
        return importlib.import_module(module)
    except Exception:
        return None


def test_names(tests: list[str]) -> set[str]:
    """The names the test snippets bind at module level, wherever in them (assignments, `def`, `class`,
    imports, loop, `with` and `except` targets, `global` declarations in their functions)."""
    names: set[str] = set()

    def visit(node: ast.AST, scope: str) -> None:  # scope: "module", "function" or "comprehension"
        if isinstance(node, ast.Global):
            names.update(node.names)
        elif scope == "module":
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update(a.asname or a.name.partition(".")[0] for a in node.names)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                names.add(node.name)
            elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
                names.add(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                names.add(node.rest)
        if scope != "function" and isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            names.add(node.target.id)  # binds in the enclosing scope, also from a comprehension
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if scope == "module":
                names.add(node.name)
            inner = "function"
        elif isinstance(node, ast.Lambda):
            inner = "function"
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)) and scope == "module":
            inner = "comprehension"
        else:
            inner = scope
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    for tree in _trees(tests):
        if tree is not None:
            visit(tree, "module")
    return names


_PARSED: dict[str, ast.Module | None] = {}


def _trees(tests: list) -> list[ast.Module | None]:
    """Each snippet's tree, parsed once per process (None for one that does not parse: it fails when run)."""
    out = []
    for snippet in tests:
        if not isinstance(snippet, str):
            out.append(None)
            continue
        if snippet not in _PARSED:
            try:
                _PARSED[snippet] = ast.parse(snippet)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                _PARSED[snippet] = None
        out.append(_PARSED[snippet])
    return out


def under_test(tests: list[str], own: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """Builtin names the tests test as a function of the solution's (rows without an entry point): the
    outermost call of an assert's subject, applied to the test's own data (no call, no name of the
    solution's in its arguments), when the tests call no other name that is not a builtin or their own
    (`assert max([1, 2]) == 2`; not `assert abs(f(1) - 2) < 1e-9`, not `assert set(ENV) <= {...}`)."""
    builtin_names = set(dir(builtins))
    called: set[str] = set()
    subjects: set[str] = set()
    for tree in _trees(tests):
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in own:
                called.add(node.func.id)
            if not isinstance(node, ast.Assert):
                continue
            tested = [node.test]
            while any(isinstance(t, ast.BoolOp) for t in tested):  # `assert A and B`: each side is a claim of its own
                tested = [v for t in tested for v in (t.values if isinstance(t, ast.BoolOp) else [t])]
            for test in tested:
                subject = test.left if isinstance(test, ast.Compare) else test
                while isinstance(subject, ast.UnaryOp):
                    subject = subject.operand
                if (
                    isinstance(subject, ast.Call)
                    and isinstance(subject.func, ast.Name)
                    and subject.func.id in builtin_names
                ):
                    inside = [n for arg in [*subject.args, *subject.keywords] for n in ast.walk(arg)]
                    foreign = [
                        n
                        for n in inside
                        if isinstance(n, ast.Call)
                        or isinstance(n, ast.Name)
                        and n.id not in own
                        and n.id not in builtin_names
                    ]
                    if not foreign:  # applied to the test's own data, not to something of the solution's
                        subjects.add(subject.func.id)
    if called - builtin_names:
        return set()
    return subjects - set(own)


def bind_solution(
    ns: dict,
    reported: object,
    channel: Channel,
    entry_point: str | None,
    own: set[str] | frozenset[str] = frozenset(),
    tested: set[str] | frozenset[str] = frozenset(),
) -> None:
    """Bind the names S reported into `ns` (see the module docstring for the rules); `own`: the names
    the tests bind themselves (`test_names`); `tested`: builtin names under test (`under_test`)."""
    trusted = set(dir(builtins)) | set(ns) | set(own)
    required = {entry_point} if entry_point else set(tested)
    bound: set[str] = set()
    if type(reported) is not list:
        reported = []
    for item in reported:
        if type(item) is not tuple or len(item) != 3 or type(item[0]) is not str:
            continue
        name, kind, value = item
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("__"):
            continue
        if name in trusted and name not in required:
            continue
        if name in required:  # the function under test is always the solution's own, called over the channel
            if kind in ("call", "data"):
                solution_value = _solution_value(name, kind, value, channel)
                if callable(solution_value):
                    ns[name] = solution_value
                    bound.add(name)
            continue
        if kind == "module":
            module = _test_module(name, value)
            if module is not None:
                ns[name] = module
        elif entry_point:  # with a declared entry point, nothing else of the solution's
            continue
        elif kind == "exception" and name in channel.exceptions:
            ns[name] = channel.exceptions[name]
        elif kind in ("call", "data"):
            solution_value = _solution_value(name, kind, value, channel)
            if solution_value is not _NOTHING:
                ns[name] = solution_value
    for name in required - bound:
        ns[name] = missing(name)


def solution_module(reported: object, channel: Channel, entry_point: str | None) -> object:
    """The solution as the module a test file imports (`from solution import f`, `import solution`:
    KodCode's tests): its functions as proxies, its data decoded, its modules as J's own imports, as
    `bind_solution` gives them (with an entry point, that function alone). Nothing of the tests' is
    shadowed by it: a test gets from it only the names it asks for."""
    module = type(sys)("solution")
    for item in reported if type(reported) is list else []:
        if type(item) is not tuple or len(item) != 3 or type(item[0]) is not str:
            continue
        name, kind, value = item
        if (
            not name.isidentifier()
            or keyword.iskeyword(name)
            or name.startswith("__")
            or (entry_point and name != entry_point)
        ):
            continue
        if kind == "module" and (imported := _test_module(name, value)) is not None:
            setattr(module, name, imported)
        elif kind == "exception" and name in channel.exceptions:
            setattr(module, name, channel.exceptions[name])
        elif kind in ("call", "data") and (bound := _solution_value(name, kind, value, channel)) is not _NOTHING:
            setattr(module, name, bound)
    return module


_NOTHING = object()


def _solution_value(name: str, kind: str, value: object, channel: Channel):
    if kind == "call":
        return AsyncFunctionProxy(channel, name) if value == "async" else FunctionProxy(channel, name)
    if type(value) is bytes:
        try:
            return wire.decode(value, channel.proxy)
        except wire.WireError:
            pass
    return _NOTHING


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:
        text = ""
    return f"{name}: {text}" if text else name


def run(job: dict, sock: int, results: int) -> None:
    """Judge one solution: `job` has `tests` (or `cases` for programs), `setup`, `entry_point`, `mode`;
    S is on `sock`; lines go to `results`. Never returns."""

    def emit(line: str) -> None:
        data = (" ".join(line.split())[:INFO_LIMIT] + "\n").encode("utf-8", "replace")
        while data:
            data = data[os.write(results, data) :]

    out = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    sys.stdout = sys.__stdout__ = sys.stderr = sys.__stderr__ = out
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    original_streams(sys.stdout, sys.stdin)
    programs = job.get("mode") == "programs"
    tests: list = job["cases"] if programs else job["tests"]
    entry_point = job.get("entry_point") or None
    ns: dict = {"__name__": "__test__", "__builtins__": builtins}
    if job.get("setup") and not programs:
        try:
            exec(compile(job["setup"], "<setup>", "exec"), ns)
        except BaseException as exc:
            emit(f"infra the row's set-up code failed: {_describe(exc)}")
            os._exit(0)
    channel = Channel(sock)
    try:
        hello = channel.recv()
    except SolutionEnded as exc:
        hello = ("loadfail", ["SolutionEnded"], f"{exc} before it finished loading")
    if type(hello) is tuple and len(hello) == 2 and hello[0] == "ready":
        if not programs:
            channel.exceptions = solution_exceptions(
                {
                    item[0]: item[2]
                    for item in hello[1]
                    if type(item) is tuple and len(item) == 3 and type(item[0]) is str and item[1] == "exception"
                }
                if type(hello[1]) is list
                else {}
            )
            own = test_names(tests)
            bind_solution(
                ns,
                hello[1],
                channel,
                entry_point,
                own,
                under_test(tests, own | set(ns)) if not entry_point else frozenset(),
            )
            sys.modules["solution"] = solution_module(hello[1], channel, entry_point)
        emit("loaded")
    else:
        emit(f"loadfail {_load_failure(hello)}")
        emit(f"done {len(tests)}")
        os._exit(0)
    harness.route_evaluation(channel, ns)
    for i, test in enumerate(tests):
        try:
            if programs:
                _run_case(channel, test, job)
            else:
                harness.run_snippet(test, i, ns, _trees([test])[0])
        except BaseException as exc:  # the test's own SystemExit too: this snippet fails, the rest run
            emit(f"fail {i} {_describe(exc)}")
        else:
            emit(f"pass {i}")
    if channel.gone is not None:
        emit(f"gone {channel.gone}")
    emit(f"done {len(tests)}")
    os._exit(0)


def _load_failure(hello: object) -> str:
    """Why the solution did not load, from S's greeting ("loadfail", [exception names], text)."""
    if (
        type(hello) is tuple
        and len(hello) == 3
        and hello[0] == "loadfail"
        and type(hello[1]) is list
        and type(hello[2]) is str
    ):
        first = hello[1][0] if hello[1] and type(hello[1][0]) is str else "Exception"
        return f"{first}: {hello[2]}" if hello[2] else first
    return "the solution's process sent a malformed greeting"


def _run_case(channel: Channel, case: object, job: dict) -> None:
    """One stdin/stdout case: S runs the program with the input; J compares the output (raises on a miss)."""
    stdin, expected = case  # type: ignore[misc]
    out, status, truncated = channel.run(
        stdin, tuple(job.get("case_limits") or (2.0, 6.0)), int(job.get("output_limit") or 1 << 20)
    )
    if status != 0:
        raise AssertionError(
            f"the program exited with status {status}" + (" (killed: a time or memory limit)" if status > 128 else "")
        )
    if truncated:
        raise AssertionError("the program printed more than the output limit")
    if not harness.same_output(out, expected, job.get("float_tolerance"), job.get("float_rule")):
        shown = out.decode("utf-8", "replace")[:80]
        raise AssertionError(f"wrong output: {shown!r}")
