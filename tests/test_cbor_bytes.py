# The compiled CBOR helper against its Python twin, and both against the decoder:
# the same verdicts, reasons, offsets and bytes for valid, non-canonical and
# malformed input, and a verdict of "canonical" only where the decoder and the
# canonical encoder give back exactly the bytes received.
from __future__ import annotations

import importlib
import random
import shutil
import struct
from typing import Any

import cbor2
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionstore.wire import cbor_bytes, cbor_bytes_python
from sessionstore.wire.canonical import canonical_dumps
from sessionstore.wire.protocol import END_OF_STREAM, Connection, Mode, Refusal

from . import cbor_reference as reference
from .test_canonical import values


def _compiled() -> Any:
    try:
        return importlib.import_module("sessionstore.wire._cbor_bytes")
    except ImportError:
        if shutil.which("cc") or shutil.which("gcc"):
            raise  # a compiler is here, so `make` built the helper: its absence is a defect
        pytest.skip("no C compiler on this machine: only the Python twin exists")


compiled = _compiled()
twin = cbor_bytes_python

text_keyed = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**64), 2**64 - 1),
        st.floats(),
        st.text(max_size=8),
        st.binary(max_size=6),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=5), children, max_size=5)
    ),
    max_leaves=25,
)


@st.composite
def encodings(draw: Any) -> bytes:
    """Valid items in every form, and the same cut, bent and padded."""
    value = draw(st.one_of(text_keyed, values))
    rng = random.Random(draw(st.integers(0, 2**32)))
    form = draw(st.sampled_from(["canonical", "plain", "loose"]))
    if form == "canonical":
        data = reference.encode(value)
    elif form == "plain":
        data = cbor2.dumps(value)
    else:
        data = reference.loose_encode(value, rng)
    damage = draw(st.sampled_from(["none", "none", "truncate", "flip", "insert", "append"]))
    if damage == "truncate" and data:
        data = data[: rng.randrange(len(data))]
    elif damage == "flip" and data:
        at = rng.randrange(len(data))
        data = data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :]
    elif damage == "insert":
        at = rng.randrange(len(data) + 1)
        data = data[:at] + bytes([rng.randrange(256)]) + data[at:]
    elif damage == "append":
        data += draw(st.binary(max_size=4))
    return data


hostile = st.one_of(encodings(), st.binary(max_size=64))
# hand-made corners: over-long heads, non-shortest floats, bad UTF-8, surrogates,
# every reserved and simple value, breaks, tags, depth
CORNERS = [
    b"\x18\x05",
    b"\x19\x00\x10",
    b"\x1a\x00\x00\x01\x00",
    b"\x1b\x00\x00\x00\x00\x00\x00\x00\x01",
    b"\xf9\x7e\x01",
    b"\xf9\x7e\x00",
    b"\xfa\x3f\xc0\x00\x00",
    b"\xfb\x3f\xf8\x00\x00\x00\x00\x00\x00",
    b"\xfa\x47\x7f\xf0\x00",
    b"\xfb\x7f\xf0\x00\x00\x00\x00\x00\x00",
    b"\xfa\x00\x00\x00\x01",
    b"\x62\xc3\x28",
    b"\x63\xed\xa0\x80",
    b"\x64\xf4\x90\x80\x80",
    b"\x62\xc0\x80",
    b"\x61\x80",
    b"\x63\xe0\x80\x80",
    b"\xf7",
    b"\xf0",
    b"\xf8\x20",
    b"\xfc",
    b"\xfd",
    b"\xfe",
    b"\xff",
    b"\x1c",
    b"\x3f",
    b"\xdf",
    b"\xc1\x00",
    b"\xc2\x41\x01",
    b"\x9f\x01\xff",
    b"\x5f\xff",
    b"\xa2\x61b\x01\x61a\x02",
    b"\xa2\x61a\x01\x61a\x02",
    b"\xa1\x01\x02",
    b"\xa1\x78\x01a\x00",
    b"\x81" * 70 + b"\x00",
    b"\xa1\x61a" * 66 + b"\x00",
    b"\x9b" + b"\xff" * 8,
    b"\x7b\xff\xff\xff\xff\xff\xff\xff\xff",
    b"\xbb\x7f\xff\xff\xff\xff\xff\xff\xff",
]


@settings(max_examples=500)
@given(hostile, st.lists(st.integers(0, 64), max_size=6), st.integers(0, 8))
def test_a_resumed_walk_is_the_same_as_one_over_all_the_bytes(
    data: bytes, cuts: list[int], depth: int
) -> None:
    whole = twin.walk(data, 0, 1 << 20, depth, 1 << 30)
    for module in (compiled, twin):
        walker = module.Walker(0, 1 << 20, depth, 1 << 30)
        for cut in sorted(cuts):
            verdict = walker.walk(bytearray(data[:cut]))
            if verdict[0] != cbor_bytes.INCOMPLETE:
                break
        else:
            verdict = walker.walk(data)
        assert verdict == whole


def _call(function: Any, *args: Any) -> Any:
    try:
        return ("result", function(*args))
    except ValueError as error:
        return ("ValueError", str(error))


@settings(max_examples=1500)
@given(
    hostile,
    st.integers(0, 3),
    st.one_of(st.just(1 << 20), st.integers(0, 80)),
    st.one_of(st.just(64), st.integers(0, 8)),
    st.one_of(st.just(1 << 30), st.integers(0, 40)),
)
def test_walk_is_the_same_in_c_and_python(
    data: bytes, start: int, limit: int, depth: int, max_items: int
) -> None:
    start = min(start, len(data))
    arguments = (data, start, limit, depth, max_items)
    assert _call(compiled.walk, *arguments) == _call(twin.walk, *arguments)
    assert compiled.walk(bytearray(data), start, limit, depth, max_items) == twin.walk(*arguments)


@settings(max_examples=1500)
@given(hostile, st.integers(0, 3), st.one_of(st.just(64), st.integers(0, 6)))
def test_canonicalise_and_entries_are_the_same_in_c_and_python(
    data: bytes, start: int, depth: int
) -> None:
    start = min(start, len(data))
    for end in {len(data), twin.item_end(data, start)}:
        if end >= start:
            arguments = (data, start, end, depth)
            assert _call(compiled.canonicalise, *arguments) == _call(twin.canonicalise, *arguments)
    assert _call(compiled.entries, data, start) == _call(twin.entries, data, start)
    for end in (-2, -1, 0, len(data) // 2, len(data), len(data) + 1):
        assert _call(compiled.entries, data, start, end) == _call(twin.entries, data, start, end)


@pytest.mark.parametrize("data", CORNERS)
def test_corners_are_the_same_in_c_and_python(data: bytes) -> None:
    for start in (0, 1):
        for depth in (0, 3, 64):
            arguments = (data, start, 1 << 20, depth, 1 << 30)
            assert _call(compiled.walk, *arguments) == _call(twin.walk, *arguments)
            end_arguments = (data, start, len(data), depth)
            assert _call(compiled.canonicalise, *end_arguments) == _call(
                twin.canonicalise, *end_arguments
            )
        assert _call(compiled.entries, data, start) == _call(twin.entries, data, start)


def test_bad_arguments_are_value_errors_in_both() -> None:
    for module in (compiled, twin):
        with pytest.raises(ValueError):
            module.walk(b"\x00", 2, 10, 4, 10)
        with pytest.raises(ValueError):
            module.walk(b"\x00", 0, 10, 10_000, 10)
        with pytest.raises(ValueError):
            module.canonicalise(b"\x00", 0, 5, 4)
        with pytest.raises(ValueError):
            module.entries(b"\x00", 0)


# -- the verdicts against the decoder --------------------------------------------


def _decoder_verdict(data: bytes) -> bytes | None:
    """What the object path makes of data as one whole item: its canonical bytes, or
    None when it refuses them."""
    conn = Connection(
        order_maps=True, received="request", max_depth=64, mode=Mode.CBOR, cbor_bytes=False
    )
    conn.receive_data(data)
    conn.receive_eof()
    try:
        message = conn.next_message()
        if conn.buffered or message is END_OF_STREAM:
            return None  # more than one item, or none
        return canonical_dumps(message)
    except (Refusal, ValueError, TypeError, OverflowError):
        return None


@settings(max_examples=1500)
@given(st.one_of(hostile, st.sampled_from(CORNERS)))
@example(b"\xfa\x7f\xc0\x00\x00")  # a single-precision NaN: f97e00 once canonical
@example(b"\xa2\x61a\x01\xfb\x3f\xf8\x00\x00\x00\x00\x00\x00\x02")  # a float key
def test_every_verdict_agrees_with_the_decoder(data: bytes) -> None:
    status, _, position = cbor_bytes.walk(data, 0, len(data) + 1, 64, 1 << 30)
    expected = _decoder_verdict(data)
    if status == cbor_bytes.CANONICAL and position == len(data):
        assert expected == data
    elif status == cbor_bytes.VALID and position == len(data):
        canonical = cbor_bytes.canonicalise(data, 0, len(data), 64)
        assert canonical == expected or (canonical is None and expected is None)
    elif status in (cbor_bytes.ERROR, cbor_bytes.INCOMPLETE):
        assert expected is None


@given(text_keyed)
def test_what_clients_send_is_handled_by_the_helper(value: Any) -> None:
    canonical = reference.encode(value)
    assert cbor_bytes.walk(canonical, 0, len(canonical), 64, 1 << 30) == (
        cbor_bytes.CANONICAL,
        0,
        len(canonical),
    )
    plain = cbor2.dumps(value)
    status, _, end = cbor_bytes.walk(plain, 0, len(plain), 64, 1 << 30)
    assert (status, end) in ((cbor_bytes.CANONICAL, len(plain)), (cbor_bytes.VALID, len(plain)))
    assert cbor_bytes.canonicalise(plain, 0, len(plain), 64) == canonical


@given(st.floats(width=64))
def test_floats_narrow_exactly_as_the_canonical_encoder_does(value: float) -> None:
    wide = b"\xfb" + struct.pack(">d", value)
    assert cbor_bytes.canonicalise(wide, 0, len(wide), 1) == cbor2.dumps(value, canonical=True)


@settings(max_examples=1500)
@given(st.one_of(hostile, st.sampled_from(CORNERS), text_keyed.map(canonical_dumps)))
def test_the_snapshot_outline_is_the_same_in_c_and_python(data: bytes) -> None:
    assert compiled.snapshot_outline(data) == twin.snapshot_outline(data)
