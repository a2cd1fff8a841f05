# storage/log/compaction.py: plan, copy, switch on the real engine (simulated file
# system, small segments): which segments are victims, what the new segment
# holds, and that a document rewritten between copy and switch keeps its newer
# record, and a session the record it replaced, among its earlier generations.
from __future__ import annotations

from typing import Any

import pytest

from sessionstored.storage.documents import SESSION
from sessionstored.storage.errors import StoreFormatError
from sessionstored.storage.log import compaction
from sessionstored.storage.log.store import Store

from .storage_helpers import (
    assert_clean,
    body_for,
    new_fs,
    open_store,
    put,
    remove,
    snapshot_of,
)

BIG = "x" * 6000  # a few records fill a 64 KiB segment


def _mostly_dead(**options: Any) -> Store:
    """Several sealed segments, most of whose records were overwritten or removed."""
    store = open_store(new_fs(), compact_dead_share=0.4, **options)
    store.commit([put(f"keep{n}", BIG) for n in range(3)])  # live in the oldest segment
    for round_ in range(6):
        store.commit([put(f"s{n}", f"{round_}{BIG}") for n in range(8)])
    store.commit([remove(f"s{n}") for n in range(4)])
    store.commit([put("last", 1)])
    return store


def test_the_plan_takes_dead_segments_never_the_active_one() -> None:
    store = _mostly_dead()
    assert store.compactor.due()
    work = store.compactor.choose()
    assert work is not None and work.victims
    assert store.state.log.active not in work.victims and set(work.victims) <= set(
        store.state.log.used
    )
    for number in work.victims:
        live = store.state.index.live_bytes.get(number, 0)
        assert (store.state.log.used[number] - live) / store.state.log.used[number] >= 0.4
    rows = store.state.index.rows() + [
        (compaction.EARLIER, *row) for row in store.state.index.earlier_rows()
    ]
    in_victims = sorted((k, i, e.seq) for k, i, e in rows if e.segment in work.victims)
    assert sorted((k, i, e.seq) for k, i, e in work.moves) == in_victims
    assert any(k == compaction.EARLIER for k, _, _ in work.moves)  # earlier generations move too
    live_segments = {e.segment for _, _, e in rows}
    dead_only = store.compactor.choose(dead_only=True)
    assert dead_only is not None and not set(dead_only.victims) & live_segments
    everything = store.compactor.choose(everything=True)
    assert everything is not None and everything.moves  # the kept records must move
    assert everything.number not in store.state.log.used


def test_copy_then_switch_moves_the_live_records_and_retires_the_victims() -> None:
    store = _mostly_dead()
    before = snapshot_of(store)
    work = store.compactor.choose(everything=True)
    assert work is not None and work.moves
    store.compactor.copy(work)
    moved = store.compactor.switch(work)
    assert moved == len(work.moves)
    assert not set(work.victims) & set(store.state.log.used)
    assert (
        store.checkpointing.retiring == work.victims
    )  # unlinked once a checkpoint no longer names them
    assert snapshot_of(store) == before
    store.checkpointing.write()
    store.state.log.close_retired()
    assert_clean(store)


def test_a_document_rewritten_during_the_copy_keeps_its_newer_record() -> None:
    store = _mostly_dead(keep_generations=0)  # the record it replaced is dead: not moved
    work = store.compactor.choose(everything=True)
    assert work is not None and work.moves
    kind, doc_id, _ = work.moves[0]
    store.compactor.copy(work)
    store.commit([put(doc_id, "rewritten meanwhile")])
    newer = store.state.index.get(kind, doc_id)
    moved = store.compactor.switch(work)
    assert moved == len(work.moves) - 1
    assert store.state.index.get(kind, doc_id) == newer
    store.checkpointing.write()
    assert_clean(store)


def test_a_session_saved_during_the_copy_keeps_the_generation_it_replaced() -> None:
    """The replaced generation was current at plan time and is an earlier one at switch
    time: it moves into the new segment with the others, and stays readable once the
    victims are unlinked, also after a crash and recovery."""
    store = _mostly_dead()
    work = store.compactor.choose(everything=True)
    assert work is not None
    doc_id = next(i for k, i, _ in work.moves if k == SESSION)
    replaced = store.state.index.get(SESSION, doc_id)
    assert replaced is not None
    written = {replaced.seq: store.reads.read_entry(SESSION, doc_id, replaced).body}
    store.compactor.copy(work)
    store.commit([put(doc_id, "saved meanwhile")])
    written[store.seq] = body_for(doc_id, "saved meanwhile")
    moved = store.compactor.switch(work)
    store.checkpointing.write()
    store.state.log.close_retired()  # the victims are gone, and so are their read handles
    assert_clean(store)
    earlier = store.state.index.generations(doc_id)[1]
    assert (earlier.seq, earlier.segment) == (replaced.seq, work.number)
    assert moved == len(work.moves)
    fs = store.state.fs
    store.close()
    fs.crash("drop")
    recovered = open_store(fs)
    assert_clean(recovered)
    generations = recovered.state.index.generations(doc_id)
    bodies = {e.seq: recovered.reads.read_entry(SESSION, doc_id, e).body for e in generations}
    assert {seq: bodies[seq] for seq in written} == written


def test_a_checkpoint_naming_a_segment_that_is_missing_is_refused_in_one_line() -> None:
    """A state directory copied while the daemon ran can hold the checkpoint that names a
    compacted segment without the segment: recovery refuses, naming it, instead of serving
    the documents it held as unreadable."""
    store = _mostly_dead()
    work = store.compactor.choose(everything=True)
    assert work is not None
    store.compactor.copy(work)
    store.compactor.switch(work)
    store.checkpointing.write()
    store.state.log.close_retired()
    fs, lost = store.state.fs, store.state.log.path(work.number)
    store.close()
    fs.unlink(lost)
    with pytest.raises(StoreFormatError) as refused:
        open_store(fs)
    message = str(refused.value)
    assert message.startswith(f"{lost}: ") and "missing" in message and "\n" not in message
