# The in-memory index: (kind, id) -> where the committed generation lies in the
# log (segment, offset, length of its record) and what it is (seq, digest,
# size of the body), plus the session ids in UTF-8 byte order for `list`, and
# the bytes of live records per segment, which is what compaction decides by.
# Rebuilt at every start from the newest index checkpoint and the log after it.
from __future__ import annotations

import bisect
from collections import defaultdict
from typing import NamedTuple

SESSION = "s"


class Entry(NamedTuple):
    seq: int
    digest: bytes
    size: int
    segment: int
    offset: int
    length: int


class Index:
    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Entry]] = {}
        self._sorted_session_keys: list[bytes] = []
        self.live_bytes: defaultdict[int, int] = defaultdict(int)

    @classmethod
    def from_entries(cls, rows: list[tuple[str, str, Entry]]) -> Index:
        """Bulk build: one sort at the end instead of one insertion per id."""
        index = cls()
        for kind, doc_id, entry in rows:
            table = index._entries.setdefault(kind, {})
            old = table.get(doc_id)
            if old is not None:
                index.live_bytes[old.segment] -= old.length
            table[doc_id] = entry
            index.live_bytes[entry.segment] += entry.length
        index._sorted_session_keys = sorted(
            doc_id.encode("utf-8") for doc_id in index._entries.get(SESSION, {})
        )
        return index

    @classmethod
    def from_columns(cls, tables: dict[str, tuple[list[str], list[Entry]]]) -> Index:
        """Bulk build from an index checkpoint's columns (each id once per kind)."""
        index = cls()
        live = index.live_bytes
        for kind, (ids, entries) in tables.items():
            index._entries[kind] = dict(zip(ids, entries, strict=True))
            for entry in entries:
                live[entry.segment] += entry.length
        index._sorted_session_keys = sorted(
            doc_id.encode("utf-8") for doc_id in index._entries.get(SESSION, {})
        )
        return index

    def get(self, kind: str, doc_id: str) -> Entry | None:
        return self._entries.get(kind, {}).get(doc_id)

    def put(self, kind: str, doc_id: str, entry: Entry) -> None:
        table = self._entries.setdefault(kind, {})
        old = table.get(doc_id)
        if old is None:
            if kind == SESSION:
                bisect.insort(self._sorted_session_keys, doc_id.encode("utf-8"))
        else:
            self.live_bytes[old.segment] -= old.length
        table[doc_id] = entry
        self.live_bytes[entry.segment] += entry.length

    def remove(self, kind: str, doc_id: str) -> None:
        table = self._entries.get(kind, {})
        old = table.pop(doc_id, None)
        if old is None:
            return
        self.live_bytes[old.segment] -= old.length
        if kind == SESSION:
            key = doc_id.encode("utf-8")
            position = bisect.bisect_left(self._sorted_session_keys, key)
            del self._sorted_session_keys[position]

    def count(self, kind: str) -> int:
        return len(self._entries.get(kind, {}))

    def items(self, kind: str) -> list[tuple[str, Entry]]:
        return list(self._entries.get(kind, {}).items())

    def kinds(self) -> list[str]:
        return list(self._entries)

    def rows(self) -> list[tuple[str, str, Entry]]:
        return [(k, i, e) for k, table in self._entries.items() for i, e in table.items()]

    def list_sessions(
        self, prefix: str, after: str | None, limit: int
    ) -> tuple[list[str], str | None]:
        keys = self._sorted_session_keys
        prefix_bytes = prefix.encode("utf-8")
        start = bisect.bisect_left(keys, prefix_bytes)
        if after is not None:
            start = max(start, bisect.bisect_right(keys, after.encode("utf-8")))
        ids: list[str] = []
        position = start
        while position < len(keys) and len(ids) < limit:
            key = keys[position]
            if not key.startswith(prefix_bytes):
                return ids, None
            ids.append(key.decode("utf-8"))
            position += 1
        more = position < len(keys) and keys[position].startswith(prefix_bytes)
        return ids, (ids[-1] if more and ids else None)
