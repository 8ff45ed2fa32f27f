"""The judge's end of the channel to the solution's process, and the proxies through which tests use what
the solution made.

Everything S answers is decoded by `wire` into J's own objects. What is neither plain data nor a value
type crosses as a handle, and J makes a proxy of it here:

- a function of the solution's: `FunctionProxy`, called by name;
- anything else (a class, an instance, a bound method, an iterable): `ObjectProxy`: calling it, its
  attributes and methods, `len`, `bool`, `str`, `repr`, `iter`, `[key]` and `in` are asked of S, and
  what comes back is again decoded by J;
- an iterator or generator: `IteratorProxy`, each `next` asked of S, so `list(gen())` works.

A proxy is compared by identity (`==`, `hash` are object's own): J never asks S whether two things are
equal, so an object whose `__eq__` always says yes cannot reach a comparison; what a proxy gives a test
is what S could send as plain data anyway (a length, a truth value, a string). One exception, as a
plain harness compares them: two objects of the solution's dataclasses (`eq=True`) are equal when S
reports the same class name and the same compared field values for both (`fields`), which J decodes
and compares itself, so a field that is an object always equal to anything is again a proxy; their
hash is that of those values. Such a comparison only ever involves two objects of the solution's: one
of them against the test's own data (a tuple, a number) is never equal. A proxy passed back
as an argument is sent as its handle, and S uses its own object.

A callable of the test's passed as an argument (a lambda, a key function, `seen.append`, one of the
solution's own functions) stays in J: S gets a `cb` handle, and when the solution calls it S sends
`("callback", number, args, kwargs)`; J decodes the arguments like any answer (so an object of the
solution's arrives as a proxy, compared by identity), calls the callable in its own process, and answers
`("cbok", value)` or `("cbraise", class names, message)`; meanwhile J may make requests of its own (the
callable calls a proxy's method), which S serves before the answer. A function of the standard
library's crosses by name instead (S calls its own: no round trip).

A call also carries the test's standard streams where the test set its own: with `sys.stdout`
redirected (`contextlib.redirect_stdout`), what the call printed comes back and is written to it; with
`sys.stdin` replaced by a seekable stream, its unread text goes along and the part the call read is
consumed. An exception raised in S is raised in J as the builtin class of the same name (or the nearest
builtin base S names, short of `Exception` itself), never StopIteration, never anything that is not an
`Exception`; otherwise as `SolutionError`.

Stdlib only: the server imports it by path (`python -I -S`).
"""

from __future__ import annotations

import builtins
import os
import sys

try:
    from . import wire
    from .raised import SolutionEnded, SolutionError, _exception, _exception_names, _text, solution_exceptions  # noqa: F401
except ImportError:  # imported by the server as a top-level module
    import wire  # type: ignore[no-redef]
    from raised import SolutionEnded, SolutionError, _exception, _exception_names, _text, solution_exceptions  # type: ignore[no-redef]  # noqa: F401

_ORIGINAL = {"stdout": None, "stdin": None}  # J's own streams, set by the judge before any test runs


def original_streams(stdout, stdin) -> None:
    _ORIGINAL.update(stdout=stdout, stdin=stdin)


class Channel:
    def __init__(self, fd: int):
        self.fd = fd
        self.gone: str | None = None
        self.proxies: dict[int, object] = {}
        self.exceptions: dict[str, type] = {}  # J's classes for the solution's exception classes (solution_exceptions)
        self.callbacks: dict[int, object] = {}  # the test's callables passed to S, by number (`cb` handles)
        self.callback_numbers: dict[int, int] = {}  # id(callable) -> number

    def fail(self, why: str) -> None:
        if self.gone is None:
            self.gone = why
            try:
                os.close(self.fd)
            except OSError:
                pass

    def proxy(self, kind: str, number: int, typename: str):
        """J's proxy for a handle S sent (one per handle, so identity holds across answers)."""
        if kind == "cb":  # a callable of the test's that S hands back: J's own object, or nothing
            if number not in self.callbacks:
                raise wire.WireError(f"no callable {number} of the test's")
            return self.callbacks[number]
        found = self.proxies.get(number)
        if found is None:
            found = (IteratorProxy if kind == "iter" else ObjectProxy)(self, number, typename)
            if len(self.proxies) < 100_000:
                self.proxies[number] = found
        return found

    def recv(self) -> object:
        if self.gone is not None:
            raise SolutionEnded(self.gone)
        try:
            return wire.recv(self.fd, self.proxy)
        except wire.ChannelClosed:
            self.fail("the solution's process ended")
        except (wire.WireError, OSError) as exc:
            self.fail(f"the solution's process sent a malformed message ({exc})")
        raise SolutionEnded(self.gone)

    def send(self, message: tuple, what: str) -> None:
        if self.gone is not None:
            raise SolutionEnded(self.gone)
        try:
            payload = wire.encode(message, handles=self.handle_of)
        except wire.NotPlainData as exc:
            raise TypeError(
                f"{what}: an argument is not plain data ({exc}), so it cannot be passed to the solution's process"
            ) from None
        try:
            wire.send_encoded(self.fd, payload)
        except OSError:
            self.fail("the solution's process ended")
            raise SolutionEnded(self.gone) from None

    def request(
        self, message: tuple, what: str, streams: bool = False, iterating: bool = False, writeback: tuple | None = None
    ) -> object:
        """Send `message`, return the decoded value of S's answer (or raise what S raised). With
        `streams`, the test's redirected stdout and replaced stdin go along (see the module doc). Only
        an iterator's `next` (`iterating`) may end with StopIteration: any other answer "stop" is a
        broken protocol, never a StopIteration that could end a test's loop early."""
        stdin = None
        keys = _writeback_keys(*writeback) if writeback else []
        if streams:
            io_spec, stdin = _streams()
            if keys:
                io_spec["writeback"] = keys
            message = (*message, io_spec)
        self.send(message, what)
        reply = self.recv()
        # the solution calls a callable of the test's
        while type(reply) is tuple and len(reply) == 4 and reply[0] == "callback":
            self.serve_callback(reply)
            reply = self.recv()
        if (
            type(reply) is tuple
            and len(reply) == 4
            and reply[0] == "ok"
            and type(reply[2]) is str
            and type(reply[3]) is int
        ):
            _after(reply[2], reply[3], stdin)
            if keys and streams:
                if type(reply[1]) is not tuple or len(reply[1]) != 2:
                    self.fail("the solution's process sent a malformed answer")
                    raise SolutionEnded(self.gone)
                value, states = reply[1]
                _write_back(*writeback, keys, states)  # type: ignore[misc]
                return value
            return reply[1]
        if (
            type(reply) is tuple
            and len(reply) == 5
            and reply[0] == "raise"
            and type(reply[1]) is list
            and type(reply[2]) is str
        ):
            if type(reply[3]) is str and type(reply[4]) is int:
                _after(reply[3], reply[4], stdin)
            raise _exception(reply[1], reply[2], self.exceptions)
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "bad" and type(reply[1]) is str:
            raise TypeError(f"{what} returned something the judge cannot take: {reply[1]}")
        if iterating and type(reply) is tuple and len(reply) == 1 and reply[0] == "stop":
            raise StopIteration
        self.fail("the solution's process sent a malformed answer")
        raise SolutionEnded(self.gone)

    def handle_of(self, x: object) -> tuple[str, int, str]:
        """A proxy goes back to S as its handle; a function of the standard library's (`len`, `str.upper`)
        as its name (a `builtin` handle: S calls its own); any other callable of the test's (a lambda, a
        key function, a bound method) as a `cb` handle: S calls it back through J (`serve_callback`).
        Nothing else of J's crosses."""
        if isinstance(x, (ObjectProxy, IteratorProxy)):
            kind = "iter" if isinstance(x, IteratorProxy) else "obj"
            return kind, object.__getattribute__(x, "_number"), object.__getattribute__(x, "_typename")
        name = _builtin_name(x)
        if name is not None:
            return "builtin", 0, name
        if callable(x):
            number = self.callback_numbers.get(id(x))
            if number is None or self.callbacks.get(number) is not x:
                if len(self.callbacks) >= CALLBACKS_LIMIT:
                    raise wire.NotPlainData("too many callables passed to the solution")
                number = len(self.callbacks) + 1
                self.callbacks[number] = x
                self.callback_numbers[id(x)] = number
            return "cb", number, "function"
        raise wire.NotPlainData(f"a {type(x).__name__} is not plain data")

    def serve_callback(self, message: tuple) -> None:
        """S calls the test's callable `number` with arguments J has decoded (plain data, J's own value
        objects, proxies): J calls it here and answers `("cbok", value)` or `("cbraise", names, message)`.
        A non-Exception (the test's SystemExit) ends the channel, then goes on up."""
        _, number, args, kwargs = message
        fn = self.callbacks.get(number) if type(number) is int else None
        if fn is None or type(args) is not tuple or type(kwargs) is not dict or not all(type(k) is str for k in kwargs):
            self.fail("the solution's process sent a malformed callback")
            raise SolutionEnded(self.gone)
        try:
            answer: tuple = ("cbok", fn(*args, **kwargs))
        except Exception as exc:
            answer = ("cbraise", _exception_names(exc), _text(exc))
        except BaseException:
            self.fail("the test's callable ended the test")
            raise
        if self.gone is not None:  # the channel failed inside the callable (its fd is closed, maybe reused)
            raise SolutionEnded(self.gone)
        try:
            payload = wire.encode(answer, handles=self.handle_of)
        except wire.NotPlainData as exc:
            payload = wire.encode(
                ("cbraise", ["TypeError"], f"the test's callable returned something that is not plain data ({exc})")
            )
        try:
            wire.send_encoded(self.fd, payload)
        except OSError:
            self.fail("the solution's process ended")
            raise SolutionEnded(self.gone) from None

    def call(self, name: str, args: tuple, kwargs: dict) -> object:
        return self.request(("call", name, args, kwargs), f"{name}()", streams=True, writeback=(args, kwargs))

    def run(self, stdin: str, limits: tuple, output_limit: int) -> tuple[bytes, int, bool]:
        """One run of the solution's program (programs mode): (stdout, status, truncated)."""
        self.send(("run", stdin, limits, output_limit), "the program")
        reply = self.recv()
        if (
            type(reply) is tuple
            and len(reply) == 4
            and reply[0] == "ran"
            and type(reply[1]) is bytes
            and type(reply[2]) is int
            and type(reply[3]) is bool
        ):
            return reply[1], reply[2], reply[3]
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "bad" and type(reply[1]) is str:
            raise TypeError(f"the program could not run: {reply[1]}")
        self.fail("the solution's process sent a malformed answer")
        raise SolutionEnded(self.gone)


def _streams() -> tuple[dict, object]:
    spec: dict = {}
    if _ORIGINAL["stdout"] is not None and sys.stdout is not _ORIGINAL["stdout"]:
        spec["capture"] = True
    stdin = sys.stdin if _ORIGINAL["stdin"] is not None and sys.stdin is not _ORIGINAL["stdin"] else None
    if stdin is not None:
        try:
            position = stdin.tell()
            spec["stdin"] = stdin.read()
            stdin.seek(position)
        except (OSError, ValueError, AttributeError):
            stdin = None
            spec.pop("stdin", None)
    return spec, stdin


def _after(printed: str, consumed: int, stdin) -> None:
    if printed:
        sys.stdout.write(printed)
    if stdin is not None and consumed > 0:
        stdin.read(consumed)


_MUTABLE = (list, dict, set, bytearray)


def _writeback_keys(args: tuple, kwargs: dict) -> list:
    """The arguments of a call that are the test's own mutable containers: positions, then keyword names."""
    return [i for i, a in enumerate(args) if type(a) in _MUTABLE] + [
        k for k, v in kwargs.items() if type(v) in _MUTABLE
    ]


def _write_back(args: tuple, kwargs: dict, keys: list, states: object) -> None:
    """In-place changes: after a call (LeetCode's `rotate(nums)`: "modify nums in-place", or a sort in place
    that returns a count), the final state S reports of each mutable argument, decoded like any answer, is
    put into the test's own object. Only the arguments J asked about, each keeping its type; nothing else
    of the test's is reachable, and what comes back is J's decoded data (a handle stays a proxy, compared
    by identity). Final states that do not fit in a message (MAX_BYTES) fail the call (S answers `bad`),
    so a solution cannot leave an argument looking unchanged by growing it past the limit."""
    if type(states) is not list:
        return
    for item in states[: len(keys)]:
        if type(item) is not tuple or len(item) != 2 or type(item[0]) not in (int, str) or item[0] not in keys:
            continue
        key, new = item
        target = args[key] if type(key) is int else kwargs[key]
        if type(new) is not type(target):
            continue
        if type(target) in (list, bytearray):
            target[:] = new
        else:
            target.clear()
            target.update(new)


BUILTIN_MODULES = ("builtins", "math", "operator", "string")
"""Modules whose functions a test may pass to the solution by name (`builtin` handles: see wire.py)."""


def _builtin_name(x: object) -> str | None:
    """`module:qualname` of a function of BUILTIN_MODULES (or a builtin type, or a method of one: `int`,
    `str.upper`) that the test passes as an argument, when it is that module's own; else None."""
    import types

    if isinstance(x, type):
        return f"builtins:{x.__name__}" if getattr(builtins, x.__name__, None) is x else None
    if type(x) not in (
        types.BuiltinFunctionType,
        types.MethodDescriptorType,
        types.WrapperDescriptorType,
        types.ClassMethodDescriptorType,
    ):
        return None
    owner = getattr(x, "__objclass__", None)
    module = "builtins" if isinstance(owner, type) else str(getattr(x, "__module__", "") or "").lstrip("_")
    qualname = str(getattr(x, "__qualname__", ""))
    if module not in BUILTIN_MODULES or not all(
        p.isidentifier() and not p.startswith("_") for p in qualname.split(".")
    ):
        return None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"{module}:{qualname}" if found is x else None


CALLBACKS_LIMIT = 100_000
"""Callables of the test's a channel may have passed to S."""


class FunctionProxy:
    """A top-level function of the solution's, called by name in S."""

    def __init__(self, channel: Channel, name: str):
        self._channel, self.__name__, self.__qualname__ = channel, name, name

    def __call__(self, *args, **kwargs):
        return self._channel.call(self.__name__, args, kwargs)

    def __repr__(self) -> str:
        return f"<the solution's function {self.__name__}>"


class AsyncFunctionProxy(FunctionProxy):
    """An `async def` of the solution's: a call gives J's own coroutine, which calls it in S when awaited
    (S runs it to its end), so `await f()` and `asyncio.run(f())` work as with the solution's own."""

    def __call__(self, *args, **kwargs):
        call = super().__call__

        async def awaited():
            return call(*args, **kwargs)

        return awaited()


class ObjectProxy:
    """An object of the solution's (see the module doc). Its state is read only through `object`'s own
    methods, so no attribute of a proxy is ever looked up in S by J's own code."""

    __slots__ = ("_channel", "_number", "_typename", "__weakref__")

    def __init__(self, channel: Channel, number: int, typename: str):
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_number", number)
        object.__setattr__(self, "_typename", typename)

    def _op(self, op: str, *args: object) -> object:
        channel = object.__getattribute__(self, "_channel")
        return channel.request(
            ("op", object.__getattribute__(self, "_number"), op, args), f"{op}() of the solution's {self._name()}"
        )

    def _name(self) -> str:
        return object.__getattribute__(self, "_typename")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        channel = object.__getattribute__(self, "_channel")
        return channel.request(("getattr", object.__getattribute__(self, "_number"), name), f"{self._name()}.{name}")

    def __setattr__(self, name: str, value: object) -> None:
        if name.startswith("__"):
            raise AttributeError(name)
        channel = object.__getattribute__(self, "_channel")
        channel.request(
            ("setattr", object.__getattribute__(self, "_number"), name, value), f"setting {self._name()}.{name}"
        )

    def __call__(self, *args, **kwargs):
        channel = object.__getattribute__(self, "_channel")
        return channel.request(
            ("callobj", object.__getattribute__(self, "_number"), args, kwargs),
            f"{self._name()}()",
            streams=True,
            writeback=(args, kwargs),
        )

    def __len__(self) -> int:
        n = self._op("len")
        if type(n) is not int:
            raise TypeError(f"len() of the solution's {self._name()} is not an int")
        return n

    def __bool__(self) -> bool:
        value = self._op("bool")
        if type(value) is not bool:
            raise TypeError(f"the truth of the solution's {self._name()} is not a bool")
        return value

    def __str__(self) -> str:
        text = self._op("str")
        return text if type(text) is str else f"<the solution's {self._name()}>"

    def __repr__(self) -> str:
        try:
            text = self._op("repr")
        except Exception:
            text = None
        return text if type(text) is str else f"<the solution's {self._name()}>"

    def __iter__(self):
        return self._op("iter")

    def __getitem__(self, key: object) -> object:
        return self._op("getitem", key)

    def __contains__(self, item: object) -> bool:
        value = self._op("contains", item)
        if type(value) is not bool:
            raise TypeError(f"`in` of the solution's {self._name()} is not a bool")
        return value

    def _fields(self) -> tuple | None:
        """(class name, [compared field values]) when S reports the object as a value-compared dataclass."""
        if isinstance(self, IteratorProxy):
            return None
        found = self._op("fields")
        if type(found) is tuple and len(found) == 2 and type(found[0]) is str and type(found[1]) is list:
            return found[0], tuple(found[1])
        return None

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, ObjectProxy):
            return NotImplemented
        mine, theirs = self._fields(), other._fields()
        if mine is None or theirs is None:
            return False
        return mine == theirs

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        found = self._fields() if object.__getattribute__(self, "_channel").gone is None else None
        return object.__hash__(self) if found is None else hash(found)


class IteratorProxy(ObjectProxy):
    """An iterator or generator of the solution's: `next` is asked of S, one item at a time."""

    __slots__ = ()

    def __iter__(self):
        return self

    def __next__(self) -> object:
        channel = object.__getattribute__(self, "_channel")
        return channel.request(
            ("next", object.__getattribute__(self, "_number")),
            f"next() of the solution's {self._name()}",
            iterating=True,
        )


def missing(name: str):
    def missing(*args, **kwargs):
        raise NameError(f"name {name!r} is not defined by the solution")

    missing.__name__ = missing.__qualname__ = name
    return missing
