# An RFC 8949 section 4.2.1 encoder written from the RFC alone, for the tests to
# check sessionstore.wire.canonical against: no cbor2 anywhere in it.
#   - integers, lengths and tags in their shortest head;
#   - floats in the shortest of half, single and double precision that holds
#     the value exactly (section 4.2.2 preferred serialization), NaN as f97e00;
#   - maps sorted by the bytewise order of their keys' encodings.
from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any


def head(major: int, argument: int) -> bytes:
    if argument < 24:
        return bytes([major << 5 | argument])
    for info, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if argument < 1 << (8 * width):
            return bytes([major << 5 | info]) + argument.to_bytes(width, "big")
    raise ValueError("argument does not fit in 64 bits")


def _float_forms(value: float) -> list[bytes]:
    """Every form that holds value exactly, shortest first (NaN: f97e00 only)."""
    if math.isnan(value):
        return [b"\xf9\x7e\x00"]
    forms = []
    for info, fmt in ((25, ">e"), (26, ">f")):
        try:
            packed = struct.pack(fmt, value)
        except (OverflowError, struct.error):
            continue
        if struct.unpack(fmt, packed)[0] == value:
            forms.append(bytes([0xE0 | info]) + packed)
    return [*forms, b"\xfb" + struct.pack(">d", value)]


def _float(value: float) -> bytes:
    return _float_forms(value)[0]


def encode(value: Any) -> bytes:
    if value is False:
        return b"\xf4"
    if value is True:
        return b"\xf5"
    if value is None:
        return b"\xf6"
    if isinstance(value, int):
        if value >= 0:
            return head(0, value)
        return head(1, -1 - value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, bytes):
        return head(2, len(value)) + value
    if isinstance(value, str):
        data = value.encode("utf-8")
        return head(3, len(data)) + data
    if isinstance(value, (list, tuple)):
        return head(4, len(value)) + b"".join(encode(item) for item in value)
    if isinstance(value, Mapping):
        pairs = sorted((encode(key), encode(item)) for key, item in value.items())
        return head(5, len(pairs)) + b"".join(key + item for key, item in pairs)
    raise TypeError(f"no CBOR form for {type(value).__name__}")


# -- the same values in every other valid form, for the tests of canonicalisation --


def _loose_head(major: int, argument: int, rng: Any) -> bytes:
    """A valid head for argument, often wider than the shortest one."""
    widths = [
        width for info, width in ((24, 1), (25, 2), (26, 4), (27, 8)) if argument < 1 << (8 * width)
    ]
    if argument < 24:
        widths.insert(0, 0)
    width = rng.choice(widths)
    if width == 0:
        return bytes([major << 5 | argument])
    info = {1: 24, 2: 25, 4: 26, 8: 27}[width]
    return bytes([major << 5 | info]) + argument.to_bytes(width, "big")


def _loose_float(value: float, rng: Any) -> bytes:
    forms = _float_forms(value)
    if math.isnan(value):  # any NaN is the same value; the canonical one is f97e00
        forms.append(b"\xfb" + struct.pack(">d", value))
    return rng.choice(forms)


def loose_encode(value: Any, rng: Any) -> bytes:
    """Encode value validly but not canonically where rng says so: wide heads, wide
    floats, indefinite lengths (strings in chunks) and maps in any order."""
    if value is False or value is True or value is None:
        return encode(value)
    if isinstance(value, int):
        if value >= 0:
            return _loose_head(0, value, rng)
        return _loose_head(1, -1 - value, rng)
    if isinstance(value, float):
        return _loose_float(value, rng)
    if isinstance(value, (bytes, str)):
        major = 2 if isinstance(value, bytes) else 3
        data = value if isinstance(value, bytes) else value.encode("utf-8")
        if isinstance(value, bytes) and data and rng.random() < 0.3:
            cut = rng.randrange(len(data) + 1)
            chunks = (data[:cut], data[cut:])
            return (
                bytes([major << 5 | 31])
                + b"".join(_loose_head(major, len(chunk), rng) + chunk for chunk in chunks)
                + b"\xff"
            )
        return _loose_head(major, len(data), rng) + data
    if isinstance(value, (list, tuple)):
        items = b"".join(loose_encode(item, rng) for item in value)
        if rng.random() < 0.2:
            return b"\x9f" + items + b"\xff"
        return _loose_head(4, len(value), rng) + items
    if isinstance(value, Mapping):
        pairs = [loose_encode(key, rng) + loose_encode(item, rng) for key, item in value.items()]
        rng.shuffle(pairs)
        if rng.random() < 0.2:
            return b"\xbf" + b"".join(pairs) + b"\xff"
        return _loose_head(5, len(pairs), rng) + b"".join(pairs)
    raise TypeError(f"no CBOR form for {type(value).__name__}")
