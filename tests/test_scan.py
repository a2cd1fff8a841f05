# storage/log/scan.py: reading the log back. Segments written by the real engine
# (on the simulated file system) are scanned directly: committed batches, a torn
# tail of a batch that was never acknowledged, and rot in a batch that was.
from __future__ import annotations

from sessionstored.storage.log.records import COMMIT, REMOVAL, Header, parse_header, record_length
from sessionstored.storage.log.scan import ScanResult, scan
from sessionstored.storage.log.segment_items import Segment
from sessionstored.storage.log.segments import SEGMENT_HEADER_BYTES
from sessionstored.storage.log.store import Store
from sessionstored.storage.sealing import PLAINTEXT

from .simfs import SimFileSystem
from .storage_helpers import new_fs, open_store, put, remove


def _log(fs: SimFileSystem, store: Store) -> list[Segment]:
    numbers = sorted(store.log.used)
    return [
        Segment(n, store.log.path(n), fs.file_bytes(store.log.path(n)), SEGMENT_HEADER_BYTES)
        for n in numbers
    ]


def _scan(fs: SimFileSystem, store: Store) -> ScanResult:
    return scan(_log(fs, store), PLAINTEXT, 0, 0)


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
    result = _scan(fs, store)
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
    entry = store.index.get("s", "a")
    assert entry is not None
    written = result.batches[1].intents[0]
    assert (written.segment, written.offset, written.length) == (
        entry.segment,
        entry.offset,
        entry.length,
    )
    assert result.end == (store.log.active, store.log.offset)
    assert (result.last_seq, result.corruption, result.torn) == (4, [], None)


def test_a_batch_whose_commit_record_never_landed_is_a_torn_tail() -> None:
    fs, store = _three_batches()
    path = store.log.path(store.log.active)
    data = bytearray(fs.file_bytes(path))
    records = _records(bytes(data))
    [(start, _)] = [(offset, h) for offset, h in records if h.batch == 3 and h.type == REMOVAL]
    [(commit_at, _)] = [(offset, h) for offset, h in records if h.batch == 3 and h.type == COMMIT]
    end = store.log.offset
    data[commit_at:end] = bytes(end - commit_at)  # a torn write: zeros where it did not land
    fs.set_file_bytes(path, bytes(data))
    result = _scan(fs, store)
    assert [b.batch for b in result.batches] == [1, 2]
    assert result.rolled_back == 1 and result.corruption == []
    assert result.torn is not None and result.torn["offset"] == start
    assert result.end == (store.log.active, start)


def test_rot_in_an_acknowledged_batch_is_corruption_never_a_torn_tail() -> None:
    fs, store = _three_batches()
    entry = store.index.get("s", "a")  # batch 2's data record, followed by batch 3
    assert entry is not None
    path = store.log.path(entry.segment)
    data = bytearray(fs.file_bytes(path))
    data[entry.offset + entry.length - 5] ^= 0xFF  # inside its payload
    fs.set_file_bytes(path, bytes(data))
    result = _scan(fs, store)
    assert result.torn is None and result.rolled_back == 0
    assert [b.batch for b in result.batches] == [1, 2, 3]  # later batches still apply
    [damage] = result.batches[1].damaged
    assert (damage.id, damage.seq, damage.file) == ("a", 3, path)
    assert result.batches[1].intents == []
    assert [c["path"] for c in result.corruption] == [path]
