# storage/log/read_back.py: reading the log back. Segments written by the real engine
# (on the simulated file system) are scanned directly: committed batches, a torn
# tail of a batch that was never acknowledged, rot in a batch that was, and one
# test for each rule of read_back.py's theory of operation.
from __future__ import annotations

from sessionstored.storage.log.read_back import ReadBackResult, read_back
from sessionstored.storage.log.records import COMMIT, REMOVAL, Header, parse_header, record_length
from sessionstored.storage.log.segment_items import Segment
from sessionstored.storage.log.segments import SEGMENT_HEADER_BYTES
from sessionstored.storage.log.store import Store
from sessionstored.storage.sealing import PLAINTEXT

from .simfs import SimFileSystem
from .storage_helpers import new_fs, open_store, put, remove


def _log(fs: SimFileSystem, store: Store) -> list[Segment]:
    numbers = sorted(store.state.log.used)
    return [
        Segment(
            n, store.state.log.path(n), fs.file_bytes(store.state.log.path(n)), SEGMENT_HEADER_BYTES
        )
        for n in numbers
    ]


def _read_back(fs: SimFileSystem, store: Store) -> ReadBackResult:
    return read_back(_log(fs, store), PLAINTEXT, 0, 0)


def _records(data: bytes) -> list[tuple[int, Header]]:
    """(offset, header) of every record in a segment's bytes, in order."""
    found, offset = [], SEGMENT_HEADER_BYTES
    while (header := parse_header(data, offset)) is not None:
        found.append((offset, header))
        offset += record_length(header)
    return found


def _three_batches() -> tuple[SimFileSystem, Store]:
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", 1), put("b", 1)])
    store.commit([put("a", 2)])
    store.commit([remove("b")])
    return fs, store


def test_committed_batches_come_back_in_order_with_their_intents() -> None:
    fs, store = _three_batches()
    result = _read_back(fs, store)
    assert [(b.batch, b.first_seq, b.last_seq) for b in result.batches] == [
        (1, 1, 2),
        (2, 3, 3),
        (3, 4, 4),
    ]
    assert [(i.id, i.seq, i.digest is None) for i in result.batches[0].intents] == [
        ("a", 1, False),
        ("b", 2, False),
    ]
    removal = result.batches[2].intents[0]
    assert (removal.id, removal.digest, removal.size) == ("b", None, 0)
    entry = store.state.index.get("s", "a")
    assert entry is not None
    written = result.batches[1].intents[0]
    assert (written.segment, written.offset, written.length) == (
        entry.segment,
        entry.offset,
        entry.length,
    )
    assert result.end == (store.state.log.active, store.state.log.offset)
    assert (result.last_seq, result.corruption, result.torn) == (4, [], None)


def test_a_batch_whose_commit_record_never_landed_is_a_torn_tail() -> None:
    fs, store = _three_batches()
    path = store.state.log.path(store.state.log.active)
    data = bytearray(fs.file_bytes(path))
    records = _records(bytes(data))
    [(start, _)] = [(offset, h) for offset, h in records if h.batch == 3 and h.type == REMOVAL]
    [(commit_at, _)] = [(offset, h) for offset, h in records if h.batch == 3 and h.type == COMMIT]
    end = store.state.log.offset
    data[commit_at:end] = bytes(end - commit_at)  # a torn write: zeros where it did not land
    fs.set_file_bytes(path, bytes(data))
    result = _read_back(fs, store)
    assert [b.batch for b in result.batches] == [1, 2]
    assert result.rolled_back == 1 and result.corruption == []
    assert result.torn is not None and result.torn["offset"] == start
    assert result.end == (store.state.log.active, start)


def test_rot_in_an_acknowledged_batch_is_corruption_never_a_torn_tail() -> None:
    fs, store = _three_batches()
    entry = store.state.index.get("s", "a")  # batch 2's data record, followed by batch 3
    assert entry is not None
    path = store.state.log.path(entry.segment)
    data = bytearray(fs.file_bytes(path))
    data[entry.offset + entry.length - 5] ^= 0xFF  # inside its payload
    fs.set_file_bytes(path, bytes(data))
    result = _read_back(fs, store)
    assert result.torn is None and result.rolled_back == 0
    assert [b.batch for b in result.batches] == [1, 2, 3]  # later batches still apply
    [damage] = result.batches[1].damaged
    assert (damage.id, damage.seq, damage.file) == ("a", 3, path)
    assert result.batches[1].intents == []
    assert [c["path"] for c in result.corruption] == [path]


# -- one test per rule of read_back.py's theory of operation ----------------------------------


def _last_batch_of_three_records() -> tuple[SimFileSystem, Store, list[tuple[int, Header]]]:
    """Batches 1 and 2, then batch 3 with two data records and its commit record."""
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", 1)])
    store.commit([put("b", 1)])
    store.commit([put("c", 1), put("d", 1)])
    data = fs.file_bytes(store.state.log.path(store.state.log.active))
    last = [(offset, h) for offset, h in _records(data) if h.batch == 3]
    assert [h.type == COMMIT for _, h in last] == [False, False, True]
    return fs, store, last


def _overwrite(fs: SimFileSystem, store: Store, offset: int, new: bytes) -> str:
    path = store.state.log.path(store.state.log.active)
    data = bytearray(fs.file_bytes(path))
    data[offset : offset + len(new)] = new
    fs.set_file_bytes(path, bytes(data))
    return path


def test_a_hole_of_zeros_among_the_last_batchs_intact_records_is_a_torn_tail() -> None:
    """Rule: damage followed only by intact records of the same last batch, that looks
    like a torn write (zeros where pages did not land), is a torn tail: the batch's
    sync never returned, so it is rolled back whole, commit record and all."""
    fs, store, last = _last_batch_of_three_records()
    (first, header), _, _ = last
    _overwrite(fs, store, first, bytes(record_length(header)))
    result = _read_back(fs, store)
    assert [b.batch for b in result.batches] == [1, 2]
    assert result.corruption == []
    assert result.torn is not None and result.torn["offset"] == first
    assert (result.last_batch, result.last_seq) == (2, 2)  # its commit record goes too
    assert result.end == (store.state.log.active, first)


def test_rot_among_the_last_batchs_intact_records_is_corruption() -> None:
    """Rule: damage in the last batch that does not look torn (not zeros) is rot in an
    acknowledged batch: corruption, reported with its file and offset, never cut off."""
    fs, store, last = _last_batch_of_three_records()
    (first, header), _, _ = last
    path = _overwrite(fs, store, first + record_length(header) - 3, b"\xa5\xa5\xa5")
    result = _read_back(fs, store)
    assert result.torn is None and result.rolled_back == 0
    assert [b.batch for b in result.batches] == [1, 2, 3]
    assert [(c["path"], c["offset"]) for c in result.corruption] == [(path, first)]
    [damage] = result.batches[2].damaged
    assert damage.id == "c"  # its document is io_error, never an older generation
    assert [i.id for i in result.batches[2].intents] == ["d"]


def test_damage_past_the_last_intact_commit_with_nothing_after_is_a_torn_tail() -> None:
    """Rule: damage after the last intact commit record, with nothing intact after it,
    is always a torn tail, zeros or not: no acknowledged batch lies there."""
    fs, store, _ = _last_batch_of_three_records()
    end = store.state.log.offset
    _overwrite(fs, store, end, b"\x13\x37" * 40)  # garbage, not zeros
    result = _read_back(fs, store)
    assert [b.batch for b in result.batches] == [1, 2, 3]
    assert result.corruption == [] and result.rolled_back == 0
    assert result.torn is not None and result.torn["offset"] == end
    assert result.end == (store.state.log.active, end)


def test_a_rotted_commit_record_followed_by_a_later_batch_means_committed() -> None:
    """Rule: a batch whose intents are followed by a record of a later batch with no
    intact commit record between was committed (the later batch was written only after
    its sync returned): its documents are io_error, never rolled back."""
    fs, store, last = _last_batch_of_three_records()
    store.commit([put("e", 1)])  # batch 4 follows batch 3
    first_intent = last[0][0]
    commit_at, commit_header = last[2]
    path = _overwrite(fs, store, commit_at + record_length(commit_header) - 2, b"\xff\xff")
    result = _read_back(fs, store)
    assert result.torn is None and result.rolled_back == 0
    assert [b.batch for b in result.batches] == [1, 2, 3, 4]
    assert sorted(d.id for d in result.batches[2].damaged) == ["c", "d"]
    assert result.batches[2].intents == []
    reported = {(c["path"], c["offset"]) for c in result.corruption}
    assert reported == {(path, commit_at), (path, first_intent)}  # the record, the batch


def test_the_scan_goes_on_past_corruption_to_every_later_batch() -> None:
    """Rule: after corruption, the scan goes on: every later batch still applies, and
    the next batch is appended after the last of them."""
    fs, store, _ = _last_batch_of_three_records()
    store.commit([put("e", 1)])
    entry = store.state.index.get("s", "b")  # batch 2's record
    assert entry is not None
    _overwrite(fs, store, entry.offset + 4, b"\x00\x11\x22\x33")
    result = _read_back(fs, store)
    assert [b.batch for b in result.batches] == [1, 2, 3, 4]
    assert [d.id for d in result.batches[1].damaged] == ["b"]
    assert result.end == (store.state.log.active, store.state.log.offset)
    assert (result.last_batch, result.last_seq) == (4, 5)
