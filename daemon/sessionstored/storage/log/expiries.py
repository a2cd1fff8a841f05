# The log engine's expiry schedule: each live document's expiry (the pending ones), and
# the same in a heap by the moment it expires, for the sweep. It is built from the index
# at start and follows every published change: a rewrite with another expiry, or none,
# and a removal take the document's old expiry out of the pending ones; its heap entry
# stays behind, stale, until the sweep meets it or a drain drops it.
#
# So that stale entries never outgrow the live ones (a document rewritten a million
# times with a ttl would otherwise leave a million of them, each kept until its time),
# once they outnumber the pending expiries by STALE_ENTRIES_MIN the heap is drained: it
# becomes the draining heap, a new one takes the new entries, and each later change
# moves DRAIN_STEPS entries from the end of the draining heap (which keeps it a heap)
# into the new one, dropping the stale ones. A drain is spread over the changes that
# follow, never one pass over a whole heap on the event loop; the sweep reads both heaps
# until the draining one is empty. The entries held stay within a few per pending
# expiry. Taking due entries is bounded the same way: at most limit entries per call,
# stale ones counted, so a million stale entries coming due at once cost the sweep many
# short calls between which the event loop serves, not one long one.
from __future__ import annotations

import heapq

from ..documents import NEVER
from ..mutations import Expire
from .index import Index

STALE_ENTRIES_MIN = 1024  # stale heap entries allowed beyond the pending expiries' count
DRAIN_STEPS = 8  # draining heap entries moved (or dropped) per schedule change

HeapEntry = tuple[int, str, str]  # (expires_at_ms, kind, id)


class Expiries:
    def __init__(self) -> None:
        # what the sweep should take: kind -> id -> expires_at_ms (ids as keys: their
        # hashes are cached, a (kind, id) tuple's is computed at every lookup). A heap
        # entry is stale unless it matches; the index is what the writer decides by.
        self._pending: dict[str, dict[str, int]] = {}
        self._pending_count = 0
        self._heap: list[HeapEntry] = []
        self._draining: list[HeapEntry] = []

    def __len__(self) -> int:
        """Heap entries held, stale ones included: what the schedule costs in memory."""
        return len(self._heap) + len(self._draining)

    def rebuild(self, index: Index) -> None:
        self._pending = {}
        self._heap = []
        for kind, doc_id, entry in index.rows():
            if entry.expires_at_ms != NEVER:
                self._pending.setdefault(kind, {})[doc_id] = entry.expires_at_ms
                self._heap.append((entry.expires_at_ms, kind, doc_id))
        heapq.heapify(self._heap)
        self._pending_count = len(self._heap)
        self._draining = []

    def schedule(self, kind: str, doc_id: str, expires_at_ms: int) -> None:
        """The document's current generation expires at expires_at_ms (NEVER: does not
        expire, or was removed)."""
        table = self._pending.get(kind)
        if expires_at_ms == NEVER:
            if table is None or table.pop(doc_id, None) is None:
                return  # the common write: it had no expiry and has none
            self._pending_count -= 1
        else:
            if table is None:
                table = self._pending[kind] = {}
            before = table.get(doc_id)
            if before == expires_at_ms:
                return  # its entry is in a heap already
            table[doc_id] = expires_at_ms
            self._pending_count += before is None
            heapq.heappush(self._heap, (expires_at_ms, kind, doc_id))
        if self._draining or len(self._heap) > 2 * self._pending_count + STALE_ENTRIES_MIN:
            self._drain()

    def next_ms(self) -> int | None:
        """The earliest entry's moment (it may be stale: the sweep then finds nothing)."""
        earliest = self._earliest()
        return earliest[0][0] if earliest else None

    def due(self, now_ms: int, limit: int) -> list[Expire]:
        """The pending expiries among at most limit entries taken that are due by now_ms.
        Each goes out of the schedule; the sweep gives back one it failed to remove."""
        due: list[Expire] = []
        for _ in range(limit):
            earliest = self._earliest()
            if not earliest or earliest[0][0] > now_ms:
                break
            expires_at_ms, kind, doc_id = heapq.heappop(earliest)
            table = self._pending.get(kind)
            if table is not None and table.get(doc_id) == expires_at_ms:
                del table[doc_id]
                self._pending_count -= 1
                due.append(Expire(kind, doc_id, expires_at_ms))
        return due

    def _earliest(self) -> list[HeapEntry]:
        """The heap whose first entry is earliest (an empty one when both are)."""
        if self._draining and (not self._heap or self._draining[0] < self._heap[0]):
            return self._draining
        return self._heap

    def _drain(self) -> None:
        """Start a drain, or move the next DRAIN_STEPS entries of the one under way."""
        if not self._draining:
            self._draining, self._heap = self._heap, []
            return
        moved = self._draining[-DRAIN_STEPS:]
        del self._draining[-DRAIN_STEPS:]
        pending = self._pending
        for entry in moved:
            expires_at_ms, kind, doc_id = entry
            if pending[kind].get(doc_id) == expires_at_ms:
                heapq.heappush(self._heap, entry)
