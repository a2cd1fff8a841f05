# The index's prepared apply() of a large batch against put() and remove() one by
# one: the same entries, the same sorted keys, the same live bytes per segment,
# and nothing readers see changes until the prepared tables are swapped in. And
# an index checkpoint encoded in pieces reads back as what one dumps would give.
from __future__ import annotations

from unittest import mock

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstored.storage.documents import Entry
from sessionstored.storage.log.index import Index
from sessionstored.storage.log.index_checkpoint import encode_in_pieces

keys = st.text(alphabet="abcé", min_size=0, max_size=3)
entries = st.builds(
    lambda segment, length: Entry(1, b"d" * 16, length, segment, 32, length),
    st.integers(1, 3),
    st.integers(1, 50),
)
changes = st.lists(
    st.tuples(st.sampled_from(["s", "k"]), keys, st.one_of(st.none(), entries)),
    max_size=40,
)


def _state(index: Index) -> tuple[object, ...]:
    kinds = sorted(set(index.kinds()) | set(index._sorted_keys))
    return (
        {kind: dict(index._entries.get(kind, {})) for kind in kinds},
        {kind: list(index._sorted_keys.get(kind, [])) for kind in kinds},
        {segment: count for segment, count in index.live_bytes.items() if count},
    )


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(["s", "k"]), keys, entries), max_size=30), changes)
def test_a_prepared_batch_applies_as_its_changes_one_by_one(
    start: list[tuple[str, str, Entry]], batch: list[tuple[str, str, Entry | None]]
) -> None:
    bulk, single = Index(), Index()
    for index in (bulk, single):
        for kind, key, entry in start:
            index.put(kind, key, entry)
    published = _state(bulk)
    prepared = bulk.prepare(batch)  # the writer's thread, while readers read the index
    assert _state(bulk) == published, "prepare() only reads what readers see"
    bulk.apply(batch, prepared)
    for kind, key, entry in batch:
        if entry is None:
            single.remove(kind, key)
        else:
            single.put(kind, key, entry)
    assert _state(bulk) == _state(single)
    for kind in bulk._sorted_keys:
        assert bulk._sorted_keys[kind] == sorted(bulk._sorted_keys[kind])


@settings(max_examples=50)
@given(
    st.recursive(
        st.one_of(st.integers(), st.text(max_size=3), st.binary(max_size=3), st.none()),
        lambda inner: st.one_of(
            st.lists(inner, max_size=9), st.dictionaries(st.text(max_size=2), inner, max_size=4)
        ),
        max_leaves=60,
    )
)
def test_a_checkpoint_encoded_in_pieces_decodes_as_one_dumps_would(value: object) -> None:
    with mock.patch(
        "sessionstored.storage.log.index_checkpoint.PIECE_ITEMS", 4
    ):  # pieces everywhere
        pieces: list[bytes] = []
        encode_in_pieces(value, pieces)
    assert cbor2.loads(b"".join(pieces)) == value


def test_pieces_cross_every_head_size() -> None:
    for length in (0, 23, 24, 255, 256, 65_535, 65_536, 70_000):
        value = list(range(length))
        pieces: list[bytes] = []
        encode_in_pieces(value, pieces)
        assert b"".join(pieces) == cbor2.dumps(value)
