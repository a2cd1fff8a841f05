# The log engine's reads, on any thread and never waiting on the writer: from the
# in-memory index and the read cache, else the segment's bytes at the index's offset,
# checked and opened (a damaged record is CorruptRecord naming its file and offset).
# The writer publishes into what these read (store.py says when).
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sessionstore.wire.canonical import digest_bytes_of_canonical

from ..clock import epoch_ms
from ..documents import Document, Entry, Found, KeyRange, expired, session_page
from ..errors import CorruptRecord
from ..generations import generation_at
from ..mutations import (
    SESSION,
    Expire,
)
from ..sealing import Sealer
from .cache import ReadCache
from .expiries import Expiries
from .index import Index
from .index_checkpoint import DamageRow
from .records import read_document
from .segments import Log


class LogReads:
    cache: ReadCache
    index: Index
    log: Log
    sealer: Sealer
    seq: int
    lease: dict[str, Any] | None
    expiries: Expiries
    damaged: dict[int, DamageRow]  # id hash -> a committed record found damaged

    # -- reads (the readers' thread; never blocks on the writer) ------------------

    def head(self, kind: str, doc_id: str) -> Entry | None:
        """The committed generation's entry, None once it expired; CorruptRecord if a
        damaged record hid it."""
        damage = self.damage_of(kind, doc_id)
        if damage is not None:
            _, seq, path, offset, reason, _ = damage
            raise CorruptRecord(path, offset, f"{reason} (it held seq {seq} of this document)")
        entry = self.index.get(kind, doc_id)
        if entry is not None and expired(entry.expires_at_ms, epoch_ms()):
            return None
        return entry

    def generations(self, kind: str, doc_id: str) -> list[Entry]:
        """A session's current generation and the earlier ones kept, newest first; none
        once it expired."""
        if kind != SESSION or self.head(kind, doc_id) is None:
            return []
        return self.index.generations(doc_id)

    def read_generation(self, kind: str, doc_id: str, entry: Entry) -> Document:
        return dataclasses.replace(
            self.read_entry(kind, doc_id, entry), committed_at_ms=entry.committed_at_ms
        )

    @property
    def acknowledged_seq(self) -> int:
        return self.seq  # one writer: what it publishes is what it acknowledged

    def damage_of(self, kind: str, doc_id: str) -> DamageRow | None:
        """A damaged committed record that holds this document's newest generation."""
        if not self.damaged:
            return None
        for id_hash in self.sealer.id_hashes(kind, doc_id):
            row = self.damaged.get(id_hash)
            if row is not None:
                return row
        return None

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
        return self.cache.get(kind, doc_id, entry.seq, entry.digest)

    def remember(self, doc: Document) -> None:
        """Keep a document read elsewhere (read_entry in a thread) in the readers' cache."""
        self.cache.put(doc)

    def pin(self, entries: Sequence[Entry]) -> None:
        """The readers' thread, before read_entry() of these in another thread: their
        segments stay readable even if compaction retires them meanwhile."""
        pinned: list[int] = []
        try:
            for entry in entries:
                self.log.pin(entry.segment)
                pinned.append(entry.segment)
        except FileNotFoundError:
            for number in pinned:
                self.log.unpin(number)
            entry = entries[len(pinned)]
            path = self.log.path(entry.segment)
            raise CorruptRecord(path, entry.offset, "segment file missing") from None

    def unpin(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            self.log.unpin(entry.segment)

    def read_entries(self, kind: str, found: Sequence[tuple[str, Entry]]) -> list[Document | None]:
        return [self.read_entry(kind, doc_id, entry) for doc_id, entry in found]

    def read_entry(self, kind: str, doc_id: str, entry: Entry) -> Document:
        path = self.log.path(entry.segment)
        try:
            data = self.log.pread(entry.segment, entry.offset, entry.length)
        except FileNotFoundError:
            raise CorruptRecord(path, entry.offset, "segment file missing") from None
        doc = read_document(self.sealer, path, entry.offset, data, kind, doc_id)
        if doc.seq != entry.seq or doc.digest != entry.digest:
            raise CorruptRecord(
                path, entry.offset, f"record holds seq {doc.seq}, the index says seq {entry.seq}"
            )
        if digest_bytes_of_canonical(doc.body) != doc.digest:
            raise CorruptRecord(path, entry.offset, "body digest mismatch (bit rot)")
        return doc

    def session_count(self) -> int:
        return self.index.count(SESSION)

    # -- expiry (the event loop's thread, like publish) ----------------------------------

    def next_expiry_ms(self) -> int | None:
        return self.expiries.next_ms()

    def due_expirations(self, now_ms: int, limit: int) -> list[Expire]:
        return self.expiries.due(now_ms, limit)

    def retry_expiration(self, expire: Expire) -> None:
        """A due generation the sweep did not remove (the sweep failed, a full disk say,
        or the writer's clock had it unexpired): it is due again, unless a write since
        gave the document another expiry, or none, or removed it."""
        entry = self.index.get(expire.kind, expire.id)
        if entry is not None and entry.expires_at_ms == expire.expires_at_ms:
            self.expiries.schedule(expire.kind, expire.id, expire.expires_at_ms)

    def current_lease(self) -> dict[str, Any] | None:
        return self.lease  # the writer publishes every lease change here

    def list_sessions(
        self, prefix: str, after: str | None, limit: int
    ) -> tuple[list[str], str | None]:
        return session_page(self.scan, prefix, after, limit)

    def scan(self, wanted: KeyRange) -> Found:
        """The range's committed entries; CorruptRecord if a damaged record hid the newest
        generation of a document the page would hold (present or removed): the page would
        show an older state of it."""
        found, more = self.index.scan(wanted, live_at_ms=epoch_ms())
        if self.damaged:
            self._refuse_damaged(wanted, found, more)
        return found, more

    def _refuse_damaged(self, wanted: KeyRange, found: list[tuple[str, Entry]], more: bool) -> None:
        reach = found[-1][0] if more and found else None
        for id_hash, seq, path, offset, reason, doc_id in self.damaged.values():
            if doc_id is None or not doc_id.startswith(wanted.prefix):
                continue
            if wanted.after is not None and doc_id <= wanted.after:
                continue
            if wanted.before is not None and doc_id >= wanted.before:
                continue
            if reach is not None and (doc_id < reach if wanted.reverse else doc_id > reach):
                continue
            if id_hash in self.sealer.id_hashes(wanted.kind, doc_id):
                message = f"{reason} (it held seq {seq} of {doc_id!r}, in this range)"
                raise CorruptRecord(path, offset, message)


class LogCommittedState:
    """The committed state as the decisions see it (decide.py), from the index."""

    def __init__(self, store: LogReads, max_document_bytes: int) -> None:
        self.store = store
        self.lease = store.lease
        self.max_document_bytes = max_document_bytes

    def get(self, kind: str, doc_id: str) -> Entry | None:
        return self.store.index.get(kind, doc_id)

    def damaged(self, kind: str, doc_id: str) -> bool:
        return self.store.damage_of(kind, doc_id) is not None

    def body(self, kind: str, doc_id: str) -> bytes | None:
        doc = self.store.read(kind, doc_id, cached=False)  # the writer's thread: no cache
        return doc.body if doc is not None else None

    def body_at(self, kind: str, doc_id: str, at: int) -> bytes | None:
        entry = generation_at(self.store.generations(kind, doc_id), at, doc_id)
        return None if entry is None else self.store.read_entry(kind, doc_id, entry).body

    def scan(self, wanted: KeyRange) -> Found:
        return self.store.index.scan(wanted)
