"""J, the judge: runs a row's test code against the solution, which lives in another process.

J is a fork of the sandbox's trusted set-up process, never of the solution: the solution's process (S)
cannot reach J's interpreter, namespace or memory (another uid, not dumpable, another process), and J
never touches an object S made. What J gets from S comes over a socket as plain data (`wire.py`) and is
decoded by J's own code into fresh builtin objects. The namespace the tests run in is J's:

- `__builtins__` is J's own builtins module: nothing S patched (`builtins.abs`, `enumerate`, the
  namespace's `__builtins__`) exists here;
- the trusted set-up code (`setup`: a HumanEval prompt's helpers, MBPP's `test_setup_code` and
  `test_imports`) runs first, before any name of the solution is bound;
- then each top-level name S reports, unless it would shadow a builtin, a name the set-up defined or a
  name the tests themselves bind at module level anywhere (`def expected`, `from math import isclose`,
  `x = ...`: a snippet that fails before the line that binds it must not leave the name to the
  solution for the snippets after it); the row's declared `entry_point` is the one exception, it is
  always the solution's:
  a callable becomes a proxy that sends `call(name, args, kwargs)` to S and decodes the answer (a
  function the solution imported from the standard library too: what answers is the solution's own
  object, whatever S claims it is); plain data becomes a decoded copy; a module becomes J's own import
  of the standard-library module of that name, and only under that name (`import math` binds `math`;
  `import math as m` binds nothing), and only for the pure computation modules in `TEST_MODULES`. J
  never calls a function, nor imports a module, that S chose: S could otherwise pick one whose result
  is an object of surprising equality (`unittest.mock._ANY() == 42`), one with side effects in J (a
  package's `__main__`), or swap one module for another under a name the tests use. When the row
  declares an entry point, that is the only callable of the solution's the tests get (besides the
  standard-library modules J imports itself): a test that calls a name it neither defines nor
  imports (a bare `isclose`) cannot be answered by the solution. Without a declared entry point
  (MBPP), every callable of the solution is proxied, so such a test would call the solution's: the
  judge cannot know which names the test meant to come from elsewhere. If the row declares an entry
  point that S does not define, calling it raises NameError.

A proxy call fails (raises in J, so the test using it fails) when an argument is not plain data (a
lambda, an object; arguments are copies, so in-place changes by the solution are not seen), when the
return value is not plain data, when S's answer is malformed, or when S has ended. An exception raised
in S is raised in J as the builtin class of the same name (or the nearest builtin base S names, short
of `Exception` itself), never StopIteration, never anything that is not an `Exception`; otherwise as
`SolutionError` (an `Exception`) whose message starts with the solution's class name.

Each test snippet then runs in that namespace, in order; it passes when it runs to its end without
raising. J reports on its own pipe, which S never holds (one line each):
`loaded` | `loadfail <why>`, then `pass <i>` / `fail <i> <why>` for every snippet, `gone <why>` once
if S ended early, and `done <n>`; `infra <why>` when the trusted set-up code itself fails.

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
    from . import wire
except ImportError:  # imported by the server as a top-level module
    import wire  # type: ignore[no-redef]

INFO_LIMIT = 300
"""Characters of an error description sent to the server per line."""
TEST_MODULES = frozenset({
    "array", "base64", "binascii", "bisect", "calendar", "cmath", "collections", "copy", "datetime", "decimal", "difflib",
    "enum", "fractions", "functools", "hashlib", "heapq", "itertools", "json", "keyword", "math", "numbers", "operator",
    "os", "random", "re", "statistics", "string", "struct", "sys", "textwrap", "time", "typing", "unicodedata", "zlib",
})
"""Standard-library modules (and their submodules) a test may use because the solution imported them."""
_NEVER_RAISE = (StopIteration, StopAsyncIteration)


class SolutionError(Exception):
    """An exception raised by the solution whose class is not a builtin one, or a failed call."""


class SolutionEnded(SolutionError):
    """The solution's process ended (it exited, crashed, was killed or broke the protocol)."""


class _Channel:
    def __init__(self, fd: int):
        self.fd = fd
        self.gone: str | None = None

    def fail(self, why: str) -> None:
        if self.gone is None:
            self.gone = why
            try:
                os.close(self.fd)
            except OSError:
                pass

    def recv(self) -> object:
        if self.gone is not None:
            raise SolutionEnded(self.gone)
        try:
            return wire.recv(self.fd)
        except wire.ChannelClosed:
            self.fail("the solution's process ended")
        except (wire.WireError, OSError) as exc:
            self.fail(f"the solution's process sent a malformed message ({exc})")
        raise SolutionEnded(self.gone)

    def call(self, name: str, args: tuple, kwargs: dict) -> object:
        if self.gone is not None:
            raise SolutionEnded(self.gone)
        try:
            payload = wire.encode(("call", name, args, kwargs))
        except wire.NotPlainData as exc:
            raise TypeError(f"{name}(): an argument is not plain data ({exc}), so it cannot be passed to the solution's process") from None
        try:
            wire.send_encoded(self.fd, payload)
        except OSError:
            self.fail("the solution's process ended")
            raise SolutionEnded(self.gone) from None
        reply = self.recv()
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "ok":
            return reply[1]
        if type(reply) is tuple and len(reply) == 3 and reply[0] == "raise" and type(reply[1]) is list and type(reply[2]) is str:
            raise _exception(reply[1], reply[2])
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "bad" and type(reply[1]) is str:
            raise TypeError(f"{name}() returned something that is not plain data: {reply[1]}")
        self.fail("the solution's process sent a malformed answer")
        raise SolutionEnded(self.gone)


def _exception(names: list, message: str) -> Exception:
    for name in names[:8]:
        cls = getattr(builtins, name, None) if type(name) is str else None
        if isinstance(cls, type) and issubclass(cls, Exception) and cls is not Exception and not issubclass(cls, _NEVER_RAISE):
            try:
                return cls(message)
            except Exception:  # a constructor that wants other arguments: try the next base
                continue
    first = names[0] if names and type(names[0]) is str else "Exception"
    return SolutionError(f"{first[:100]}: {message}")


def _proxy(channel: _Channel, name: str):
    def proxy(*args, **kwargs):
        return channel.call(name, args, kwargs)

    proxy.__name__ = proxy.__qualname__ = name
    return proxy


def _missing(name: str):
    def missing(*args, **kwargs):
        raise NameError(f"name {name!r} is not defined by the solution")

    missing.__name__ = missing.__qualname__ = name
    return missing


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

    for snippet in tests:
        try:
            visit(ast.parse(snippet), "module")
        except (SyntaxError, ValueError, RecursionError):
            continue
    return names


def bind_solution(ns: dict, reported: object, channel: _Channel, entry_point: str | None, own: set[str] | frozenset[str] = frozenset()) -> None:
    """Bind the names S reported into `ns` (see the module docstring for the rules); `own`: the names
    the tests bind themselves (`test_names`)."""
    trusted = set(dir(builtins)) | set(ns) | set(own)
    called: set[str] = set()
    if type(reported) is not list:
        reported = []
    for item in reported:
        if type(item) is not tuple or len(item) != 3 or type(item[0]) is not str:
            continue
        name, kind, value = item
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("__"):
            continue
        if name in trusted and name != entry_point:
            continue
        if name == entry_point:  # the entry point is always the solution's own, called over the channel
            if kind == "call":
                ns[name] = _proxy(channel, name)
                called.add(name)
            continue
        if kind == "module":
            module = _test_module(name, value)
            if module is not None:
                ns[name] = module
        elif entry_point:  # with a declared entry point, nothing else of the solution's
            continue
        elif kind == "call":
            ns[name] = _proxy(channel, name)
        elif kind == "data" and type(value) is bytes:
            try:
                ns[name] = wire.decode(value)
            except wire.WireError:
                pass
    if entry_point and entry_point not in called:
        ns[entry_point] = _missing(entry_point)


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:
        text = ""
    return f"{name}: {text}" if text else name


def run(job: dict, sock: int, results: int) -> None:
    """Judge one solution: `job` has `tests`, `setup`, `entry_point`; S is on `sock`; lines go to
    `results`. Never returns."""

    def emit(line: str) -> None:
        data = (" ".join(line.split())[:INFO_LIMIT] + "\n").encode("utf-8", "replace")
        while data:
            data = data[os.write(results, data) :]

    out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True)
    sys.stdout = sys.__stdout__ = sys.stderr = sys.__stderr__ = out
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    tests: list[str] = job["tests"]
    entry_point = job.get("entry_point") or None
    ns: dict = {"__name__": "__test__", "__builtins__": builtins}
    if job.get("setup"):
        try:
            exec(compile(job["setup"], "<setup>", "exec"), ns)
        except BaseException as exc:
            emit(f"infra the row's set-up code failed: {_describe(exc)}")
            os._exit(0)
    channel = _Channel(sock)
    try:
        hello = channel.recv()
    except SolutionEnded as exc:
        hello = ("loadfail", ["SolutionEnded"], f"{exc} before it finished loading")
    if type(hello) is tuple and len(hello) == 2 and hello[0] == "ready":
        bind_solution(ns, hello[1], channel, entry_point, test_names(tests))
        emit("loaded")
    else:
        if type(hello) is tuple and len(hello) == 3 and hello[0] == "loadfail" and type(hello[1]) is list and type(hello[2]) is str:
            first = hello[1][0] if hello[1] and type(hello[1][0]) is str else "Exception"
            why = f"{first}: {hello[2]}" if hello[2] else first
        else:
            why = "the solution's process sent a malformed greeting"
        emit(f"loadfail {why}")
        emit(f"done {len(tests)}")
        os._exit(0)
    for i, snippet in enumerate(tests):
        try:
            exec(compile(snippet, f"<test {i}>", "exec"), ns)
        except BaseException as exc:  # the test's own SystemExit too: this snippet fails, the rest run
            emit(f"fail {i} {_describe(exc)}")
        else:
            emit(f"pass {i}")
    if channel.gone is not None:
        emit(f"gone {channel.gone}")
    emit(f"done {len(tests)}")
    os._exit(0)
