# A batch's arguments as PostgreSQL arrays in the binary wire format, built here
# in one pass each. psycopg's list dumper looks at every list afresh at every
# statement (its element type, its dimensions, a dumper for it), which cost the
# writer's thread about 70 us of CPU per batch of one save, for some twenty arrays.
#
# The format (array_recv in PostgreSQL's arrayfuncs.c): int32 dimensions (0 for an
# empty array, else 1), int32 has-nulls flag, int32 element type oid; for the one
# dimension, int32 length and int32 lower bound (1); then each element as int32
# byte length (-1 for NULL) and its bytes.
from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import adapters, pq
from psycopg.adapt import Dumper

# element oid, array oid (PostgreSQL's pg_type)
BOOL, BOOL_ARRAY = 16, 1000
BYTEA, BYTEA_ARRAY = 17, 1001
INT8, INT8_ARRAY = 20, 1016
INT4, INT4_ARRAY = 23, 1007
TEXT, TEXT_ARRAY = 25, 1009

_HEADER = struct.Struct(">iiiii")  # dimensions, has nulls, element oid, length, lower bound
_EMPTY = struct.Struct(">iii")
_LENGTH = struct.Struct(">i")
_NULL = _LENGTH.pack(-1)
_TRUE, _FALSE = b"\x00\x00\x00\x01\x01", b"\x00\x00\x00\x01\x00"


@dataclass(frozen=True, slots=True)
class PgArray:
    """An array's oid and its bytes in the binary format, as a statement's argument."""

    oid: int
    data: bytes


def _array(element: int, array: int, count: int, elements: bytes, nulls: bool) -> PgArray:
    if not count:
        return PgArray(array, _EMPTY.pack(0, 0, element))
    return PgArray(array, _HEADER.pack(1, int(nulls), element, count, 1) + elements)


def int8s(values: Sequence[int]) -> PgArray:
    count = len(values)
    packed = struct.pack(f">{'iq' * count}", *[x for value in values for x in (8, value)])
    return _array(INT8, INT8_ARRAY, count, packed, False)


def int4s(values: Sequence[int]) -> PgArray:
    count = len(values)
    packed = struct.pack(f">{'ii' * count}", *[x for value in values for x in (4, value)])
    return _array(INT4, INT4_ARRAY, count, packed, False)


def bools(values: Sequence[bool]) -> PgArray:
    packed = b"".join([_TRUE if value else _FALSE for value in values])
    return _array(BOOL, BOOL_ARRAY, len(values), packed, False)


def byteas(values: Sequence[bytes | None]) -> PgArray:
    """None is NULL."""
    parts = [_NULL if value is None else _LENGTH.pack(len(value)) + value for value in values]
    return _array(BYTEA, BYTEA_ARRAY, len(values), b"".join(parts), None in values)


def texts(values: Sequence[str]) -> PgArray:
    encoded = [value.encode() for value in values]
    parts = [_LENGTH.pack(len(value)) + value for value in encoded]
    return _array(TEXT, TEXT_ARRAY, len(values), b"".join(parts), False)


class _PgArrayDumper(Dumper):
    format = pq.Format.BINARY

    def get_key(self, obj: PgArray, format: Any) -> Any:
        return (PgArray, obj.oid)

    def upgrade(self, obj: PgArray, format: Any) -> Dumper:
        dumper = _PgArrayDumper(PgArray)
        dumper.oid = obj.oid
        return dumper

    def dump(self, obj: PgArray) -> bytes:
        return obj.data


adapters.register_dumper(PgArray, _PgArrayDumper)
