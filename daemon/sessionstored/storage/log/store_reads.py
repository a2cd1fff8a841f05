# The log engine's reads, on the readers' thread and never waiting on the writer:
# from the in-memory index and the read cache, else the segment's bytes at the
# index's offset, checked and opened (a damaged record is CorruptRecord naming its
# file and offset). The writer publishes into what these read (state.py says who
# writes what); read_entry() and pin() serve compaction, verify and backups too.
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sessionstore.wire.canonical import digest_bytes_of_canonical

from ..clock import epoch_ms
from ..documents import Document, Entry, Found, KeyRange, expired, session_page
from ..errors import CorruptRecord
from ..generations import generation_at
from ..mutations import SESSION
from .records import read_document
from .state import LogState


def read_entry(state: LogState, kind: str, doc_id: str, entry: Entry) -> Document:
    """The generation at this entry, read back and checked (any thread)."""
    log = state.log
    path = log.path(entry.segment)
    try:
        data = log.pread(entry.segment, entry.offset, entry.length)
    except FileNotFoundError:
        raise CorruptRecord(path, entry.offset, "segment file missing") from None
    doc = read_document(state.sealer, path, entry.offset, data, kind, doc_id)
    if doc.seq != entry.seq or doc.digest != entry.digest:
        raise CorruptRecord(
            path, entry.offset, f"record holds seq {doc.seq}, the index says seq {entry.seq}"
        )
    if digest_bytes_of_canonical(doc.body) != doc.digest:
        raise CorruptRecord(path, entry.offset, "body digest mismatch (bit rot)")
    return doc


def pin(state: LogState, entries: Sequence[Entry]) -> None:
    """The readers' thread, before read_entry() of these in another thread: their
    segments stay readable even if compaction retires them meanwhile."""
    pinned: list[int] = []
    try:
        for entry in entries:
            state.log.pin(entry.segment)
            pinned.append(entry.segment)
    except FileNotFoundError:
        for number in pinned:
            state.log.unpin(number)
        entry = entries[len(pinned)]
        path = state.log.path(entry.segment)
        raise CorruptRecord(path, entry.offset, "segment file missing") from None


def unpin(state: LogState, entries: Sequence[Entry]) -> None:
    for entry in entries:
        state.log.unpin(entry.segment)


class LogReads:
    def __init__(self, state: LogState) -> None:
        self.state = state

    def head(self, kind: str, doc_id: str) -> Entry | None:
        """The committed generation's entry, None once it expired; CorruptRecord if a
        damaged record hid it."""
        damage = self.state.damage_of(kind, doc_id)
        if damage is not None:
            _, seq, path, offset, reason, _ = damage
            raise CorruptRecord(path, offset, f"{reason} (it held seq {seq} of this document)")
        entry = self.state.index.get(kind, doc_id)
        if entry is not None and expired(entry.expires_at_ms, epoch_ms()):
            return None
        return entry

    def generations(self, kind: str, doc_id: str) -> list[Entry]:
        """A session's current generation and the earlier ones kept, newest first; none
        once it expired."""
        if kind != SESSION or self.head(kind, doc_id) is None:
            return []
        return self.state.index.generations(doc_id)

    def read_generation(self, kind: str, doc_id: str, entry: Entry) -> Document:
        return dataclasses.replace(
            self.read_entry(kind, doc_id, entry), committed_at_ms=entry.committed_at_ms
        )

    def read(self, kind: str, doc_id: str, *, cached: bool = True) -> Document | None:
        """The committed generation. cached=False for any thread but the readers' (the
        event loop's in the daemon): the cache is not shared between threads."""
        entry = self.head(kind, doc_id)
        if entry is None:
            return None
        if cached and (hit := self.cached(kind, doc_id, entry)) is not None:
            return hit
        doc = self.read_entry(kind, doc_id, entry)
        if cached:
            self.remember(doc)
        return doc

    def cached(self, kind: str, doc_id: str, entry: Entry) -> Document | None:
        """The cache's copy of this generation (the readers' thread only)."""
        return self.state.cache.get(kind, doc_id, entry.seq, entry.digest)

    def remember(self, doc: Document) -> None:
        """Keep a document read elsewhere (read_entry in a thread) in the readers' cache."""
        self.state.cache.put(doc)

    def pin(self, entries: Sequence[Entry]) -> None:
        pin(self.state, entries)

    def unpin(self, entries: Sequence[Entry]) -> None:
        unpin(self.state, entries)

    def read_entries(self, kind: str, found: Sequence[tuple[str, Entry]]) -> list[Document | None]:
        return [read_entry(self.state, kind, doc_id, entry) for doc_id, entry in found]

    def read_entry(self, kind: str, doc_id: str, entry: Entry) -> Document:
        return read_entry(self.state, kind, doc_id, entry)

    def session_count(self) -> int:
        return self.state.index.count(SESSION)

    def current_lease(self) -> dict[str, Any] | None:
        return self.state.lease  # the writer publishes every lease change here

    def list_sessions(
        self, prefix: str, after: str | None, limit: int
    ) -> tuple[list[str], str | None]:
        return session_page(self.scan, prefix, after, limit)

    def scan(self, wanted: KeyRange) -> Found:
        """The range's committed entries; CorruptRecord if a damaged record hid the newest
        generation of a document the page would hold (present or removed): the page would
        show an older state of it."""
        found, more = self.state.index.scan(wanted, live_at_ms=epoch_ms())
        if self.state.damaged:
            self._refuse_damaged(wanted, found, more)
        return found, more

    def _refuse_damaged(self, wanted: KeyRange, found: list[tuple[str, Entry]], more: bool) -> None:
        reach = found[-1][0] if more and found else None
        for id_hash, seq, path, offset, reason, doc_id in self.state.damaged.values():
            if doc_id is None or not doc_id.startswith(wanted.prefix):
                continue
            if wanted.after is not None and doc_id <= wanted.after:
                continue
            if wanted.before is not None and doc_id >= wanted.before:
                continue
            if reach is not None and (doc_id < reach if wanted.reverse else doc_id > reach):
                continue
            if id_hash in self.state.sealer.id_hashes(wanted.kind, doc_id):
                message = f"{reason} (it held seq {seq} of {doc_id!r}, in this range)"
                raise CorruptRecord(path, offset, message)


class LogCommittedState:
    """The committed state as the decisions see it (decide.py), from the index."""

    def __init__(self, reads: LogReads, max_document_bytes: int) -> None:
        self.reads = reads
        self.index = reads.state.index
        self.lease = reads.state.lease
        self.max_document_bytes = max_document_bytes

    def get(self, kind: str, doc_id: str) -> Entry | None:
        return self.index.get(kind, doc_id)

    def damaged(self, kind: str, doc_id: str) -> bool:
        return self.reads.state.damage_of(kind, doc_id) is not None

    def body(self, kind: str, doc_id: str) -> bytes | None:
        doc = self.reads.read(kind, doc_id, cached=False)  # the writer's thread: no cache
        return doc.body if doc is not None else None

    def body_at(self, kind: str, doc_id: str, at: int) -> bytes | None:
        entry = generation_at(self.reads.generations(kind, doc_id), at, doc_id)
        return None if entry is None else self.reads.read_entry(kind, doc_id, entry).body

    def scan(self, wanted: KeyRange) -> Found:
        return self.index.scan(wanted)
