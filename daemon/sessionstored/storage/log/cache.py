# A bounded LRU of document bodies that were read from disk and verified. An
# entry is served only while its seq and digest still match the index, so a
# newer generation or a removal makes it stale without any invalidation call.
# `verify` bypasses it and reads every file, so bit rot is still found.
from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from ..documents import Document

DEFAULT_CAPACITY_BYTES = 64 * 1024 * 1024
LARGEST_SHARE = 8  # a document over capacity / 8 is not cached


class ReadCache(Protocol):
    """What the store asks of its read cache (DocumentCache; a test puts a watcher
    around one)."""

    capacity_bytes: int
    used_bytes: int
    hits: int
    misses: int

    def get(self, kind: str, doc_id: str, seq: int, digest: bytes) -> Document | None: ...
    def put(self, doc: Document) -> None: ...
    def discard_all(self, keys: set[tuple[str, str]]) -> None: ...
    def discard(self, kind: str, doc_id: str) -> None: ...


class DocumentCache:
    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY_BYTES) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._entries: OrderedDict[tuple[str, str], Document] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, kind: str, doc_id: str, seq: int, digest: bytes) -> Document | None:
        doc = self._entries.get((kind, doc_id))
        if doc is None or doc.seq != seq or doc.digest != digest:
            self.misses += 1
            return None
        self._entries.move_to_end((kind, doc_id))
        self.hits += 1
        return doc

    def put(self, doc: Document) -> None:
        size = len(doc.body)
        if size * LARGEST_SHARE > self.capacity_bytes:
            return
        self.discard(doc.kind, doc.id)
        self._entries[(doc.kind, doc.id)] = doc
        self.used_bytes += size
        while self.used_bytes > self.capacity_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.used_bytes -= len(evicted.body)

    def discard_all(self, keys: set[tuple[str, str]]) -> None:
        """discard() each of keys, walking whichever of the two is smaller."""
        if len(keys) > len(self._entries):
            for key in [key for key in self._entries if key in keys]:
                self.discard(*key)
        else:
            for key in keys:
                self.discard(*key)

    def discard(self, kind: str, doc_id: str) -> None:
        old = self._entries.pop((kind, doc_id), None)
        if old is not None:
            self.used_bytes -= len(old.body)
