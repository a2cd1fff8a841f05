# The index's prepared apply() of a large batch against put() and remove() one by
# one: the same entries, the same pages for every range read, the same live bytes
# per segment, every sorted list whole (dead keys counted), and nothing readers
# see changes until the batch is applied. And
# an index checkpoint encoded in pieces reads back as what one dumps would give, and
# so does its history encoded from the chunks the last checkpoint kept.
from __future__ import annotations

from unittest import mock

import cbor2
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstored.storage.documents import Entry, KeyRange
from sessionstored.storage.log.index import Index
from sessionstored.storage.log.index_checkpoint import (
    HistoryColumns,
    _history_columns,
    _history_rows,
    encode_in_pieces,
)
from sessionstored.storage.mutations import Committed

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
    """What readers see: the tables, every page of every kind's ids, the live bytes."""
    kinds = ["s", "k"]
    pages = {}
    for kind in kinds:
        for prefix in ("", "a", "é"):
            for reverse in (False, True):
                for limit in (1, 2, 100):
                    wanted = KeyRange(kind, prefix, limit=limit, reverse=reverse)
                    pages[(kind, prefix, reverse, limit)] = index.scan(wanted)
    return (
        {kind: dict(index._entries.get(kind, {})) for kind in kinds if index.count(kind)},
        pages,
        {segment: count for segment, count in index.live_bytes.items() if count},
    )


def _check_keys(index: Index) -> None:
    """Each sorted list is sorted, holds every id of its table, and its other keys (the
    dead ones) are counted."""
    for kind, keys in index._sorted_keys.items():
        assert keys == sorted(keys) and len(set(keys)) == len(keys)
        live = {doc_id.encode() for doc_id in index.table(kind)}
        assert live <= set(keys)
        assert index._dead.get(kind, 0) == len(keys) - len(live)


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.sampled_from(["s", "k"]), keys, entries), max_size=30),
    st.lists(changes, min_size=1, max_size=4),
)
def test_a_prepared_batch_applies_as_its_changes_one_by_one(
    start: list[tuple[str, str, Entry]], batches: list[list[tuple[str, str, Entry | None]]]
) -> None:
    bulk, single = Index(dead_keys_min=2), Index(dead_keys_min=2)  # dead keys dropped soon
    for index in (bulk, single):
        for kind, key, entry in start:
            index.put(kind, key, entry)
    for batch in batches:  # removals leave dead keys, a later batch may drop them
        published = _state(bulk)
        prepared = bulk.prepare(batch)  # the writer's thread, while readers read
        assert _state(bulk) == published, "prepare() only reads what readers see"
        bulk.apply(batch, prepared)
        for kind, key, entry in batch:
            if entry is None:
                single.remove(kind, key)
            else:
                single.put(kind, key, entry)
        assert _state(bulk) == _state(single)
        _check_keys(bulk)
        _check_keys(single)


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


def test_dead_keys_of_small_batches_are_dropped_by_the_next_prepared_one() -> None:
    index = Index(dead_keys_min=2)
    entry = Entry(1, b"d" * 16, 10, 1, 32, 10)
    for n in range(12):
        index.put("s", f"k{n:02}", entry)
    for n in range(5):  # one by one, as small batches apply: the keys stay, dead
        index.remove("s", f"k{n:02}")
    assert len(index._sorted_keys["s"]) == 12 and index._dead["s"] == 5
    assert index.scan(KeyRange("s", limit=3)) == ([(f"k{n:02}", entry) for n in (5, 6, 7)], True)
    batch: list[tuple[str, str, Entry | None]] = [("s", "k05", None)]
    assert index.wants_prepare(batch)  # 5 dead keys of 12: over a quarter
    index.apply(batch, index.prepare(batch))
    assert index._sorted_keys["s"] == [f"k{n:02}".encode() for n in range(6, 12)]
    assert index._dead["s"] == 0 and not index.wants_prepare(batch)


# A sliding window of history rows: each step commits some changes and the window keeps
# the newest `keep` (as the store's History does); seqs run on without a gap.
history_steps = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 60)), min_size=1, max_size=12)


def _row(seq: int) -> Committed:
    removal = seq % 5 == 0
    return Committed(
        seq, "sk"[seq % 2], f"id-{seq % 7}", None if removal else bytes([seq % 256]) * 16,
        1_764_000_000_000 + seq, 0 if removal else seq * 3, removal and seq % 2 == 0,
    )  # fmt: skip


@given(history_steps)
@settings(max_examples=200, deadline=None)
def test_checkpoint_history_from_kept_chunks_is_what_one_dumps_would_give(
    steps: list[tuple[int, int]],
) -> None:
    encoder = HistoryColumns(chunk_rows=8)
    rows: list[Committed] = []
    next_seq = 1
    for added, keep in steps:
        rows += [_row(seq) for seq in range(next_seq, next_seq + added)]
        next_seq += added
        rows = rows[-keep:]
        before = encoder.encoded_chunks
        encoded = encoder.encode(rows).data
        assert encoded == cbor2.dumps(_history_columns(rows))
        assert _history_rows(cbor2.loads(encoded)) == [tuple(row) for row in rows]
        # at most the window's first chunk and those that hold the rows just added
        assert encoder.encoded_chunks - before <= 2 + (added + 7) // 8


def test_a_checkpoint_encodes_each_whole_history_chunk_once() -> None:
    encoder = HistoryColumns(chunk_rows=100)
    rows = [_row(seq) for seq in range(1, 1001)]  # chunks 0 (seqs 1-99) to 10 (seq 1000)
    encoder.encode(rows)
    assert encoder.encoded_chunks == 11
    rows = rows[50:] + [_row(seq) for seq in range(1001, 1031)]
    encoder.encode(rows)  # the trimmed first chunk and the grown last one, nothing else
    assert encoder.encoded_chunks == 13
