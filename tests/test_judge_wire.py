"""The plain-data channel between the solution's process and the judge: exact types only, fresh objects,
bounded size and depth, and every malformed message refused (no sandbox needed)."""

from __future__ import annotations

import math
import os
import struct

import pytest

from regimen.stages.sandbox import wire

PLAIN = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2**100,
    -(2**100),
    255,
    -256,
    0.0,
    -0.0,
    1.5,
    math.inf,
    -math.inf,
    1e-300,
    3 + 4j,
    "",
    "héllo",
    "\ud800 lone surrogate",
    b"",
    b"\x00\xff",
    [],
    (),
    {},
    set(),
    frozenset(),
    [1, [2, (3, {4: {5}})]],
    {"a": [1, 2], 3: (4, None), (1, 2): frozenset({b"x"}), None: True, 2.5: "f"},
]


@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_plain_data_round_trips_with_exact_types(value):
    back = wire.decode(wire.encode(value))
    assert back == value and type(back) is type(value)

    def types(x):
        if isinstance(x, (list, tuple, set, frozenset)):
            return (
                type(x),
                [types(m) for m in sorted(x, key=repr)] if isinstance(x, (set, frozenset)) else [types(m) for m in x],
            )
        if isinstance(x, dict):
            return (dict, sorted((repr(k), types(v)) for k, v in x.items()))
        return type(x)

    assert types(back) == types(value)


def test_nan_and_negative_zero_survive():
    assert math.isnan(wire.decode(wire.encode(math.nan)))
    assert math.copysign(1, wire.decode(wire.encode(-0.0))) == -1


def test_subclasses_and_objects_are_refused():
    class Int(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    class Str(str):
        pass

    class List(list):
        pass

    class Anything:
        def __eq__(self, other):
            return True

    for value in (
        Int(3),
        Str("x"),
        List([1]),
        Anything(),
        [Anything()],
        {"k": Int(1)},
        {Int(1): 2},
        iter([1]),
        memoryview(b"x"),
        print,
        type,
        object(),
        Ellipsis,
        NotImplemented,
    ):
        with pytest.raises(wire.NotPlainData):
            wire.encode(value)


def test_bool_is_not_int_and_int_is_not_bool():
    assert type(wire.decode(wire.encode(True))) is bool
    assert type(wire.decode(wire.encode(1))) is int
    assert wire.encode(True) != wire.encode(1)


def test_limits():
    deep = 0
    for _ in range(wire.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(wire.NotPlainData):
        wire.encode(deep)
    ok = 0
    for _ in range(wire.MAX_DEPTH - 1):
        ok = [ok]
    assert wire.decode(wire.encode(ok)) == ok
    with pytest.raises(wire.NotPlainData):
        wire.encode("x" * (wire.MAX_BYTES + 1))
    assert len(wire.encode("x" * 100, limit=200)) < 200
    with pytest.raises(wire.NotPlainData):
        wire.encode("x" * 300, limit=200)
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(wire.NotPlainData):
        wire.encode(cyclic)


def test_malformed_messages_are_refused():
    good = wire.encode([1, "two", {3: b"4"}])
    bad = [
        b"",  # nothing
        b"?",  # unknown tag
        good[:-1],  # truncated
        good + b"N",  # trailing bytes
        b"s" + struct.pack(">I", 2) + b"\xff\xfe",  # not UTF-8
        b"l" + struct.pack(">I", 2**31) + b"N",  # a count larger than the message
        b"i" + struct.pack(">I", 100) + b"\x01",  # an int longer than the message
        b"d" + struct.pack(">I", 1) + b"l" + struct.pack(">I", 0) + b"N",  # an unhashable key
        b"S" + struct.pack(">I", 1) + b"d" + struct.pack(">I", 0),  # an unhashable member
        b"l" + struct.pack(">I", 1) * (wire.MAX_DEPTH + 1) + b"N",  # too deep (every level a one-item list)
    ]
    for data in bad:
        with pytest.raises(wire.WireError):
            wire.decode(data)


def test_framing_over_a_socket():
    import socket

    a, b = socket.socketpair()
    try:
        wire.send(a.fileno(), ("call", "add", (1, 2), {}))
        assert wire.recv(b.fileno()) == ("call", "add", (1, 2), {})
        os.write(a.fileno(), struct.pack(">I", wire.MAX_BYTES + 1))
        with pytest.raises(wire.WireError):
            wire.recv(b.fileno())
        os.write(a.fileno(), struct.pack(">I", 10) + b"N")
        a.close()
        with pytest.raises(wire.ChannelClosed):
            wire.recv(b.fileno())
    finally:
        a.close()
        b.close()


def test_subclasses_travel_as_their_base_only_when_asked():
    """What the solution's side sends back: a subclass of a plain type (or of a standard-library value
    type) as its base type's value, read through the base type's own methods (its overrides are never
    called); the decoder still builds its own objects. The judge's side never asks for this."""
    import collections
    import enum

    class Level(enum.IntEnum):
        HIGH = 3

    class Liar(str):
        def __str__(self):
            return "lie"

        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    class Long(bytes):
        def __len__(self):
            return 99

    class Items(dict):
        def items(self):
            return [("x", 1)]

    P = collections.namedtuple("P", "x y")
    value = [Level.HIGH, Liar("s"), Long(b"b"), Items(a=1), {Level.HIGH: (3, 4)}]
    back = wire.decode(wire.encode(value, subclasses=True))
    assert back == [3, "s", b"b", {"a": 1}, {3: (3, 4)}]
    assert [type(x) for x in back] == [int, str, bytes, dict, dict]
    with pytest.raises(wire.NotPlainData):
        wire.encode(value)
    for not_plain in (iter([1]), object(), print):
        with pytest.raises(wire.NotPlainData):
            wire.encode(not_plain, subclasses=True)

    # a class of the solution's own derived from a standard-library value type travels as that type
    class Tally(collections.Counter):
        def __eq__(self, other):
            return True

    back = wire.decode(wire.encode([Tally("aab"), P(1, 2)], subclasses=True))
    assert type(back[0]) is collections.Counter and back[0] == {"a": 2, "b": 1} and back[0] != {"a": 1}


VALUES = None


def _values():
    import collections
    import datetime
    import decimal
    import fractions
    import uuid
    import zoneinfo

    P = collections.namedtuple("P", "x y")
    return [
        fractions.Fraction(3, 4),
        decimal.Decimal("1.10"),
        decimal.Decimal("NaN"),
        datetime.date(2020, 1, 2),
        datetime.datetime(2020, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC),
        datetime.datetime(2020, 1, 2, tzinfo=datetime.timezone(datetime.timedelta(hours=2), "X")),
        datetime.datetime(2020, 6, 1, tzinfo=zoneinfo.ZoneInfo("UTC")),
        datetime.timedelta(days=-1, seconds=3),
        datetime.time(1, 2, 3, fold=1),
        collections.deque([1, 2], maxlen=5),
        collections.Counter("aab"),
        collections.OrderedDict(b=1, a=2),
        collections.defaultdict(list, {1: [2]}),
        P(1, 2),
        range(1, 10, 2),
        bytearray(b"ab"),
        uuid.UUID(int=5),
        [P(1, 2), {fractions.Fraction(1, 2): datetime.date(2020, 1, 1)}],
    ]


def test_standard_library_values_arrive_as_the_receivers_own_objects_of_the_same_type():
    """Fractions, decimals, dates, deques, Counters, named tuples...: built by the receiver's own
    constructors from plain data, so they compare as the test expects and keep their methods."""
    import collections
    import decimal

    for value in _values():
        back = wire.decode(wire.encode(value))
        if isinstance(value, decimal.Decimal) and value.is_nan():
            assert back.is_nan() and type(back) is decimal.Decimal
            continue
        assert back == value and type(back).__name__ == type(value).__name__, (value, back)
    assert wire.decode(wire.encode(collections.Counter("aab"))).most_common(1) == [("a", 2)]
    point = wire.decode(wire.encode(collections.namedtuple("P", "x y")(3, 4)))
    assert point.x == 3 and point == (3, 4) and type(point).__module__ != "__main__"
    assert list(wire.decode(wire.encode(collections.OrderedDict(b=1, a=2)))) == ["b", "a"]
    dd = wire.decode(wire.encode(collections.defaultdict(list)))
    dd["k"].append(1)
    assert dd == {"k": [1]}


def test_value_payloads_are_checked_by_the_receivers_constructors():
    import struct

    def value(name: str, payload) -> bytes:
        raw = name.encode()
        return b"V" + struct.pack(">I", len(raw)) + raw + wire.encode(payload)

    for name, payload in [
        ("Fraction", (1, 0)),
        ("Fraction", (1.5, 2)),
        ("Decimal", 3),
        ("Decimal", "not a number"),
        ("date", (2020, 13, 1)),
        ("ZoneInfo", ("zone", "../../etc/passwd")),
        ("ZoneInfo", ("zone", "/etc/passwd")),
        ("namedtuple", ("P", ("x", "def"), (1, 2))),
        ("namedtuple", ("P", ("x",), (1, 2))),
        ("defaultdict", ("os.system", [])),
        ("range", (1, 2)),
        ("UUID", b"short"),
        ("nonsense", 1),
        ("deque", ([1], -1)),
    ]:
        with pytest.raises(wire.WireError):
            wire.decode(value(name, payload))


def test_handles_cross_only_when_asked_and_become_what_the_receiver_makes():
    class Thing:
        pass

    thing = Thing()
    with pytest.raises(wire.NotPlainData):
        wire.encode(thing)
    data = wire.encode([thing, {"k": thing}], handles=lambda x: ("obj", 7, type(x).__name__))
    back = wire.decode(data)
    assert isinstance(back[0], wire.Handle) and (back[0].kind, back[0].number, back[0].typename) == ("obj", 7, "Thing")
    made = {}
    back = wire.decode(data, handle=lambda kind, number, typename: made.setdefault(number, object()))
    assert back[0] is back[1]["k"] is made[7]
    with pytest.raises(wire.WireError):
        wire.decode(b"H" + struct.pack(">I", 3) + b"bad" + wire.encode(1))  # an unknown kind
