"""Plain data across the sandbox's trust boundary: a strict tagged encoding and its framing.

The judge (J) and the solution (S) run in separate processes and talk only through a socket carrying
messages encoded here. The encoding carries exactly these types, each checked by *exact* type
(`type(x) is int`, bool before int; subclasses are refused, unless the sender asks to send them as
their base type, see `encode`):

    None, bool, int, float (nan, inf and -0.0 included), complex, str, bytes,
    list, tuple, dict, set, frozenset  (of the above, nested at most MAX_DEPTH deep)

so whatever S sends, J's own decoder builds fresh builtin objects from bytes: no object of the
solution's making (an `__eq__` that always says yes, an int subclass, a lazy proxy) ever reaches a
comparison in J. A message is at most MAX_BYTES long; a malformed one, a truncated one, an unknown tag,
trailing bytes, too deep a nesting or an unhashable dict key or set member raise `WireError`.

Hand-written because nothing in the standard library fits: `pickle` and `marshal` rebuild arbitrary
objects (pickle runs code), and `json` loses types (tuples, bytes, sets, int keys, nan). Stdlib only:
the sandbox server imports this module by path (`python -I -S`).

Frame: 4-byte big-endian length, then the encoded value.
"""

from __future__ import annotations

import os
import struct

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


def encode(value: object, limit: int = MAX_BYTES, subclasses: bool = False) -> bytes:
    """The encoding of `value`; raises NotPlainData when it is not plain data or is over `limit` bytes.

    With `subclasses=True` (what the solution's side sends back, for honest code's sake: a Counter,
    a namedtuple, an IntEnum member), an instance of a subclass of a plain type is encoded as its base
    type's value, read through the base type's own methods. That is no concession to the solution: it
    could send any plain data anyway, and the decoder still builds exact builtin types only."""
    out: list[bytes] = []
    size = [0]

    def put(b: bytes) -> None:
        size[0] += len(b)
        if size[0] > limit:
            raise NotPlainData(f"more than {limit} bytes")
        out.append(b)

    def enc(x: object, depth: int) -> None:
        t = type(x)
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
        else:
            raise NotPlainData(f"a {_type_name(t)} is not plain data")

    enc(value, 0)
    return b"".join(out)


def decode(data: bytes) -> object:
    """Fresh builtin objects from an encoding; raises WireError on anything malformed."""
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


def recv(fd: int) -> object:
    """Read one frame and decode it. Raises ChannelClosed at end of file (also in mid-frame) and
    WireError for a frame that is too long or malformed."""
    header = _read_exact(fd, 4)
    if header is None:
        raise ChannelClosed("the other end closed the channel")
    n = _LEN.unpack(header)[0]
    if n > MAX_BYTES:
        raise WireError(f"frame of {n} bytes is over the limit of {MAX_BYTES}")
    payload = _read_exact(fd, n)
    if payload is None:
        raise ChannelClosed("the other end closed the channel in mid-message")
    return decode(payload)
