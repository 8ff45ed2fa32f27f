"""Plain data across the sandbox's trust boundary: a strict tagged encoding and its framing.

The judge (J) and the solution (S) run in separate processes and talk only through a socket carrying
messages encoded here. The encoding carries exactly these types, each checked by *exact* type
(`type(x) is int`, bool before int; subclasses are refused, unless the sender asks to send them as
their base type, see `encode`):

    None, bool, int, float (nan, inf and -0.0 included), complex, str, bytes,
    list, tuple, dict, set, frozenset  (of the above, nested at most MAX_DEPTH deep)

and the standard library's value types that tests compare (`VALUE_TYPES`: Fraction, Decimal, date,
time, datetime, timedelta, timezone, ZoneInfo, deque, Counter, OrderedDict, defaultdict with a builtin
factory, named tuples, range, bytearray, UUID), each as its name and its data in the plain types above,

so whatever S sends, J's own decoder builds fresh objects from bytes: builtin ones, or the standard
library's own classes made by J's constructors from plain data (a named tuple as a class J makes itself,
from the field names S sends). No object of the solution's making (an `__eq__` that always says yes, an
int subclass, a lazy proxy) ever reaches a comparison in J.

A numpy scalar the solution returns crosses as its Python value (the sender's `convert`: `numpy.int64(3)`
as 3, `numpy.True_` as True), as it compares under a plain harness.

Anything else (an object of the solution's own class, an iterator, a generator) can cross only as a
*handle* when the sender asks for it (`handles=`): its kind, a number and its class's name, nothing
more. The receiver makes of it what it chooses (`decode(..., handle=)`): J a proxy that asks S to act on
the object, compared by identity only; S the object the number names. A `builtin` handle is the other
way round, from J: a function of the standard library's that a test passes (`len`, `str.upper`,
`math.sqrt`, `int` as a key) named by its module and qualified name, which S looks up in its own
interpreter; nothing of J's is called. A `cb` handle is a callable of the test's (a lambda, a key
function) that J passes: S gets an object that, when the solution calls it, asks J to call it with
the arguments as plain data (J runs it in its own process on J's decoded copies and proxies, and sends
back what it returns); what S gets back as a `cb` handle J decodes as its own callable, nothing of S's.
A message is at most MAX_BYTES
long; a malformed one, a truncated one, an unknown tag, trailing bytes, too deep a nesting or an
unhashable dict key or set member raise `WireError`.

Hand-written because nothing in the standard library fits: `pickle` and `marshal` rebuild arbitrary
objects (pickle runs code), and `json` loses types (tuples, bytes, sets, int keys, nan). Stdlib only:
the sandbox server imports this module by path (`python -I -S`).

Frame: 4-byte big-endian length, then the encoded value.
"""

from __future__ import annotations

import os
import struct

try:
    from . import values
except ImportError:  # imported by the server as a top-level module
    import values  # type: ignore[no-redef]

MAX_BYTES = 8 << 20
"""Largest encoded message (8 MiB)."""
MAX_DEPTH = 100
"""Deepest nesting of containers."""

_LEN = struct.Struct(">I")
_FLOAT = struct.Struct(">d")
_COMPLEX = struct.Struct(">dd")

# Tags: one byte each.
_NONE, _TRUE, _FALSE = b"N", b"T", b"F"
_INT, _FLOAT_T, _COMPLEX_T, _STR, _BYTES = b"i", b"f", b"c", b"s", b"b"
_LIST, _TUPLE, _DICT, _SET, _FROZENSET = b"l", b"t", b"d", b"S", b"Z"
_VALUE, _HANDLE = b"V", b"H"


class WireError(ValueError):
    """A message that is not well-formed plain data (or does not fit the limits)."""


class NotPlainData(WireError):
    """A value that the encoding does not carry: an object of another type, a subclass of a plain
    type, a container nested too deep, or a message over MAX_BYTES."""


class ChannelClosed(EOFError):
    """The other end closed the socket (its process ended)."""


def _type_name(t: type) -> str:
    name = type.__dict__["__name__"].__get__(t)  # not t.__name__, which a metaclass could fake
    return name if type(name) is str else "?"


_PLAIN = (int, float, complex, str, bytes, list, tuple, dict, set, frozenset)  # bool cannot be subclassed


class Handle:
    """What a handle decodes to when the receiver gives no `handle=` factory: its kind, number and class name."""

    __slots__ = ("kind", "number", "typename")

    def __init__(self, kind: str, number: int, typename: str):
        self.kind, self.number, self.typename = kind, number, typename

    def __repr__(self) -> str:
        return f"Handle({self.kind!r}, {self.number}, {self.typename!r})"


def encode(value: object, limit: int = MAX_BYTES, subclasses: bool = False, handles=None, convert=None) -> bytes:
    """The encoding of `value`; raises NotPlainData when it is not plain data or is over `limit` bytes.

    With `subclasses=True` (what the solution's side sends back, for honest code's sake: an IntEnum
    member, a class of its own derived from Counter), an instance of a subclass of a plain or value type
    is encoded as that type's value, read through the type's own methods. That is no concession to the
    solution: it could send any plain data anyway, and the decoder still builds its own objects only.
    `handles(x) -> (kind, number, typename)`, when given, sends what is neither as a handle (and may
    raise NotPlainData itself). `convert(x) -> (value,) | None`, when given, is asked first: a scalar it
    gives (None, bool, int, float, complex, str, bytes, by exact type) is sent instead (the solution's
    side turns a numpy scalar into its Python value, as `numpy.int64(3) == 3` holds under a plain
    harness); the decoder is unchanged, it builds its own objects from bytes as ever."""
    encoder = _Encoder(limit, subclasses, handles, convert)
    encoder.enc(value, 0)
    return b"".join(encoder.out)


class _Encoder:
    def __init__(self, limit: int, subclasses: bool, handles, convert=None) -> None:
        self.limit, self.subclasses, self.handles, self.convert = limit, subclasses, handles, convert
        self.out: list[bytes] = []
        self.size = 0

    def put(self, b: bytes) -> None:
        self.size += len(b)
        if self.size > self.limit:
            raise NotPlainData(f"more than {self.limit} bytes")
        self.out.append(b)

    def enc(self, x: object, depth: int) -> None:
        t = type(x)
        if t not in _PLAIN and t is not bool and x is not None:
            name = values.value_type(t, self.subclasses)
            if name is not None:
                return self.value(name, x, depth)
            if self.subclasses:
                base = next((b for b in _PLAIN if issubclass(t, b)), None)
                if base is not None:
                    t, x = base, _as_base(base, x)
        if x is None:
            self.put(_NONE)
        elif t is bool:
            self.put(_TRUE if x else _FALSE)
        elif t is int:
            n = int.__index__(x)  # type: ignore[arg-type]
            raw = n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True)
            self.put(_INT + _LEN.pack(len(raw)) + raw)
        elif t is float:
            self.put(_FLOAT_T + _FLOAT.pack(x))
        elif t is complex:
            self.put(
                _COMPLEX_T + _COMPLEX.pack(complex.__getattribute__(x, "real"), complex.__getattribute__(x, "imag"))
            )  # type: ignore[arg-type]
        elif t is str:
            self.sized(_STR, str.encode(x, "utf-8", "surrogatepass"))  # type: ignore[arg-type]
        elif t is bytes:
            self.sized(_BYTES, bytes(x))  # type: ignore[arg-type]
        elif t in (list, tuple, set, frozenset, dict):
            self.container(t, x, depth)
        elif (
            self.convert is not None
            and type(converted := self.convert(x)) is tuple
            and len(converted) == 1
            and (converted[0] is None or type(converted[0]) in (bool, int, float, complex, str, bytes))
        ):
            self.enc(converted[0], depth + 1)
        elif self.handles is not None:
            kind, number, typename = self.handles(x)
            self.sized(_HANDLE, str.encode(f"{kind} {typename}"[:200], "utf-8", "replace"))
            self.enc(int(number), depth + 1)
        else:
            raise NotPlainData(f"a {_type_name(t)} is not plain data")

    def sized(self, tag: bytes, raw: bytes) -> None:
        self.put(tag + _LEN.pack(len(raw)))
        self.put(raw)

    def value(self, name: str, x: object, depth: int) -> None:
        if depth >= MAX_DEPTH:
            raise NotPlainData(f"containers nested more than {MAX_DEPTH} deep")
        try:
            payload = values.payload(name, x)
        except values.Unencodable as exc:
            raise NotPlainData(str(exc)) from None
        self.sized(_VALUE, str.encode(name, "utf-8"))
        self.enc(payload, depth + 1)

    def container(self, t: type, x: object, depth: int) -> None:
        if depth >= MAX_DEPTH:
            raise NotPlainData(f"containers nested more than {MAX_DEPTH} deep")
        tag = {list: _LIST, tuple: _TUPLE, set: _SET, frozenset: _FROZENSET, dict: _DICT}[t]
        if t is dict:
            items = list(dict.items(x))  # type: ignore[arg-type]
            self.put(tag + _LEN.pack(len(items)))
            for k, v in items:
                self.enc(k, depth + 1)
                self.enc(v, depth + 1)
        else:
            members = list(t.__iter__(x))  # the builtin iterator, never an override
            self.put(tag + _LEN.pack(len(members)))
            for m in members:
                self.enc(m, depth + 1)


def _as_base(base: type, x: object) -> object:
    """A subclass's value read through its plain base type's own methods."""
    if base is float:
        return float.__float__(x)  # type: ignore[arg-type]
    if base is str:
        return str.__str__(x)  # type: ignore[arg-type]
    if base is bytes:
        return bytes(memoryview(x))  # type: ignore[arg-type]
    return x


def decode(data: bytes, handle=None) -> object:
    """Fresh objects of the receiver's own making from an encoding; raises WireError on anything
    malformed. `handle(kind, number, typename)` makes what a handle stands for (default: a `Handle`)."""
    if type(data) is not bytes:
        data = bytes(data)
    if len(data) > MAX_BYTES:
        raise WireError(f"message of {len(data)} bytes is over the limit of {MAX_BYTES}")
    decoder = _Decoder(data, handle)
    value = decoder.dec(0)
    if decoder.pos != len(data):
        raise WireError("trailing bytes after the value")
    return value


class _Decoder:
    def __init__(self, data: bytes, handle) -> None:
        self.view, self.end, self.pos, self.handle = memoryview(data), len(data), 0, handle

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > self.end:
            raise WireError("truncated message")
        chunk = self.view[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def length(self) -> int:
        return _LEN.unpack(self.take(4))[0]

    def text(self, what: str) -> str:
        try:
            return str(self.take(self.length()), "utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise WireError(f"bad {what}: {exc}") from None

    def dec(self, depth: int) -> object:
        tag = bytes(self.take(1))
        if tag in _SIMPLE:
            return _SIMPLE[tag]
        if tag == _INT:
            return int.from_bytes(self.take(self.length()), "big", signed=True)
        if tag == _FLOAT_T:
            return _FLOAT.unpack(self.take(8))[0]
        if tag == _COMPLEX_T:
            real, imag = _COMPLEX.unpack(self.take(16))
            return complex(real, imag)
        if tag == _STR:
            return self.text("string")
        if tag == _BYTES:
            return bytes(self.take(self.length()))
        if tag in (_LIST, _TUPLE, _SET, _FROZENSET, _DICT):
            return self.container(tag, depth)
        if tag == _VALUE:
            return self.value(depth)
        if tag == _HANDLE:
            kind, _, typename = self.text("handle").partition(" ")
            number = self.dec(depth + 1)
            if type(number) is not int or kind not in ("obj", "iter", "builtin", "cb"):
                raise WireError("bad handle")
            return self.handle(kind, number, typename) if self.handle is not None else Handle(kind, number, typename)
        raise WireError(f"unknown tag {tag!r}")

    def container(self, tag: bytes, depth: int) -> object:
        if depth >= MAX_DEPTH:
            raise WireError(f"containers nested more than {MAX_DEPTH} deep")
        n = self.length()
        if n > self.end - self.pos:  # every member takes at least one byte
            raise WireError("truncated message")
        try:
            if tag == _DICT:
                out: dict = {}
                for _ in range(n):
                    k = self.dec(depth + 1)
                    out[k] = self.dec(depth + 1)
                return out
            members = [self.dec(depth + 1) for _ in range(n)]
            return {_LIST: list, _TUPLE: tuple, _SET: set, _FROZENSET: frozenset}[tag](members)
        except TypeError as exc:  # an unhashable key or member
            raise WireError(f"bad container: {exc}") from None

    def value(self, depth: int) -> object:
        name = self.text("value type name")
        if depth >= MAX_DEPTH:
            raise WireError(f"containers nested more than {MAX_DEPTH} deep")
        payload = self.dec(depth + 1)
        try:
            return values.build(name, payload)
        except Exception as exc:  # the receiver's own constructor refused the payload
            raise WireError(f"bad {name[:40]} payload: {type(exc).__name__}: {str(exc)[:80]}") from None


_SIMPLE = {_NONE: None, _TRUE: True, _FALSE: False}


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def send(fd: int, value: object) -> None:
    """Encode `value` and write it as one frame (raises NotPlainData before writing anything)."""
    send_encoded(fd, encode(value))


def send_encoded(fd: int, payload: bytes) -> None:
    """Write an already encoded value as one frame."""
    data = memoryview(_LEN.pack(len(payload)) + payload)
    while data:
        data = data[os.write(fd, data) :]


def recv(fd: int, handle=None) -> object:
    """Read one frame and decode it (`handle` as for `decode`). Raises ChannelClosed at end of file (also
    in mid-frame) and WireError for a frame that is too long or malformed."""
    header = _read_exact(fd, 4)
    if header is None:
        raise ChannelClosed("the other end closed the channel")
    n = _LEN.unpack(header)[0]
    if n > MAX_BYTES:
        raise WireError(f"frame of {n} bytes is over the limit of {MAX_BYTES}")
    payload = _read_exact(fd, n)
    if payload is None:
        raise ChannelClosed("the other end closed the channel in mid-message")
    return decode(payload, handle)
