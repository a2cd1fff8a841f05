# The index's bulk apply() of a large batch against put() and remove() one by one:
# the same entries, the same sorted keys, the same live bytes per segment (the
# bulk path is taken for every batch here).
from __future__ import annotations

from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstored.storage.index import Entry, Index

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
def test_a_large_batch_applies_as_its_changes_one_by_one(
    start: list[tuple[str, str, Entry]], batch: list[tuple[str, str, Entry | None]]
) -> None:
    bulk, single = Index(), Index()
    for index in (bulk, single):
        for kind, key, entry in start:
            index.put(kind, key, entry)
    with mock.patch("sessionstored.storage.index.BULK_CHANGES", 0):  # the bulk path always
        bulk.apply(batch)
    for kind, key, entry in batch:
        if entry is None:
            single.remove(kind, key)
        else:
            single.put(kind, key, entry)
    assert _state(bulk) == _state(single)
    for kind in bulk._sorted_keys:
        assert bulk._sorted_keys[kind] == sorted(bulk._sorted_keys[kind])
