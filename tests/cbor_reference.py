# An RFC 8949 section 4.2.1 encoder written from the RFC alone, for the tests to
# check sessionstore.canonical against: no cbor2 anywhere in it.
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


def _float(value: float) -> bytes:
    if math.isnan(value):
        return b"\xf9\x7e\x00"
    for info, fmt in ((25, ">e"), (26, ">f")):
        try:
            packed = struct.pack(fmt, value)
        except (OverflowError, struct.error):
            continue
        if struct.unpack(fmt, packed)[0] == value:
            return bytes([0xE0 | info]) + packed
    return b"\xfb" + struct.pack(">d", value)


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
