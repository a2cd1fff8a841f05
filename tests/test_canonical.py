from __future__ import annotations

import cbor2
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from sessionstore.canonical import canonical_dumps, parse_digest, snapshot_digest

keys = st.one_of(st.text(max_size=6), st.integers(-1000, 100_000), st.binary(max_size=4))
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10), st.floats()),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=4)
    ),
    max_leaves=20,
)


def _head(major: int, length: int) -> bytes:
    if length < 24:
        return bytes([major << 5 | length])
    for info, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if length < 1 << (8 * width):
            return bytes([major << 5 | info]) + length.to_bytes(width, "big")
    raise AssertionError("too long")


def _reference(value: object) -> bytes:
    """RFC 8949 4.2.1 spelled out: encode every key, sort maps by the encoded bytes."""
    if isinstance(value, dict):
        pairs = sorted((_reference(k), _reference(v)) for k, v in value.items())
        return _head(5, len(pairs)) + b"".join(k + v for k, v in pairs)
    if isinstance(value, list):
        return _head(4, len(value)) + b"".join(_reference(item) for item in value)
    return bytes(cbor2.dumps(value, canonical=True))


@given(values)
def test_matches_rfc8949_bytewise_reference(value: object) -> None:
    assert canonical_dumps(value) == _reference(value)


def test_mixed_key_types_sort_bytewise_not_length_first() -> None:
    # 1000 encodes as 19 03 e8 and "b" as 61 62: bytewise, the integer comes first
    assert canonical_dumps({"b": 1, 1000: 2}) == bytes.fromhex("a21903e802616201")


def test_field_order_does_not_change_the_digest() -> None:
    a = {"schema_version": 1, "session": {"id": "x", "z": 1, "a": 2}, "unknown": [1]}
    b = {"unknown": [1], "session": {"a": 2, "id": "x", "z": 1}, "schema_version": 1}
    assert snapshot_digest(a) == snapshot_digest(b)
    assert snapshot_digest(a) != snapshot_digest({**a, "unknown": [2]})


def test_digest_definition() -> None:
    snap = {"schema_version": 1, "session": {"id": "x"}}
    expected = xxhash.xxh3_128_hexdigest(
        b"sessionstore.snapshot.v1\x00" + cbor2.dumps(snap, canonical=True)
    )
    assert snapshot_digest(snap) == "xxh3-128:" + expected
    assert parse_digest(snapshot_digest(snap)) == bytes.fromhex(expected)
    for bad in ("xxh3-128:" + "A" * 32, "xxh3-128:abc", "sha256:" + "0" * 32, 5):
        assert parse_digest(bad) is None  # type: ignore[arg-type]


no_float_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.text(max_size=10),
        st.binary(max_size=6),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=5)
    ),
    max_leaves=25,
)


@given(st.one_of(no_float_values, values))
def test_protocol_fast_path_is_canonical_when_it_says_so(value: object) -> None:
    from sessionstore.protocol import Connection

    conn = Connection(order_maps=True)
    conn.receive_data(cbor2.dumps(value))  # cbor2's default order, not canonical
    decoded = conn.next_message()
    assert canonical_dumps(decoded, hint=conn.last_hint) == _reference(value)
    assert canonical_dumps(decoded) == _reference(value)
