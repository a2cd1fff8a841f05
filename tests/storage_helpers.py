from __future__ import annotations

from typing import Any

from sessionstore.wire.canonical import canonical_dumps, digest_bytes_of_canonical
from sessionstored.storage.log.recovery import RecoveryReport
from sessionstored.storage.log.recovery import open_store as open_recovered
from sessionstored.storage.log.store import Store
from sessionstored.storage.mutations import ANY, Put, Remove

from .simfs import SimFileSystem

ROOT = "/state"


def body_for(session_id: str, value: Any) -> bytes:
    return canonical_dumps({"schema_version": 1, "session": {"id": session_id}, "value": value})


def put(session_id: str, value: Any, expect: Any = ANY) -> Put:
    body = body_for(session_id, value)
    return Put("s", session_id, body, digest_bytes_of_canonical(body), expect)


def remove(session_id: str, expect: Any = ANY) -> Remove:
    return Remove("s", session_id, expect)


def new_fs() -> SimFileSystem:
    fs = SimFileSystem()
    fs.makedirs_durable(ROOT)
    return fs


SMALL_SEGMENT_BYTES = 64 * 1024  # rotations and compactions within a short workload


def open_store(fs: SimFileSystem, **kwargs: Any) -> Store:
    return open_with_report(fs, **kwargs)[0]


def open_with_report(fs: SimFileSystem, **kwargs: Any) -> tuple[Store, RecoveryReport]:
    kwargs.setdefault("segment_bytes", SMALL_SEGMENT_BYTES)
    return open_recovered(fs, ROOT, **kwargs)


def snapshot_of(store: Store) -> dict[str, tuple[int, bytes]]:
    """Every committed session: id -> (seq, body), read back from the log."""
    out = {}
    for doc_id, _entry in store.state.index.items("s"):
        doc = store.reads.read("s", doc_id)
        assert doc is not None
        out[doc_id] = (doc.seq, doc.body)
    return out


def all_documents(store: Store) -> dict[tuple[str, str], bytes]:
    """Every committed document of every kind: (kind, id) -> body, read back from the log."""
    out = {}
    for kind in store.state.index.kinds():
        for doc_id, _entry in store.state.index.items(kind):
            doc = store.reads.read(kind, doc_id)
            assert doc is not None
            out[(kind, doc_id)] = doc.body
    return out


def assert_clean(store: Store) -> None:
    checked, problems = store.verify()
    assert problems == [], problems
    assert checked == sum(store.state.index.count(k) for k in store.state.index.kinds())
    # and nothing indexed, earlier generations included, lies in a segment compaction
    # retired: a read handle kept open may still read it, but the next checkpoint unlinks it
    rows = [(i, e) for k in store.state.index.kinds() for i, e in store.state.index.items(k)]
    retired = [
        (i, e.seq, e.segment)
        for i, e in rows + store.state.index.earlier_rows()
        if e.segment not in store.state.log.used
    ]
    assert retired == [], retired


def locate_record(state_dir: Any, kind: str, doc_id: str, key: Any = None) -> tuple[str, int, int]:
    """(segment path, offset, length) of a document's committed record, read with the daemon
    stopped: the store is opened in process, which is also a clean recovery."""
    from sessionstored.storage.log.fs import RealFileSystem

    store, _ = open_recovered(RealFileSystem(), str(state_dir), key=key)
    try:
        entry = store.state.index.get(kind, doc_id)
        assert entry is not None, (kind, doc_id)
        return store.state.log.path(entry.segment), entry.offset, entry.length
    finally:
        store.close()
