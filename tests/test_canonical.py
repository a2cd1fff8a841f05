from __future__ import annotations

import random
from typing import Any

import cbor2
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from sessionstore.wire.canonical import canonical_dumps, parse_digest, snapshot_digest
from sessionstore.wire.protocol import Connection, parse_request
from sessionstored.ops.prepare import checkpoint_document

from . import cbor_reference as reference

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.5, 65504.0, 65520.0, 1e-7, 5.960464477539063e-08, 3.4e38]),
    st.text(max_size=10),
    st.binary(max_size=6),
)
# every CBOR type as a key: arrays (tuples) and maps (cbor2's frozendict) too
keys = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(children, children, max_size=3).map(cbor2.frozendict),
    ),
    max_leaves=6,
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(keys, children, max_size=4),
        st.dictionaries(st.text(max_size=6), children, max_size=5),
    ),
    max_leaves=20,
)


@given(values)
def test_matches_an_independent_rfc8949_encoder(value: object) -> None:
    assert canonical_dumps(value) == reference.encode(value)


def test_mixed_key_types_sort_bytewise_not_length_first() -> None:
    # 1000 encodes as 19 03 e8 and "b" as 61 62: bytewise, the integer comes first
    assert canonical_dumps({"b": 1, 1000: 2}) == bytes.fromhex("a21903e802616201")


def test_array_and_map_keys_sort_bytewise_not_length_first() -> None:
    # [1000] encodes as 81 19 03 e8 and [1, 2] as 82 01 02: bytewise, [1000] comes first
    assert canonical_dumps({(1, 2): 0, (1000,): 0}) == bytes.fromhex("a2811903e80082010200")
    key = cbor2.frozendict({"bb": 0, "a": 0})  # a map used as a key is sorted too
    assert canonical_dumps({key: 1}) == bytes.fromhex("a1a26161006262620001")


def test_floats_take_their_shortest_exact_form() -> None:
    assert canonical_dumps(float("nan")) == bytes.fromhex("f97e00")
    assert canonical_dumps(1.5) == bytes.fromhex("f93e00")
    assert canonical_dumps(float("-inf")) == bytes.fromhex("f9fc00")
    assert canonical_dumps(0.1) == bytes.fromhex("fb3fb999999999999a")


def test_field_order_does_not_change_the_digest() -> None:
    a = {"schema_version": 1, "session": {"id": "x", "z": 1, "a": 2}, "unknown": [1]}
    b = {"unknown": [1], "session": {"a": 2, "id": "x", "z": 1}, "schema_version": 1}
    assert snapshot_digest(a) == snapshot_digest(b)
    assert snapshot_digest(a) != snapshot_digest({**a, "unknown": [2]})


def test_digest_definition() -> None:
    snap = {"schema_version": 1, "session": {"id": "x"}}
    expected = xxhash.xxh3_128_hexdigest(b"sessionstore.snapshot.v1\x00" + reference.encode(snap))
    assert snapshot_digest(snap) == "xxh3-128:" + expected
    assert parse_digest(snapshot_digest(snap)) == bytes.fromhex(expected)
    for bad in ("xxh3-128:" + "A" * 32, "xxh3-128:abc", "sha256:" + "0" * 32, 5):
        assert parse_digest(bad) is None


def _shuffled(value: Any, rng: random.Random) -> Any:
    """The same value with every map's keys in a random order, keys included."""
    if isinstance(value, cbor2.frozendict):
        items = [(_shuffled(k, rng), _shuffled(v, rng)) for k, v in value.items()]
        rng.shuffle(items)
        return cbor2.frozendict(items)
    if isinstance(value, dict):
        items = [(_shuffled(k, rng), _shuffled(v, rng)) for k, v in value.items()]
        rng.shuffle(items)
        return dict(items)
    if isinstance(value, tuple):
        return tuple(_shuffled(v, rng) for v in value)
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@given(values, st.randoms(use_true_random=False))
def test_the_daemons_decode_path_gives_the_same_bytes(value: object, rng: random.Random) -> None:
    conn = Connection(order_maps=True)
    conn.receive_data(cbor2.dumps(_shuffled(value, rng)))  # in no canonical order
    decoded = conn.next_message()
    assert canonical_dumps(decoded, hint=conn.last_hint) == reference.encode(value)
    assert canonical_dumps(decoded) == reference.encode(value)


def _stored_value(request_bytes: bytes) -> bytes:
    """What the daemon stores for a checkpoint_put's value, decoded as it decodes it."""
    conn = Connection(order_maps=True, received="request")
    conn.receive_data(request_bytes)
    request = parse_request(conn.next_message(), canonical_hint=conn.last_hint)
    return checkpoint_document(request.args, None, "k", 1 << 30, request.canonical_hint).body


def _put(value: Any) -> dict[str, Any]:
    return {"op": "checkpoint_put", "kind": "kv", "key": "k", "rid": 7, "value": {"v": value}}


@given(values, st.randoms(use_true_random=False))
def test_a_stored_value_is_canonical_however_it_was_sent(value: object, rng: random.Random) -> None:
    expected = reference.encode({"v": value})
    assert _stored_value(reference.encode(_put(value))) == expected  # sent canonical
    assert _stored_value(reference.loose_encode(_put(value), rng)) == expected  # any other form
