# The recent committed changes, for watch: append at the end, read "everything
# after seq N" in O(log n + k), keep the newest `capacity` changes. The list is
# trimmed once it holds a quarter more than that, so appends stay amortised O(1)
# and memory stays within 1.25 x capacity (about 23 MB per 100,000 changes).
from __future__ import annotations

import bisect

from .mutations import Committed


class History:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: list[Committed] = []

    def _start(self) -> int:
        return max(0, len(self._items) - self.capacity)

    def extend(self, changes: list[Committed]) -> None:
        self._items.extend(changes)
        if len(self._items) > self.capacity + max(1024, self.capacity // 4):
            del self._items[: self._start()]

    def clear(self) -> None:
        self._items.clear()

    def oldest_seq(self) -> int | None:
        start = self._start()
        return self._items[start].seq if start < len(self._items) else None

    def after(self, seq: int, limit: int) -> list[Committed]:
        position = max(self._start(), bisect.bisect_right(self._items, seq, key=lambda c: c.seq))
        return self._items[position : position + limit]

    def __len__(self) -> int:
        return len(self._items) - self._start()
