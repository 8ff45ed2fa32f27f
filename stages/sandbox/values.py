"""The standard library's value types that cross the sandbox's channel (`wire.py`), each as its name and
its data in plain types: how a sender reads that data (through the type's own accessors, never an
override of a subclass's) and how a receiver builds a fresh object of its own from it (its own
constructors, which check the payload's types). Stdlib only: the server imports it by path.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import uuid


class PayloadError(ValueError):
    """A payload a receiver's constructor cannot take."""


class Unencodable(ValueError):
    """A value of a value type whose data has no plain form (a time zone of another kind)."""


def _type_name(t: type) -> str:
    name = type.__dict__["__name__"].__get__(t)  # not t.__name__, which a metaclass could fake
    return name if type(name) is str else "?"


# name: (class, payload(x) -> plain data read through the class's own accessors, build(payload) -> a
# fresh object made by the receiver's own constructor, which checks the payload's types).


def _ints(p: object, n: int) -> tuple:
    if type(p) is not tuple or len(p) != n or not all(type(v) is int for v in p):
        raise PayloadError(f"bad value payload {type(p).__name__}")
    return p


def _zone(p: object):
    if p is None:
        return None
    if (
        type(p) is tuple
        and len(p) == 3
        and p[0] == "offset"
        and type(p[1]) is int
        and (p[2] is None or type(p[2]) is str)
    ):
        delta = datetime.timedelta(seconds=p[1])
        return datetime.timezone(delta, p[2]) if p[2] is not None else datetime.timezone(delta)
    if type(p) is tuple and len(p) == 2 and p[0] == "zone" and type(p[1]) is str:
        import zoneinfo

        return zoneinfo.ZoneInfo(p[1])  # keys are names under the time zone data folders only (ZoneInfo refuses paths)
    raise PayloadError("bad time zone payload")


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
    raise Unencodable(f"a {_type_name(type(tz))} time zone is not plain data")


def _date(p):
    return datetime.date(*_ints(p, 3))


def _time(p):
    if type(p) is not tuple or len(p) != 6:
        raise PayloadError("bad time payload")
    return datetime.time(*_ints(p[:4], 4), tzinfo=_zone(p[5]), fold=_ints((p[4],), 1)[0])


def _datetime(p):
    if type(p) is not tuple or len(p) != 9:
        raise PayloadError("bad datetime payload")
    return datetime.datetime(*_ints(p[:7], 7), tzinfo=_zone(p[8]), fold=_ints((p[7],), 1)[0])


_FACTORIES = {
    "list": list,
    "int": int,
    "set": set,
    "dict": dict,
    "str": str,
    "float": float,
    "tuple": tuple,
    "frozenset": frozenset,
    "bool": bool,
}


def _defaultdict(p: object):
    """A defaultdict whose factory is a builtin type named in the payload (another factory: none)."""
    if type(p) is not tuple or len(p) != 2 or not (p[0] is None or type(p[0]) is str and p[0] in _FACTORIES):
        raise PayloadError("bad defaultdict payload")
    return collections.defaultdict(_FACTORIES.get(p[0]) if p[0] is not None else None, _pairs(dict, p[1]))


def _factory_name(factory: object) -> str | None:
    return next((name for name, cls in _FACTORIES.items() if factory is cls), None)


def _uuid(p: object):
    if type(p) is not bytes or len(p) != 16:
        raise PayloadError("bad UUID payload")
    return uuid.UUID(bytes=p)


def _typed(cls, p, kind):
    if type(p) is not kind:
        raise PayloadError(f"bad {cls.__name__} payload")
    return cls(p)


_NAMEDTUPLES: dict = {}


def _namedtuple(p: object):
    if (
        type(p) is not tuple
        or len(p) != 3
        or type(p[0]) is not str
        or type(p[1]) is not tuple
        or type(p[2]) is not tuple
        or not all(type(f) is str for f in p[1])
        or len(p[1]) != len(p[2])
    ):
        raise PayloadError("bad namedtuple payload")
    key = (p[0], p[1])
    cls = _NAMEDTUPLES.get(key)
    if cls is None:
        try:
            cls = collections.namedtuple(p[0], p[1])  # a class of the receiver's own making, from names only
        except (ValueError, TypeError) as exc:
            raise PayloadError(f"bad namedtuple: {exc}") from None
        if len(_NAMEDTUPLES) < 1024:
            _NAMEDTUPLES[key] = cls
    return cls(*p[2])


def _decimal(p: object):
    if type(p) is not str or len(p) > 10000:
        raise PayloadError("bad Decimal payload")
    try:
        return decimal.Decimal(p)
    except decimal.InvalidOperation:
        raise PayloadError("bad Decimal payload") from None


def _fraction(p: object):
    num, den = _ints(p, 2)
    if den <= 0:
        raise PayloadError("bad Fraction payload")
    return fractions.Fraction(num, den)


def _deque(p: object):
    if (
        type(p) is not tuple
        or len(p) != 2
        or type(p[0]) is not list
        or not (p[1] is None or type(p[1]) is int and p[1] >= 0)
    ):
        raise PayloadError("bad deque payload")
    return collections.deque(p[0], p[1])


def _pairs(cls, p: object):
    """A mapping of class `cls` from a list of (key, value) pairs, in their order."""
    if type(p) is not list or not all(type(kv) is tuple and len(kv) == 2 for kv in p):
        raise PayloadError(f"bad {cls.__name__} payload")
    out = cls()
    for k, v in p:
        dict.__setitem__(out, k, v) if cls is not collections.OrderedDict else out.__setitem__(k, v)
    return out


VALUE_TYPES: dict[str, tuple[type, object, object]] = {
    "Fraction": (
        fractions.Fraction,
        lambda x: (fractions.Fraction.numerator.__get__(x), fractions.Fraction.denominator.__get__(x)),
        _fraction,
    ),
    "Decimal": (decimal.Decimal, lambda x: decimal.Decimal.__str__(x), _decimal),
    "datetime": (
        datetime.datetime,
        lambda x: (x.year, x.month, x.day, x.hour, x.minute, x.second, x.microsecond, x.fold, _zone_payload(x.tzinfo)),
        _datetime,
    ),
    "date": (datetime.date, lambda x: (x.year, x.month, x.day), _date),
    "time": (
        datetime.time,
        lambda x: (x.hour, x.minute, x.second, x.microsecond, x.fold, _zone_payload(x.tzinfo)),
        _time,
    ),
    "timedelta": (
        datetime.timedelta,
        lambda x: (x.days, x.seconds, x.microseconds),
        lambda p: datetime.timedelta(*_ints(p, 3)),
    ),
    "timezone": (datetime.timezone, _zone_payload, _zone),
    "deque": (collections.deque, lambda x: (list(collections.deque.__iter__(x)), x.maxlen), _deque),
    "Counter": (collections.Counter, lambda x: list(dict.items(x)), lambda p: _pairs(collections.Counter, p)),
    "OrderedDict": (
        collections.OrderedDict,
        lambda x: list(collections.OrderedDict.items(x)),
        lambda p: _pairs(collections.OrderedDict, p),
    ),
    "defaultdict": (
        collections.defaultdict,
        lambda x: (_factory_name(x.default_factory), list(dict.items(x))),
        _defaultdict,
    ),
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


def value_type(t: type, subclasses: bool) -> str | None:
    """The VALUE_TYPES name for an object of class `t`: its own class, or (with `subclasses`) the first
    of its bases that is one; a named tuple (a tuple subclass with `_fields`) is "namedtuple"."""
    if t in _VALUE_BY_TYPE:
        return _VALUE_BY_TYPE[t]
    zone = _zoneinfo_class()
    if zone is not None and (t is zone or subclasses and issubclass(t, zone)):
        return "ZoneInfo"
    if subclasses or t.__module__ != "builtins":
        fields = getattr(t, "_fields", None)  # a named tuple's documented attribute
        if issubclass(t, tuple) and type(fields) is tuple and all(type(f) is str for f in fields) and t is not tuple:
            return "namedtuple"
    if subclasses:
        for base in t.__mro__[1:]:
            if base in _VALUE_BY_TYPE:
                return _VALUE_BY_TYPE[base]
    return None


def payload(name: str, x: object) -> object:
    """The plain data of `x`, a value of VALUE_TYPES' `name` (or a named tuple, a ZoneInfo)."""
    t = type(x)
    if name == "namedtuple":
        return (
            type.__dict__["__name__"].__get__(t),
            tuple(str.__str__(f) for f in t._fields),
            tuple(tuple.__iter__(x)),
        )  # type: ignore[attr-defined]
    if name == "ZoneInfo":
        return _zone_payload(x)
    return VALUE_TYPES[name][1](x)  # type: ignore[operator]


def build(name: str, p: object) -> object:
    """A fresh object of the receiver's own making from a payload (PayloadError, or the constructor's
    own error, when it cannot take it)."""
    if name == "namedtuple":
        return _namedtuple(p)
    if name == "ZoneInfo":
        return _zone(p)
    if name not in VALUE_TYPES:
        raise PayloadError(f"unknown value type {name[:40]!r}")
    return VALUE_TYPES[name][2](p)  # type: ignore[operator]
