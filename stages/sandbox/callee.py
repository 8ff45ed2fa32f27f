"""S, the solution's process: load the model's code, then answer the judge's calls.

Runs inside the sandbox (after the server dropped privileges and installed the syscall filter), with
the socket to the judge on a file descriptor and nothing else of the judge's: not the tests, not the
result pipe, not the judge's memory. Everything here runs in the same interpreter as the untrusted
code, so none of it is trusted: whatever S sends is checked and decoded by the judge's own code
(`judge.py`, `wire.py`). This module only makes honest solutions work:

1. exec the code in a fresh namespace (`__name__ == "solution"`); on an exception (SystemExit too)
   send `("loadfail", exception class names, message)` and exit;
2. send `("ready", names)`: for every top-level name (dunder names skipped) one of
   `(name, "call", None)` (a callable: the judge makes a proxy that calls it here, a function imported
   from the standard library too), `(name, "module", module_name)`, or `(name, "data", encoded value)`
   (plain data only; anything else is not reported);
3. answer each `("call", name, args, kwargs)` with `("ok", value)` (a subclass of a plain type is sent
   as its base type's value: a Counter as a dict, a namedtuple as a tuple, an IntEnum as an int),
   `("raise", class names, message)` or `("bad", why)` when the return value is not plain data
   (an iterator, a deque, an object of the solution's own class). A SystemExit (or any other
   BaseException that is not an Exception) inside a call ends the process without an answer: the
   judge sees the channel close, and that call and every later one fail.

Stdlib only: the server imports it by path (`python -I -S`).
"""

from __future__ import annotations

import builtins
import io
import os
import sys

try:
    from . import wire
except ImportError:  # imported by the server as a top-level module
    import wire  # type: ignore[no-redef]

MESSAGE_LIMIT = 2000
"""Characters of an exception's message that are sent to the judge."""


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


def _report(ns: dict) -> list:
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
            elif callable(value):
                names.append((name, "call", None))
            else:
                payload = wire.encode(value, limit=budget, subclasses=True)
                budget -= len(payload)
                names.append((name, "data", payload))
        except BaseException:  # not plain data, or over the budget: the name is not reported
            continue
    return names


def _streams() -> None:
    out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True)
    sys.stdout = sys.__stdout__ = out
    sys.stderr = sys.__stderr__ = out
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.argv = ["solution"]


def serve(sock: int, code: str) -> None:
    """Load `code` and answer calls on `sock` until the judge closes it. Never returns."""
    send, send_encoded, recv, encode, _exit = wire.send, wire.send_encoded, wire.recv, wire.encode, os._exit
    _streams()
    ns: dict = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec(compile(code, "<solution>", "exec"), ns)
    except BaseException as exc:  # SyntaxError, an exception at import time, SystemExit: no load
        try:
            send(sock, ("loadfail", _class_names(exc), _message(exc)))
        finally:
            _exit(0)
    try:
        send(sock, ("ready", _report(ns)))
    except BaseException:
        _exit(0)
    while True:
        try:
            request = recv(sock)
        except BaseException:  # the judge is done (or sent nonsense, which it does not)
            _exit(0)
        try:
            _, name, args, kwargs = request  # type: ignore[misc]
            fn = ns[name]
        except BaseException:
            send(sock, ("raise", ["NameError", "Exception"], f"name {request!r:.200} is not defined by the solution"))
            continue
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            payload = encode(("raise", _class_names(exc), _message(exc)))
        except BaseException:  # SystemExit and the like: the solution ends its own run
            _exit(0)
        else:
            try:
                payload = encode(("ok", value), subclasses=True)
            except wire.NotPlainData as exc:
                payload = encode(("bad", str(exc)[:MESSAGE_LIMIT]))
            except BaseException as exc:
                payload = encode(("bad", f"its return value could not be encoded ({type(exc).__name__})"))
        try:
            send_encoded(sock, payload)
        except BaseException:
            _exit(0)
