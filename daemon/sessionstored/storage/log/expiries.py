# The log engine's expiry schedule: every generation with an expiry, by the
# moment it expires, in a heap. It is built from the index at start and grows
# as batches are published; an entry goes when the sweep takes it. The heap
# is only a hint: a generation rewritten since (with another expiry, or none)
# leaves a stale entry behind, which due() drops by checking the index, and
# the sweep is decided again in the writer, in commit order.
from __future__ import annotations

import heapq

from ..documents import NEVER
from ..mutations import Expire
from .index import Index


class Expiries:
    def __init__(self) -> None:
        self._heap: list[tuple[int, str, str]] = []  # (expires_at_ms, kind, id)

    def rebuild(self, index: Index) -> None:
        self._heap = [
            (entry.expires_at_ms, kind, doc_id)
            for kind, doc_id, entry in index.rows()
            if entry.expires_at_ms != NEVER
        ]
        heapq.heapify(self._heap)

    def add(self, kind: str, doc_id: str, expires_at_ms: int) -> None:
        heapq.heappush(self._heap, (expires_at_ms, kind, doc_id))

    def next_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def due(self, index: Index, now_ms: int, limit: int) -> list[Expire]:
        """At most limit generations that expired by now_ms and are still current."""
        due: list[Expire] = []
        while self._heap and self._heap[0][0] <= now_ms and len(due) < limit:
            expires_at_ms, kind, doc_id = heapq.heappop(self._heap)
            entry = index.get(kind, doc_id)
            if entry is not None and entry.expires_at_ms == expires_at_ms:
                due.append(Expire(kind, doc_id, expires_at_ms))
        return due
