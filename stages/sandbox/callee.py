"""S, the solution's process: load the model's code, then answer the judge's requests.

Runs inside the sandbox (after the server dropped privileges and installed the syscall filter), with
the socket to the judge on a file descriptor and nothing else of the judge's: not the tests, not the
result pipe, not the judge's memory. Everything here runs in the same interpreter as the untrusted
code, so none of it is trusted: whatever S sends is checked and decoded by the judge's own code
(`judge.py`, `wire.py`). This module only makes honest solutions work as they would under a plain
harness:

1. functions mode: exec the code as a real module named `solution` (in `sys.modules`, so pickling its
   functions works: a `multiprocessing.Pool` in a solution); on an exception (SystemExit too) send
   `("loadfail", exception class names, message)` and exit. Then `("ready", names)`: for every
   top-level name (dunder names skipped) `(name, "call", None)` for a function (`"async"` for an `async
   def`, whose calls S runs to their end with `asyncio.run`, and J gives the tests as coroutines), `(name, "module",
   module_name)`, `(name, "exception", [its class's name and its bases' names])` for an exception class
   (the judge makes a class of its own from the names), or `(name, "data", encoded value)`: plain data, a
   standard-library value type, or a handle (a class, an instance, an iterator: the judge makes a proxy
   of it);
   programs mode (stdin/stdout problems): compile the code (a syntax error is a load failure) and send
   `("ready", [])`; the program runs only when the judge asks, once per case.
2. answer each request (see `serve`): a call of a top-level function, of a handle (a class, a bound
   method), a method or attribute of a handle, one step of an iterator, one of a few operations (len,
   bool, str, repr, iter, getitem, contains), an expression the tests evaluate (`eval`: routed here by
   the judge, never run in its own process), or one run of the program with its stdin. Results go back
   as `("ok", value, printed, consumed)` (`value` encoded with handles for what is not plain data; when
   the judge asked for the test's mutable arguments back (`writeback`), `(value, their final states)`
   (when they do not fit in a message beside the value, the answer is `bad`: the call fails);
   `printed`: what the call printed, when the test had redirected its stdout; `consumed`: how much of
   the stdin the test had set the call read), `("raise", class names, message, printed, consumed)`,
   `("bad", why)`, `("stop",)` at the end of an iterator, or `("ran", stdout bytes, status, truncated)`.
   A callable of the test's arrives as a `Callback`: the solution's call of it asks the judge to run it
   (`("callback", ...)`, answered by `("cbok", value)` or `("cbraise", names, message)`, with the judge's
   own requests served meanwhile).
   A SystemExit (or any other BaseException that is not an Exception) inside a call ends the process
   without an answer: the judge sees the channel close, and that call and every later one fail.

The recursion limit in S is raised by the depth of S's own frames under the call, so a solution gets
the same usable depth as under a plain `exec` harness; and what `site` adds to the builtins (`exit`,
`quit`, `help`, ...) is there, as under `python solution.py` (the server itself runs with -S).

Stdlib only: the server imports it by path (`python -I -S`).
"""

from __future__ import annotations

import builtins
import io
import os
import sys

try:
    from . import program, wire
except ImportError:  # imported by the server as a top-level module
    import program  # type: ignore[no-redef]
    import wire  # type: ignore[no-redef]

MESSAGE_LIMIT = 2000
"""Characters of an exception's message that are sent to the judge."""
CAPTURE_LIMIT = 1_000_000
"""Characters of a call's printed output sent back when the test redirected its stdout (the rest goes to
the sample's output as usual)."""
HANDLES_LIMIT = 100_000
"""Objects the judge may hold handles to at once."""
PLAIN_HARNESS_DEPTH = 2
"""Frames a plain harness has under the solution's function: exec's module frame and the test's call."""
OPS = ("len", "bool", "str", "repr", "iter", "getitem", "contains", "fields")


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
        text = str.__str__(text) if isinstance(text, str) else ""  # an exact str even from a subclass
    except BaseException:
        text = ""
    return text[:MESSAGE_LIMIT]


def _class_names(exc: BaseException) -> list[str]:
    """The exception's class name, then those of the builtin classes it derives from."""
    names = []
    try:
        for cls in type(exc).__mro__:
            name = type.__dict__["__name__"].__get__(cls)
            if not names or getattr(builtins, name, None) is cls:
                names.append(str.__str__(name))
            if len(names) >= 8:
                break
    except BaseException:
        pass
    return names or ["Exception"]


def _is_async(fn: object) -> bool:
    """Whether `fn` is an `async def` function (its calls make coroutines): the judge awaits such calls."""
    try:
        code = getattr(fn, "__code__", None)
        return type(code).__name__ == "code" and bool(code.co_flags & 0x80)  # CO_COROUTINE
    except Exception:
        return False


def _fields(obj: object) -> object:
    """For an instance of a dataclass that compares by value (`eq=True`): (its class's name, the values of
    its compared fields, in order), what its generated `__eq__` compares; else None."""
    import dataclasses

    cls = type(obj)
    params = getattr(cls, "__dataclass_params__", None)
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type) or params is None or not params.eq:
        return None
    return (
        str.__str__(type.__dict__["__qualname__"].__get__(cls)),
        [getattr(obj, f.name) for f in dataclasses.fields(obj) if f.compare],
    )


def _scalar(x: object):
    """A numpy scalar (`numpy.int64`, `numpy.bool_`; numpy.float64 is a float already) as its Python value,
    for the encoder (`wire.encode(convert=)`); None for anything else."""
    numpy = sys.modules.get("numpy")
    generic = getattr(numpy, "generic", None) if numpy is not None else None
    if isinstance(generic, type) and isinstance(x, generic):
        try:
            return (x.item(),)
        except Exception:
            return None
    return None


def _mro_names(cls: type) -> list:
    """The names of an exception class and of the classes it derives from, up to BaseException."""
    names = []
    for klass in type.__dict__["__mro__"].__get__(cls)[:8]:
        names.append(str.__str__(type.__dict__["__name__"].__get__(klass)))
    return names


class Handles:
    """The objects the judge holds handles to, by number."""

    def __init__(self, solution: object = None) -> None:
        self.objects: dict[int, object] = {}
        self.numbers: dict[int, int] = {}  # id(object) -> number, so one object has one handle
        self.callbacks: dict[int, Callback] = {}  # the test's callables, by J's number
        self.solution = solution

    def add(self, x: object) -> tuple[str, int, str]:
        if type(x) is Callback:  # the test's own callable goes back as J's number: J uses its own object
            return "cb", x.number, "function"
        number = self.numbers.get(id(x))
        if number is None or self.objects.get(number) is not x:
            if len(self.objects) >= HANDLES_LIMIT:
                raise wire.NotPlainData("too many objects handed to the judge")
            number = len(self.objects) + 1
            self.objects[number] = x
            self.numbers[id(x)] = number
        kind = "iter" if hasattr(type(x), "__next__") and hasattr(type(x), "__iter__") else "obj"
        try:
            typename = str.__str__(type.__dict__["__name__"].__get__(type(x)))
        except BaseException:
            typename = "object"
        return kind, number, typename

    def get(self, kind: str, number: int, typename: str) -> object:
        if kind == "builtin":
            return _builtin(typename)
        if kind == "cb":
            found = self.callbacks.get(number)
            if found is None:
                if len(self.callbacks) >= HANDLES_LIMIT:
                    raise wire.WireError("too many callables of the test's")
                found = self.callbacks[number] = Callback(self.solution, number)
            return found
        if number not in self.objects:
            raise wire.WireError(f"no object {number}")
        return self.objects[number]


class Callback:
    """A callable of the test's (a lambda, a key function), which lives in J: calling it sends
    `("callback", number, args, kwargs)` and serves J's requests (a nested call of the solution's, a
    proxy's method) until J answers `("cbok", value)` or `("cbraise", class names, message)`."""

    __slots__ = ("solution", "number", "__weakref__")

    def __init__(self, solution: object, number: int) -> None:
        self.solution, self.number = solution, number

    def __call__(self, *args, **kwargs):
        return self.solution.callback(self.number, args, kwargs)

    def __repr__(self) -> str:
        return f"<the test's callable {self.number}>"


def _raised(names: object, message: object) -> BaseException:
    """The exception a test's callable raised in J, as the builtin class of that name (else Exception)."""
    for name in names[:8] if type(names) is list else []:
        cls = getattr(builtins, name, None) if type(name) is str else None
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                return cls(message)
            except Exception:
                continue
    return Exception(message)


_BUILTIN_MODULES = ("builtins", "math", "operator", "string")


def _builtin(name: str) -> object:
    """The standard-library function a test passed by name (`module:qualname`, see wire.py), looked up here."""
    module, _, qualname = name.partition(":")
    if (
        module not in _BUILTIN_MODULES
        or not qualname
        or not all(p.isidentifier() and not p.startswith("_") for p in qualname.split("."))
    ):
        raise wire.WireError(f"no function {name[:80]}")
    import importlib

    found: object = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _report(ns: dict, handles: Handles) -> list:
    names: list = []
    budget = wire.MAX_BYTES // 2
    for name, value in list(ns.items()):
        if type(name) is not str or name.startswith("__"):
            continue
        try:
            if type(value) is type(sys):
                module = getattr(value, "__name__", None)
                if type(module) is str:
                    names.append((name, "module", module))
            elif isinstance(value, type) and issubclass(value, BaseException):  # the judge makes a class of its own
                names.append((name, "exception", _mro_names(value)))
            elif callable(value) and not isinstance(value, type):
                names.append((name, "call", "async" if _is_async(value) else None))
            else:  # data, or a class or an object of the solution's: a handle the judge makes a proxy of
                payload = wire.encode(value, limit=budget, subclasses=True, handles=handles.add, convert=_scalar)
                budget -= len(payload)
                names.append((name, "data", payload))
        except BaseException:  # over the budget, or not encodable: the name is not reported
            continue
    return names


def _site_builtins() -> None:
    """What `site` adds to the builtins that solutions use (`exit`, `quit`, `help`, `copyright`, `credits`,
    `license`): the server runs with -S, a plain `python solution.py` has them. `exit()` raises SystemExit
    as there: a program's run ends with its status, a function's call ends S (see the module doc)."""
    try:
        import site

        site.setquit()
        site.setcopyright()
        site.sethelper()
    except Exception:  # without them a solution gets the NameError it would get under `python -S`
        pass


def _streams() -> None:
    out = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    sys.stdout = sys.__stdout__ = out
    sys.stderr = sys.__stderr__ = out
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.argv = ["solution"]


class _Capture(io.StringIO):
    """A call's stdout when the test redirected its own: kept up to CAPTURE_LIMIT characters, the rest
    written to the sample's output."""

    def __init__(self, real) -> None:
        super().__init__()
        self.real, self.kept = real, 0

    def write(self, text: str) -> int:
        room = CAPTURE_LIMIT - self.kept
        if room > 0:
            super().write(text[:room])
            self.kept += min(room, len(text))
        if len(text) > room:
            self.real.write(text[max(room, 0) :])
        return len(text)


def _call(fn, args: tuple, kwargs: dict, io_spec: object) -> tuple:
    """Call `fn` with the test's stdout and stdin as the test had set them: (value, exception, printed,
    consumed)."""
    capture = stdin = None
    saved_out, saved_in = sys.stdout, sys.stdin
    if type(io_spec) is dict:
        if io_spec.get("capture") is True:
            capture = sys.stdout = _Capture(saved_out)
        if type(io_spec.get("stdin")) is str:
            stdin = sys.stdin = io.StringIO(io_spec["stdin"])
    value = exc = None
    try:
        value = fn(*args, **kwargs)
        if type(value).__name__ == "coroutine" and hasattr(value, "send"):  # an `async def`: run it to its end here
            import asyncio

            value = asyncio.run(value)
    except Exception as raised:
        exc = raised
    finally:
        sys.stdout, sys.stdin = saved_out, saved_in
    keys = io_spec.get("writeback") if type(io_spec) is dict else None
    if type(keys) is list and exc is None:  # the judge asked for the final state of the test's mutable arguments
        states = [
            (k, args[k] if type(k) is int else kwargs[k])
            for k in keys
            if (type(k) is int and 0 <= k < len(args)) or (type(k) is str and k in kwargs)
        ]
        value = (value, states)
    return value, exc, capture.getvalue() if capture is not None else "", stdin.tell() if stdin is not None else 0


def _depth() -> int:
    frame, n = sys._getframe(), 0
    while frame is not None:
        frame, n = frame.f_back, n + 1
    return n


class Solution:
    """The loaded solution and the requests the judge may make of it."""

    def __init__(self, sock: int, code: str, mode: str) -> None:
        self.sock, self.mode = sock, mode
        self.handles = Handles(self)
        self.module = type(sys)("solution")
        self.ns = self.module.__dict__
        self.ns["__builtins__"] = builtins
        self.program = None

    def load(self, code: str) -> list:
        if self.mode == "programs":
            self.program = compile(code, "<solution>", "exec")
            return []
        sys.modules["solution"] = self.module
        exec(compile(code, "<solution>", "exec"), self.ns)
        return _report(self.ns, self.handles)

    def answer(self, request: object) -> tuple:
        kind = request[0] if type(request) is tuple and request else None
        if kind == "run" and self.program is not None and len(request) == 4:
            return program.run(self.program, request[1], request[2], request[3])
        try:
            target, args, kwargs, io_spec = self._target(request)
        except (LookupError, TypeError, ValueError, AttributeError) as exc:
            return ("raise", _class_names(exc), _message(exc), "", 0)
        value, exc, printed, consumed = _call(target, args, kwargs, io_spec)
        if exc is not None:
            if type(exc) is StopIteration and kind == "next":
                return ("stop",)
            return ("raise", _class_names(exc), _message(exc), printed, consumed)
        return ("ok", value, printed, consumed)

    def reply(self, request: object) -> None:
        """Answer one request of J's and send the answer; a SystemExit (or any BaseException) of the
        solution's inside it, or a closed channel, ends the process."""
        try:
            reply = self.answer(request)
        except BaseException:  # SystemExit and the like: the solution ends its own run
            os._exit(0)
        try:
            payload = wire.encode(reply, subclasses=True, handles=self.handles.add, convert=_scalar)
        except wire.NotPlainData as exc:
            payload = wire.encode(("bad", str(exc)[:MESSAGE_LIMIT]))
        except BaseException as exc:
            payload = wire.encode(("bad", f"its return value could not be encoded ({type(exc).__name__})"))
        try:
            wire.send_encoded(self.sock, payload)
        except BaseException:
            os._exit(0)

    def callback(self, number: int, args: tuple, kwargs: dict) -> object:
        """Call the test's callable `number` in J (see `Callback`), serving J's requests meanwhile."""
        payload = wire.encode(
            ("callback", number, args, kwargs), subclasses=True, handles=self.handles.add, convert=_scalar
        )
        try:
            wire.send_encoded(self.sock, payload)
        except BaseException:
            os._exit(0)
        while True:
            try:
                message = wire.recv(self.sock, self.handles.get)
            except BaseException:
                os._exit(0)
            if type(message) is tuple and len(message) == 2 and message[0] == "cbok":
                return message[1]
            if type(message) is tuple and len(message) == 3 and message[0] == "cbraise":
                raise _raised(message[1], message[2])
            self.reply(message)

    def _target(self, request: tuple):
        """(callable, args, kwargs, io) for a request; raises for one that names nothing of ours."""
        kind = request[0]
        obj = lambda: self.handles.get("obj", request[1], "")  # noqa: E731
        if kind == "call":
            _, name, args, kwargs, io_spec = request
            return self.ns[name], args, kwargs, io_spec
        if kind == "callobj":
            _, _, args, kwargs, io_spec = request
            return obj(), args, kwargs, io_spec
        if kind == "getattr":
            return getattr, (obj(), request[2]), {}, None
        if kind == "setattr":
            return setattr, (obj(), request[2], request[3]), {}, None
        if kind == "next":
            it = obj()
            return next, (it,), {}, None
        if kind == "op" and request[2] in OPS:
            op, args = request[2], request[3]
            fns = {
                "len": len,
                "bool": bool,
                "str": str,
                "repr": repr,
                "iter": iter,
                "getitem": lambda o, k: o[k],
                "contains": lambda o, k: k in o,
                "fields": _fields,
            }
            return fns[op], (obj(), *args), {}, None
        if kind == "eval" and request[2] in ("eval", "exec"):
            fn = builtins.eval if request[2] == "eval" else builtins.exec
            return fn, (request[1], self.ns), {}, None
        raise LookupError(f"request {str(request)[:100]} names nothing of the solution's")


def serve(sock: int, code: str, mode: str = "functions") -> None:
    """Load `code` and answer requests on `sock` until the judge closes it. Never returns."""
    send, recv, _exit = wire.send, wire.recv, os._exit
    _streams()
    _site_builtins()
    solution = Solution(sock, code, mode)
    try:
        names = solution.load(code)
    except BaseException as exc:  # SyntaxError, an exception at import time, SystemExit: no load
        try:
            send(sock, ("loadfail", _class_names(exc), _message(exc)))
        finally:
            _exit(0)
    del code
    try:
        send(sock, ("ready", names))
    except BaseException:
        _exit(0)
    # the frames below a call are ours
    sys.setrecursionlimit(sys.getrecursionlimit() + _depth() + 1 - PLAIN_HARNESS_DEPTH)
    while True:
        try:
            request = recv(sock, solution.handles.get)
        except BaseException:  # the judge is done (or sent nonsense, which it does not)
            _exit(0)
        solution.reply(request)
