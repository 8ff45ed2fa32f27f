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

Anything else (an object of the solution's own class, an iterator, a generator) can cross only as a
*handle* when the sender asks for it (`handles=`): its kind, a number and its class's name, nothing
more. The receiver makes of it what it chooses (`decode(..., handle=)`): J a proxy that asks S to act on
the object, compared by identity only; S the object the number names. A message is at most MAX_BYTES
long; a malformed one, a truncated one, an unknown tag, trailing bytes, too deep a nesting or an
unhashable dict key or set member raise `WireError`.

Hand-written because nothing in the standard library fits: `pickle` and `marshal` rebuild arbitrary
objects (pickle runs code), and `json` loses types (tuples, bytes, sets, int keys, nan). Stdlib only:
the sandbox server imports this module by path (`python -I -S`).

Frame: 4-byte big-endian length, then the encoded value.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import os
import struct
import uuid

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


# -- the standard library's value types ---------------------------------------------------------------
# name: (class, payload(x) -> plain data read through the class's own accessors, build(payload) -> a
# fresh object made by the receiver's own constructor, which checks the payload's types).


def _ints(p: object, n: int) -> tuple:
    if type(p) is not tuple or len(p) != n or not all(type(v) is int for v in p):
        raise WireError(f"bad value payload {type(p).__name__}")
    return p


def _zone(p: object):
    if p is None:
        return None
    if type(p) is tuple and len(p) == 3 and p[0] == "offset" and type(p[1]) is int and (p[2] is None or type(p[2]) is str):
        delta = datetime.timedelta(seconds=p[1])
        return datetime.timezone(delta, p[2]) if p[2] is not None else datetime.timezone(delta)
    if type(p) is tuple and len(p) == 2 and p[0] == "zone" and type(p[1]) is str:
        import zoneinfo

        return zoneinfo.ZoneInfo(p[1])  # keys are names under the time zone data folders only (ZoneInfo refuses paths)
    raise WireError("bad time zone payload")


def _zone_payload(tz: object) -> object:
    if tz is None:
        return None
    if type(tz) is datetime.timezone:
        delta = tz.utcoffset(None)
        name = tz.tzname(None)
        return ("offset", int(delta.total_seconds()), None if name == datetime.timezone(delta).tzname(None) else name)
    key = getattr(tz, "key", None)  # zoneinfo.ZoneInfo
    if type(key) is str:
        return ("zone", key)
    raise NotPlainData(f"a {_type_name(type(tz))} time zone is not plain data")


def _date(p):
    return datetime.date(*_ints(p, 3))


def _time(p):
    if type(p) is not tuple or len(p) != 6:
        raise WireError("bad time payload")
    return datetime.time(*_ints(p[:4], 4), tzinfo=_zone(p[5]), fold=_ints((p[4],), 1)[0])


def _datetime(p):
    if type(p) is not tuple or len(p) != 9:
        raise WireError("bad datetime payload")
    return datetime.datetime(*_ints(p[:7], 7), tzinfo=_zone(p[8]), fold=_ints((p[7],), 1)[0])


_FACTORIES = {"list": list, "int": int, "set": set, "dict": dict, "str": str, "float": float, "tuple": tuple, "frozenset": frozenset, "bool": bool}


def _defaultdict(p: object):
    """A defaultdict whose factory is a builtin type named in the payload (another factory: none)."""
    if type(p) is not tuple or len(p) != 2 or not (p[0] is None or type(p[0]) is str and p[0] in _FACTORIES):
        raise WireError("bad defaultdict payload")
    return collections.defaultdict(_FACTORIES.get(p[0]) if p[0] is not None else None, _pairs(dict, p[1]))


def _factory_name(factory: object) -> str | None:
    return next((name for name, cls in _FACTORIES.items() if factory is cls), None)


def _uuid(p: object):
    if type(p) is not bytes or len(p) != 16:
        raise WireError("bad UUID payload")
    return uuid.UUID(bytes=p)


def _typed(cls, p, kind):
    if type(p) is not kind:
        raise WireError(f"bad {cls.__name__} payload")
    return cls(p)


_NAMEDTUPLES: dict = {}


def _namedtuple(p: object):
    if (type(p) is not tuple or len(p) != 3 or type(p[0]) is not str or type(p[1]) is not tuple or type(p[2]) is not tuple
            or not all(type(f) is str for f in p[1]) or len(p[1]) != len(p[2])):
        raise WireError("bad namedtuple payload")
    key = (p[0], p[1])
    cls = _NAMEDTUPLES.get(key)
    if cls is None:
        try:
            cls = collections.namedtuple(p[0], p[1])  # a class of the receiver's own making, from names only
        except (ValueError, TypeError) as exc:
            raise WireError(f"bad namedtuple: {exc}") from None
        if len(_NAMEDTUPLES) < 1024:
            _NAMEDTUPLES[key] = cls
    return cls(*p[2])


def _decimal(p: object):
    if type(p) is not str or len(p) > 10000:
        raise WireError("bad Decimal payload")
    try:
        return decimal.Decimal(p)
    except decimal.InvalidOperation:
        raise WireError("bad Decimal payload") from None


def _fraction(p: object):
    num, den = _ints(p, 2)
    if den <= 0:
        raise WireError("bad Fraction payload")
    return fractions.Fraction(num, den)


def _deque(p: object):
    if type(p) is not tuple or len(p) != 2 or type(p[0]) is not list or not (p[1] is None or type(p[1]) is int and p[1] >= 0):
        raise WireError("bad deque payload")
    return collections.deque(p[0], p[1])


def _pairs(cls, p: object):
    """A mapping of class `cls` from a list of (key, value) pairs, in their order."""
    if type(p) is not list or not all(type(kv) is tuple and len(kv) == 2 for kv in p):
        raise WireError(f"bad {cls.__name__} payload")
    out = cls()
    for k, v in p:
        dict.__setitem__(out, k, v) if cls is not collections.OrderedDict else out.__setitem__(k, v)
    return out


VALUE_TYPES: dict[str, tuple[type, object, object]] = {
    "Fraction": (fractions.Fraction, lambda x: (fractions.Fraction.numerator.__get__(x), fractions.Fraction.denominator.__get__(x)), _fraction),
    "Decimal": (decimal.Decimal, lambda x: decimal.Decimal.__str__(x), _decimal),
    "datetime": (datetime.datetime, lambda x: (x.year, x.month, x.day, x.hour, x.minute, x.second, x.microsecond, x.fold, _zone_payload(x.tzinfo)), _datetime),
    "date": (datetime.date, lambda x: (x.year, x.month, x.day), _date),
    "time": (datetime.time, lambda x: (x.hour, x.minute, x.second, x.microsecond, x.fold, _zone_payload(x.tzinfo)), _time),
    "timedelta": (datetime.timedelta, lambda x: (x.days, x.seconds, x.microseconds), lambda p: datetime.timedelta(*_ints(p, 3))),
    "timezone": (datetime.timezone, _zone_payload, _zone),
    "deque": (collections.deque, lambda x: (list(collections.deque.__iter__(x)), x.maxlen), _deque),
    "Counter": (collections.Counter, lambda x: list(dict.items(x)), lambda p: _pairs(collections.Counter, p)),
    "OrderedDict": (collections.OrderedDict, lambda x: list(collections.OrderedDict.items(x)), lambda p: _pairs(collections.OrderedDict, p)),
    "defaultdict": (collections.defaultdict, lambda x: (_factory_name(x.default_factory), list(dict.items(x))), _defaultdict),
    "range": (range, lambda x: (x.start, x.stop, x.step), lambda p: range(*_ints(p, 3))),
    "bytearray": (bytearray, lambda x: bytes(x), lambda p: _typed(bytearray, p, bytes)),
    "UUID": (uuid.UUID, lambda x: uuid.UUID.bytes.__get__(x), _uuid),
}
_VALUE_BY_TYPE = {cls: name for name, (cls, _, _) in VALUE_TYPES.items()}


def _zoneinfo_class():
    try:
        import zoneinfo

        return zoneinfo.ZoneInfo
    except ImportError:  # pragma: no cover
        return None


def _value_type(t: type, subclasses: bool) -> str | None:
    """The VALUE_TYPES name for an object of class `t`: its own class, or (with `subclasses`) the first
    of its bases that is one; a named tuple (a tuple subclass with `_fields`) is "namedtuple"."""
    if t in _VALUE_BY_TYPE:
        return _VALUE_BY_TYPE[t]
    zone = _zoneinfo_class()
    if zone is not None and (t is zone or subclasses and issubclass(t, zone)):
        return "ZoneInfo"
    if subclasses or t.__module__ != "builtins":
        fields = getattr(t, "_fields", None)
        if issubclass(t, tuple) and type(fields) is tuple and all(type(f) is str for f in fields) and t is not tuple:
            return "namedtuple"
    if subclasses:
        for base in t.__mro__[1:]:
            if base in _VALUE_BY_TYPE:
                return _VALUE_BY_TYPE[base]
    return None


class Handle:
    """What a handle decodes to when the receiver gives no `handle=` factory: its kind, number and class name."""

    __slots__ = ("kind", "number", "typename")

    def __init__(self, kind: str, number: int, typename: str):
        self.kind, self.number, self.typename = kind, number, typename

    def __repr__(self) -> str:
        return f"Handle({self.kind!r}, {self.number}, {self.typename!r})"


def encode(value: object, limit: int = MAX_BYTES, subclasses: bool = False, handles=None) -> bytes:
    """The encoding of `value`; raises NotPlainData when it is not plain data or is over `limit` bytes.

    With `subclasses=True` (what the solution's side sends back, for honest code's sake: an IntEnum
    member, a class of its own derived from Counter), an instance of a subclass of a plain or value type
    is encoded as that type's value, read through the type's own methods. That is no concession to the
    solution: it could send any plain data anyway, and the decoder still builds its own objects only.
    `handles(x) -> (kind, number, typename)`, when given, sends what is neither as a handle (and may
    raise NotPlainData itself)."""
    out: list[bytes] = []
    size = [0]

    def put(b: bytes) -> None:
        size[0] += len(b)
        if size[0] > limit:
            raise NotPlainData(f"more than {limit} bytes")
        out.append(b)

    def enc(x: object, depth: int) -> None:
        t = type(x)
        if t not in _PLAIN and t is not bool and x is not None and (name := _value_type(t, subclasses)) is not None:
            if depth >= MAX_DEPTH:
                raise NotPlainData(f"containers nested more than {MAX_DEPTH} deep")
            if name == "namedtuple":
                payload = (type.__dict__["__name__"].__get__(t), tuple(str.__str__(f) for f in t._fields), tuple(tuple.__iter__(x)))
            elif name == "ZoneInfo":
                payload = _zone_payload(x)
            else:
                payload = VALUE_TYPES[name][1](x)
            raw = str.encode(name, "utf-8")
            put(_VALUE + _LEN.pack(len(raw)))
            put(raw)
            enc(payload, depth + 1)
            return
        if subclasses and t not in _PLAIN and t is not bool and x is not None:
            base = next((b for b in _PLAIN if issubclass(t, b)), None)
            if base is not None:
                t = base
                if t is float:
                    x = float.__float__(x)  # type: ignore[arg-type]
                elif t is str:
                    x = str.__str__(x)  # type: ignore[arg-type]
                elif t is bytes:
                    x = bytes(memoryview(x))  # type: ignore[arg-type]
        if x is None:
            put(_NONE)
        elif t is bool:
            put(_TRUE if x else _FALSE)
        elif t is int:
            n = int.__index__(x)  # type: ignore[arg-type]
            raw = n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True)
            put(_INT + _LEN.pack(len(raw)) + raw)
        elif t is float:
            put(_FLOAT_T + _FLOAT.pack(x))
        elif t is complex:
            put(_COMPLEX_T + _COMPLEX.pack(complex.__getattribute__(x, "real"), complex.__getattribute__(x, "imag")))  # type: ignore[arg-type]
        elif t is str:
            raw = str.encode(x, "utf-8", "surrogatepass")  # type: ignore[arg-type]
            put(_STR + _LEN.pack(len(raw)))
            put(raw)
        elif t is bytes:
            put(_BYTES + _LEN.pack(len(x)))  # type: ignore[arg-type]
            put(bytes(x))  # type: ignore[arg-type]
        elif t in (list, tuple, set, frozenset, dict):
            if depth >= MAX_DEPTH:
                raise NotPlainData(f"containers nested more than {MAX_DEPTH} deep")
            tag = {list: _LIST, tuple: _TUPLE, set: _SET, frozenset: _FROZENSET, dict: _DICT}[t]
            if t is dict:
                items = list(dict.items(x))  # type: ignore[arg-type]
                put(tag + _LEN.pack(len(items)))
                for k, v in items:
                    enc(k, depth + 1)
                    enc(v, depth + 1)
            else:
                members = list(t.__iter__(x))  # the builtin iterator, never an override
                put(tag + _LEN.pack(len(members)))
                for m in members:
                    enc(m, depth + 1)
        elif handles is not None:
            kind, number, typename = handles(x)
            raw = str.encode(f"{kind} {typename}"[:200], "utf-8", "replace")
            put(_HANDLE + _LEN.pack(len(raw)))
            put(raw)
            enc(int(number), depth + 1)
        else:
            raise NotPlainData(f"a {_type_name(t)} is not plain data")

    enc(value, 0)
    return b"".join(out)


def decode(data: bytes, handle=None) -> object:
    """Fresh objects of the receiver's own making from an encoding; raises WireError on anything
    malformed. `handle(kind, number, typename)` makes what a handle stands for (default: a `Handle`)."""
    if type(data) is not bytes:
        data = bytes(data)
    if len(data) > MAX_BYTES:
        raise WireError(f"message of {len(data)} bytes is over the limit of {MAX_BYTES}")
    view = memoryview(data)
    end = len(data)
    pos = 0

    def take(n: int) -> memoryview:
        nonlocal pos
        if n < 0 or pos + n > end:
            raise WireError("truncated message")
        chunk = view[pos : pos + n]
        pos += n
        return chunk

    def length() -> int:
        return _LEN.unpack(take(4))[0]

    def dec(depth: int) -> object:
        tag = bytes(take(1))
        if tag == _NONE:
            return None
        if tag == _TRUE:
            return True
        if tag == _FALSE:
            return False
        if tag == _INT:
            return int.from_bytes(take(length()), "big", signed=True)
        if tag == _FLOAT_T:
            return _FLOAT.unpack(take(8))[0]
        if tag == _COMPLEX_T:
            real, imag = _COMPLEX.unpack(take(16))
            return complex(real, imag)
        if tag == _STR:
            try:
                return str(take(length()), "utf-8", "surrogatepass")
            except UnicodeDecodeError as exc:
                raise WireError(f"bad string: {exc}") from None
        if tag == _BYTES:
            return bytes(take(length()))
        if tag in (_LIST, _TUPLE, _SET, _FROZENSET, _DICT):
            if depth >= MAX_DEPTH:
                raise WireError(f"containers nested more than {MAX_DEPTH} deep")
            n = length()
            if n > end - pos:  # every member takes at least one byte
                raise WireError("truncated message")
            try:
                if tag == _DICT:
                    out: dict = {}
                    for _ in range(n):
                        k = dec(depth + 1)
                        out[k] = dec(depth + 1)
                    return out
                members = [dec(depth + 1) for _ in range(n)]
                if tag == _LIST:
                    return members
                if tag == _TUPLE:
                    return tuple(members)
                if tag == _SET:
                    return set(members)
                return frozenset(members)
            except TypeError as exc:  # an unhashable key or member
                raise WireError(f"bad container: {exc}") from None
        if tag == _VALUE:
            try:
                name = str(take(length()), "utf-8")
            except UnicodeDecodeError:
                raise WireError("bad value type name") from None
            if depth >= MAX_DEPTH:
                raise WireError(f"containers nested more than {MAX_DEPTH} deep")
            payload = dec(depth + 1)
            try:
                if name == "namedtuple":
                    return _namedtuple(payload)
                if name == "ZoneInfo":
                    return _zone(payload)
                if name not in VALUE_TYPES:
                    raise WireError(f"unknown value type {name[:40]!r}")
                return VALUE_TYPES[name][2](payload)
            except WireError:
                raise
            except Exception as exc:  # the receiver's own constructor refused the payload
                raise WireError(f"bad {name[:40]} payload: {type(exc).__name__}") from None
        if tag == _HANDLE:
            try:
                kind, _, typename = str(take(length()), "utf-8").partition(" ")
            except UnicodeDecodeError:
                raise WireError("bad handle") from None
            number = dec(depth + 1)
            if type(number) is not int or kind not in ("obj", "iter"):
                raise WireError("bad handle")
            return handle(kind, number, typename) if handle is not None else Handle(kind, number, typename)
        raise WireError(f"unknown tag {tag!r}")

    value = dec(0)
    if pos != end:
        raise WireError("trailing bytes after the value")
    return value


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
