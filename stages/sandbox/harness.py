"""What the judge does with a row's tests, as a plain harness would, in J's own process.

A test snippet passes when it runs to its end without raising and, where it defines tests the way test
frameworks collect them, those tests pass too:

- `unittest.TestCase` classes the snippet defines run as `unittest.main()` would run them (whether or not
  the snippet calls `unittest.main()`, which J answers by running them itself, never by exiting);
- pytest-style test functions (`def test_*()`) the snippet defines and never calls are called, in order,
  and so are the `test*` methods of `Test*` classes that are not TestCases (a fresh instance each); as
  pytest calls them: once per case of their `@pytest.mark.parametrize` marks (all must pass), skipped
  under `@pytest.mark.skip`, and given pytest's `capsys` (what the test's calls printed, the
  solution's prints included) when they ask for it. Other fixtures only pytest can supply, so such
  tests are refused at the door (`needs_fixtures`).

Strings a test hands to `eval` or `exec` never run in J: J's `eval` gives literals (`ast.literal_eval`)
itself and sends anything else to the solution's process, where it runs in the solution's namespace and
only its value comes back, decoded like any answer; `compile` is refused. So no text of the solution's
can run as the judge and write a result (rows whose tests evaluate values are refused at the door unless
the recipe opts in, `allow_eval`); `compile` only parses (`ast.parse` keeps working).

Programs (stdin/stdout problems) are compared as their datasets' graders compare (`same_output`).

Stdlib only: the server imports it by path (`python -I -S`).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import math

_REAL_EXEC, _REAL_COMPILE = exec, compile


def route_evaluation(channel, ns: dict) -> None:
    """Give the tests' namespace J's `eval`/`exec`/`compile` (see the module doc): its own builtins, with
    those three replaced (J's own code and the standard library keep the real ones)."""

    def eval_(source, globals=None, locals=None):  # noqa: A002 - the builtin's own signature
        if isinstance(source, str):
            try:
                return ast.literal_eval(source.strip())
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                pass
            return channel.request(("eval", source, "eval"), "eval of a string")
        raise TypeError("eval: only strings are evaluated here, in the solution's process")

    def exec_(source, globals=None, locals=None, **kwargs):  # noqa: A002
        if isinstance(source, str):
            channel.request(("eval", source, "exec"), "exec of a string")
            return None
        raise TypeError("exec: only strings are run here, in the solution's process")

    def compile_(source, filename, mode, flags=0, *args, **kwargs):
        if flags & ast.PyCF_ONLY_AST:  # parsing to a tree runs nothing (ast.parse, ast.literal_eval use it)
            return _REAL_COMPILE(source, filename, mode, flags, *args, **kwargs)
        raise TypeError("compile is not available to tests in this judge (their strings run in the solution's process)")

    ns["__builtins__"] = {**vars(builtins), "eval": eval_, "exec": exec_, "compile": compile_}


def run_snippet(snippet: str, index: int, ns: dict, tree: ast.Module | None = None) -> None:
    """Run one test snippet in `ns`, then the tests it defines; raises what made it fail (`tree`: the
    snippet already parsed)."""
    tree = tree if tree is not None else ast.parse(snippet, f"<test {index}>")
    uses_unittest = "unittest" in snippet or "TestCase" in snippet
    unittest_main = _patch_unittest_main(ns) if uses_unittest else (lambda: False)
    try:
        _REAL_EXEC(_REAL_COMPILE(tree, f"<test {index}>", "exec"), ns)
    finally:
        ran_main = unittest_main()
    if uses_unittest and not ran_main:
        _run_test_cases([ns.get(n.name) for n in tree.body if isinstance(n, ast.ClassDef)], ns)
    for fn in _uncalled_test_functions(tree, ns):
        call_test(fn)


def _patch_unittest_main(ns: dict):
    """Make `unittest.main()` in this snippet run the snippet's TestCases and raise on failure (never exit).
    Returns a function telling whether it ran."""
    import unittest

    ran = [False]
    real = unittest.main

    def main(*args, **kwargs):
        ran[0] = True
        _run_test_cases([v for v in list(ns.values()) if isinstance(v, type)], ns)
        return None

    unittest.main = main

    def done() -> bool:
        unittest.main = real
        return ran[0]

    return done


def _run_test_cases(candidates: list, ns: dict) -> None:
    import unittest

    cases = [
        c for c in candidates if isinstance(c, type) and issubclass(c, unittest.TestCase) and c is not unittest.TestCase
    ]
    if not cases:
        return
    loader = unittest.TestLoader()
    suite = unittest.TestSuite(loader.loadTestsFromTestCase(c) for c in cases)
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
    if result.testsRun == 0:
        raise AssertionError("the snippet's TestCase classes hold no tests")
    problems = result.failures + result.errors + [(t, "unexpected success") for t in result.unexpectedSuccesses]
    if problems:
        test, detail = problems[0]
        last = [line for line in str(detail).strip().splitlines() if line.strip()][-1:] or ["failed"]
        raise AssertionError(
            f"{len(problems)} of {result.testsRun} unittest test(s) failed; first: {test.id()}: {last[0][:200]}"
        )


def _uncalled_test_functions(tree: ast.Module, ns: dict) -> list:
    """pytest-style tests the snippet defines and does not call itself (at module level)."""
    called = {
        n.func.id
        for stmt in tree.body
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        for n in ast.walk(stmt)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    out = []
    for node in tree.body:
        if (
            isinstance(node, ast.FunctionDef)
            and node.name.startswith("test")
            and node.name not in called
            and callable(ns.get(node.name))
        ):
            out.append(ns[node.name])
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test") and node.name not in called:
            cls = ns.get(node.name)
            import unittest

            if isinstance(cls, type) and not issubclass(cls, unittest.TestCase):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                        out.append(_Method(cls, item.name))
    return out


class _Method:
    """A test method of a `Test*` class, bound to a fresh instance when it is called."""

    def __init__(self, cls: type, name: str):
        self.cls, self.name = cls, name

    def bound(self):
        return getattr(self.cls(), self.name)


SUPPLIED_FIXTURES = frozenset({"capsys"})
"""pytest's built-in fixtures the judge supplies itself (see the module doc)."""


class _CapSys:
    """pytest's `capsys`: `readouterr()` gives what was printed since the last call, as (out, err)."""

    def __init__(self, stack: contextlib.ExitStack):
        self.out, self.err = io.StringIO(), io.StringIO()
        stack.enter_context(contextlib.redirect_stdout(self.out))
        stack.enter_context(contextlib.redirect_stderr(self.err))

    def readouterr(self):
        import collections

        out, err = self.out.getvalue(), self.err.getvalue()
        for stream in (self.out, self.err):
            stream.seek(0)
            stream.truncate()
        return collections.namedtuple("CaptureResult", "out err")(out, err)


def _marks(fn) -> list:
    marks = getattr(fn, "pytestmark", None)
    return list(marks) if isinstance(marks, (list, tuple)) else []


def _cases(fn) -> list[dict]:
    """The keyword arguments of each case of `fn`'s parametrize marks (one empty case without any)."""
    cases: list[dict] = [{}]
    for mark in _marks(fn):
        if getattr(mark, "name", None) != "parametrize":
            continue
        args, kwargs = tuple(getattr(mark, "args", ())), dict(getattr(mark, "kwargs", {}))
        names = args[0] if args else kwargs.get("argnames")
        values = args[1] if len(args) > 1 else kwargs.get("argvalues", [])
        names = [n.strip() for n in names.split(",") if n.strip()] if isinstance(names, str) else list(names)
        rows = []
        for value in values:
            if type(value).__name__ == "ParameterSet":  # pytest.param(...)
                value = tuple(value.values)
            elif len(names) == 1:
                value = (value,)
            rows.append(dict(zip(names, value)))
        cases = [{**case, **row} for case in cases for row in rows]
    return cases


def call_test(test) -> None:
    """Call a pytest-style test as pytest would (see the module doc); raises what made a case fail."""
    import inspect

    fn = test.bound() if isinstance(test, _Method) else test
    if any(getattr(m, "name", None) == "skip" for m in _marks(fn)):
        return
    try:
        wanted = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        wanted = []
    for case in _cases(fn):
        with contextlib.ExitStack() as stack:
            kwargs = {k: v for k, v in case.items() if k in wanted}
            if "capsys" in wanted and "capsys" not in kwargs:
                kwargs["capsys"] = _CapSys(stack)
            (test.bound() if isinstance(test, _Method) else fn)(**kwargs)


def needs_fixtures(snippets: list[str]) -> str | None:
    """The first pytest-style test function that takes arguments the judge cannot give it (fixtures other
    than `SUPPLIED_FIXTURES`, not named by its parametrize marks): such a test cannot run outside pytest,
    so its row is refused at the door. None when there is none."""
    for snippet in snippets:
        try:
            tree = ast.parse(snippet)
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                a = node.args
                positional = [x.arg for x in a.posonlyargs + a.args]
                required = positional[: len(positional) - len(a.defaults)] + [
                    x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None
                ]
                if set(required) - _parametrized(node) - SUPPLIED_FIXTURES:
                    return node.name
    return None


def _parametrized(node: ast.FunctionDef) -> set[str]:
    """The argument names a test function's `parametrize` decorators give it."""
    names: set[str] = set()
    for d in node.decorator_list:
        if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "parametrize" and d.args:
            first = d.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names |= {n.strip() for n in first.value.split(",") if n.strip()}
            elif isinstance(first, (ast.List, ast.Tuple)):
                names |= {e.value for e in first.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return names


def same_output(got: bytes, expected: str, float_tolerance: float | None = None, float_rule: str | None = None) -> bool:
    """As the stdin/stdout graders of APPS, TACO, CodeContests and LiveCodeBench compare: trailing
    whitespace on each line and trailing blank lines ignored; with `float_tolerance`, tokens that are
    numbers may differ by that much (absolute or relative); with `float_rule="apps"`, numbers as APPS's
    grader (`testing_util.py`, which TACO's reuses) compares them: the non-blank lines, each one number,
    equal as `numpy.allclose` (|got - expected| <= 1e-8 + 1e-5 * |expected|), or every token equal once
    rounded to 3 decimals (in order here: the grader's order-insensitive set comparisons, which accept
    lines in any order, are not reproduced)."""
    text = got.decode("utf-8", "replace")
    a, b = _lines(text), _lines(expected)
    if a == b:
        return True
    if float_rule == "apps" and _apps_close(text, expected):
        return True
    if float_tolerance is None:
        return False
    ta, tb = text.split(), expected.split()
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if not (math.isfinite(fx) and math.isfinite(fy)) or not math.isclose(
            fx, fy, rel_tol=float_tolerance, abs_tol=float_tolerance
        ):
            return False
    return True


def _floats(tokens: list[str]) -> list[float] | None:
    try:
        values = [float(t) for t in tokens]
    except ValueError:
        return None
    return values if all(math.isfinite(v) for v in values) else None


def _apps_close(text: str, expected: str) -> bool:
    """APPS's float rule (see `same_output`)."""
    got = [line.strip() for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    want = [line.strip() for line in expected.replace("\r\n", "\n").split("\n") if line.strip()]
    if len(got) != len(want) or not got:
        return False
    a, b = _floats(got), _floats(want)
    if a is not None and b is not None and all(abs(x - y) <= 1e-8 + 1e-5 * abs(y) for x, y in zip(a, b)):
        return True
    for line_got, line_want in zip(got, want):
        ta, tb = line_got.split(), line_want.split()
        fa, fb = _floats(ta), _floats(tb)
        if len(ta) != len(tb) or fa is None or fb is None or [round(x, 3) for x in fa] != [round(y, 3) for y in fb]:
            return False
    return True


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines
