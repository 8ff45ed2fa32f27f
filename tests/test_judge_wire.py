"""The plain-data channel between the solution's process and the judge: exact types only, fresh objects,
bounded size and depth, and every malformed message refused (no sandbox needed)."""

from __future__ import annotations

import math
import os
import struct

import pytest

from regimen.stages.sandbox import wire


PLAIN = [
    None, True, False, 0, 1, -1, 2**100, -(2**100), 255, -256, 0.0, -0.0, 1.5, math.inf, -math.inf, 1e-300, 3 + 4j,
    "", "héllo", "\ud800 lone surrogate", b"", b"\x00\xff", [], (), {}, set(), frozenset(),
    [1, [2, (3, {4: {5}})]], {"a": [1, 2], 3: (4, None), (1, 2): frozenset({b"x"}), None: True, 2.5: "f"},
]


@pytest.mark.parametrize("value", PLAIN, ids=repr)
def test_plain_data_round_trips_with_exact_types(value):
    back = wire.decode(wire.encode(value))
    assert back == value and type(back) is type(value)

    def types(x):
        if isinstance(x, (list, tuple, set, frozenset)):
            return (type(x), [types(m) for m in sorted(x, key=repr)] if isinstance(x, (set, frozenset)) else [types(m) for m in x])
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

    for value in (Int(3), Str("x"), List([1]), Anything(), [Anything()], {"k": Int(1)}, {Int(1): 2}, iter([1]), range(3),
                  bytearray(b"x"), memoryview(b"x"), print, type, object(), Ellipsis, NotImplemented):
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
    """What the solution's side sends back: a subclass of a plain type as its base type's value, read
    through the base type's own methods (its overrides are never called); the decoder still builds
    exact builtin types. The judge's side never asks for this."""
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
    value = [collections.Counter("aab"), collections.defaultdict(list, {1: [2]}), P(1, 2), Level.HIGH, Liar("s"), Long(b"b"), Items(a=1), {Level.HIGH: (P(3, 4),)}]
    back = wire.decode(wire.encode(value, subclasses=True))
    assert back == [{"a": 2, "b": 1}, {1: [2]}, (1, 2), 3, "s", b"b", {"a": 1}, {3: ((3, 4),)}]
    assert [type(x) for x in back] == [dict, dict, tuple, int, str, bytes, dict, dict]
    assert type(back[7][3][0]) is tuple
    with pytest.raises(wire.NotPlainData):
        wire.encode(value)
    for not_plain in (iter([1]), collections.deque([1]), object(), range(2)):
        with pytest.raises(wire.NotPlainData):
            wire.encode(not_plain, subclasses=True)
