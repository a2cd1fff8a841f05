# The in-memory index: (kind, id) -> where the committed generation lies in the
# log (segment, offset, length of its record) and what it is (seq, digest,
# size of the body), plus every kind's ids in UTF-8 byte order for `list` and
# `checkpoint_scan`, and the bytes of live records per segment, which is what
# compaction decides by. Rebuilt at every start from the newest index
# checkpoint and the log after it.
from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from ..documents import Entry, Found, KeyRange, expired

BULK_CHANGES = 64  # a batch with more changes edits the sorted key lists once (apply())


class Prepared(NamedTuple):
    """A large batch's changes, ready to install (Index.prepare)."""

    tables: dict[str, dict[str, Entry]]  # kind -> its new table
    keys: dict[str, list[bytes]]  # kind -> its new sorted keys
    live_delta: defaultdict[int, int]  # segment -> change in live bytes
    removed: set[tuple[str, str]]  # (kind, id) of the documents it removed


class Index:
    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Entry]] = {}
        self._sorted_keys: dict[str, list[bytes]] = {}
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
        index._sort_all()
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
        index._sort_all()
        return index

    def _sort_all(self) -> None:
        self._sorted_keys = {
            kind: sorted(doc_id.encode("utf-8") for doc_id in table)
            for kind, table in self._entries.items()
        }

    def get(self, kind: str, doc_id: str) -> Entry | None:
        return self._entries.get(kind, {}).get(doc_id)

    def put(self, kind: str, doc_id: str, entry: Entry) -> None:
        table = self._entries.setdefault(kind, {})
        old = table.get(doc_id)
        if old is None:
            bisect.insort(self._sorted_keys.setdefault(kind, []), doc_id.encode("utf-8"))
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
        keys = self._sorted_keys[kind]
        del keys[bisect.bisect_left(keys, doc_id.encode("utf-8"))]

    def apply(
        self, changes: Sequence[tuple[str, str, Entry | None]], prepared: Prepared | None = None
    ) -> None:
        """A batch's changes (None: removed), as put() and remove() one by one would make
        them. A large batch is prepare()d first, wherever that stalls no one, and installed
        here by swapping whole tables; one prepared here otherwise."""
        if prepared is None and len(changes) <= BULK_CHANGES:
            for kind, doc_id, entry in changes:
                if entry is None:
                    self.remove(kind, doc_id)
                else:
                    self.put(kind, doc_id, entry)
            return
        if prepared is None:
            prepared = self.prepare(changes)
        self._entries.update(prepared.tables)
        self._sorted_keys.update(prepared.keys)
        for segment, delta in prepared.live_delta.items():
            self.live_bytes[segment] += delta

    def prepare(self, changes: Sequence[tuple[str, str, Entry | None]]) -> Prepared:
        """The tables and sorted key lists of the kinds that changes touch, built beside the
        published ones, which it only reads: the writer's thread does this while readers go
        on, and apply() swaps them in at once, so no reader sees half a batch. Each sorted
        list is edited once, a filter and one merge of two sorted runs: an insort or a
        delete in a list of n keys moves up to n pointers, so 100,000 removals from 500,000
        keys cost seconds one by one."""
        prepared = Prepared({}, {}, defaultdict(int), set())
        tables = prepared.tables
        was_present: dict[str, dict[str, bool]] = {}
        for kind, doc_id, entry in changes:
            table = tables.get(kind)
            if table is None:
                if entry is None and kind not in self._entries:
                    continue  # nothing of that kind to remove
                table = tables[kind] = dict(self._entries.get(kind, {}))
            before = was_present.setdefault(kind, {})
            if doc_id not in before:
                before[doc_id] = doc_id in table
            old = table.pop(doc_id, None) if entry is None else table.get(doc_id)
            if old is not None:
                prepared.live_delta[old.segment] -= old.length
            if entry is None:
                prepared.removed.add((kind, doc_id))
            else:
                table[doc_id] = entry
                prepared.live_delta[entry.segment] += entry.length
        for kind, before in was_present.items():
            table = tables[kind]
            added = [key.encode("utf-8") for key, was in before.items() if not was and key in table]
            gone = {key.encode("utf-8") for key, was in before.items() if was and key not in table}
            keys = self._sorted_keys.get(kind, [])
            if gone:
                keys = [key for key in keys if key not in gone]
            if added:
                keys = keys + sorted(added)  # a new list: the published one is only read
                keys.sort()  # two sorted runs: one merge
            prepared.keys[kind] = keys
        return prepared

    def count(self, kind: str) -> int:
        return len(self._entries.get(kind, {}))

    def table(self, kind: str) -> dict[str, Entry]:
        """One kind's id -> entry, to read. The writer's thread reads it between batches,
        when nothing edits it: publish() runs only once the writer's call returned."""
        return self._entries.get(kind, {})

    def items(self, kind: str) -> list[tuple[str, Entry]]:
        return list(self._entries.get(kind, {}).items())

    def kinds(self) -> list[str]:
        return list(self._entries)

    def rows(self) -> list[tuple[str, str, Entry]]:
        return [(k, i, e) for k, table in self._entries.items() for i, e in table.items()]

    def scan(self, wanted: KeyRange, *, live_at_ms: int | None = None) -> Found:
        """The range's (id, entry), and whether more lie beyond the last one; with
        live_at_ms, the generations that expired by then are passed over (the page still
        holds up to limit of the others)."""
        if live_at_ms is not None:
            return self._live_scan(wanted, live_at_ms)
        kind, prefix, after, before, limit, reverse = wanted
        keys = self._sorted_keys.get(kind, [])
        table = self._entries.get(kind, {})
        prefix_bytes = prefix.encode("utf-8")
        low = bisect.bisect_left(keys, prefix_bytes)
        high = bisect.bisect_left(keys, _prefix_end(prefix_bytes)) if prefix_bytes else len(keys)
        if after is not None:
            low = max(low, bisect.bisect_right(keys, after.encode("utf-8")))
        if before is not None:
            high = min(high, bisect.bisect_left(keys, before.encode("utf-8")))
        if high <= low:
            return [], False
        if reverse:
            chosen = keys[max(low, high - limit) : high][::-1]
        else:
            chosen = keys[low : min(high, low + limit)]
        found = []
        for key in chosen:
            doc_id = key.decode("utf-8")
            found.append((doc_id, table[doc_id]))
        return found, high - low > limit

    def _live_scan(self, wanted: KeyRange, now_ms: int) -> Found:
        found: list[tuple[str, Entry]] = []
        while True:
            page, more = self.scan(wanted._replace(limit=wanted.limit - len(found)))
            found += [(i, e) for i, e in page if not expired(e.expires_at_ms, now_ms)]
            if not more or len(found) == wanted.limit:
                return found, more
            last = page[-1][0]  # every one of the page was looked at: go on after it
            wanted = wanted._replace(before=last) if wanted.reverse else wanted._replace(after=last)


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string starting with prefix
    (UTF-8 never holds 0xff, so prefix + 0xff is above all of them)."""
    return prefix + b"\xff"
