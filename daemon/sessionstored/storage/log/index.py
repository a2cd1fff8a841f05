# The in-memory index: (kind, id) -> where the committed generation lies in the
# log (segment, offset, length of its record) and what it is (seq, digest,
# size of the body), plus every kind's ids in UTF-8 byte order for `list` and
# `checkpoint_scan`, and the bytes of live records per segment, which is what
# compaction decides by. Rebuilt at every start from the newest index
# checkpoint and the log after it.
#
# It also keeps each session's earlier generations (--keep-generations N):
# where the records of the last N generations before the current one lie.
# They count as live bytes, so compaction copies them like current records,
# and go with their session when it is removed. Keeping one costs a list
# append (and a pop from the front of at most N) when a save replaces it.
from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from ..documents import SESSION, Entry, Found, KeyRange, expired

BULK_CHANGES = 64  # a batch with more changes edits the sorted key lists once (apply())


class Prepared(NamedTuple):
    """A large batch's changes, ready to install (Index.prepare)."""

    final: dict[str, dict[str, Entry | None]]  # kind -> id -> its entry after the batch
    keys: dict[str, list[bytes]]  # kind -> its new sorted keys, where they were rebuilt
    dead: dict[str, int]  # kind -> keys of its sorted list no longer in its table
    live_delta: defaultdict[int, int]  # segment -> change in live bytes
    removed: set[tuple[str, str]]  # (kind, id) of the documents it removed


DEAD_KEYS_MIN = 4096  # a sorted list keeps this many dead keys, or a quarter of it


class Index:
    """Each kind's table (id -> Entry) and its ids sorted as UTF-8 bytes. A removal
    leaves its key in the sorted list ("dead": readers skip what the table lacks), so
    that removing costs a dict pop, not a list edit that moves up to n pointers (a
    million expiring documents swept 10,000 at a time would otherwise cost a pass over
    the list each time); prepare() drops the dead keys, in the writer's thread, once
    they are a quarter of the list."""

    def __init__(self, dead_keys_min: int = DEAD_KEYS_MIN) -> None:
        self.dead_keys_min = dead_keys_min
        self._entries: dict[str, dict[str, Entry]] = {}
        self._sorted_keys: dict[str, list[bytes]] = {}
        self._dead: dict[str, int] = {}
        self.live_bytes: defaultdict[int, int] = defaultdict(int)
        # session id -> the entries of its earlier generations kept, oldest first
        self.earlier: dict[str, list[Entry]] = {}

    @classmethod
    def from_entries(cls, rows: list[tuple[str, str, Entry]]) -> Index:
        """Bulk build: one sort at the end instead of one insertion per id. A session
        named more than once (a backup carries its earlier generations) keeps its highest
        seq as the current generation and the others as earlier ones."""
        index = cls()
        earlier: dict[str, list[Entry]] = {}
        for kind, doc_id, entry in rows:
            table = index._entries.setdefault(kind, {})
            old = table.get(doc_id)
            if old is not None and old.seq > entry.seq:
                old, entry = entry, old
            if old is not None:
                index.live_bytes[old.segment] -= old.length
                if kind == SESSION:
                    earlier.setdefault(doc_id, []).append(old)
            table[doc_id] = entry
            index.live_bytes[entry.segment] += entry.length
        index._sort_all()
        index.load_earlier({i: sorted(e, key=lambda e: e.seq) for i, e in earlier.items()})
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

    # -- earlier generations of sessions -------------------------------------------------

    def load_earlier(self, earlier: dict[str, list[Entry]]) -> None:
        for doc_id, entries in earlier.items():
            self.earlier[doc_id] = entries
            for entry in entries:
                self.live_bytes[entry.segment] += entry.length

    def retain(self, doc_id: str, old: Entry | None, removed: bool, keep: int) -> None:
        """A session's change, once applied: old was its current generation before it.
        A removal takes its earlier generations with it; a new generation moves old
        among them, and the oldest beyond keep goes."""
        if removed:
            for entry in self.earlier.pop(doc_id, ()):
                self.live_bytes[entry.segment] -= entry.length
            return
        if old is None or keep <= 0:
            return
        kept = self.earlier.get(doc_id)
        if kept is None:
            kept = self.earlier[doc_id] = []
        kept.append(old)
        self.live_bytes[old.segment] += old.length
        if len(kept) > keep:
            gone = kept.pop(0)
            self.live_bytes[gone.segment] -= gone.length

    def trim_earlier(self, keep: int) -> None:
        """At most keep earlier generations per session (a smaller --keep-generations)."""
        for doc_id, kept in list(self.earlier.items()):
            excess = max(0, len(kept) - keep)
            for entry in kept[:excess]:
                self.live_bytes[entry.segment] -= entry.length
            if excess == len(kept):
                del self.earlier[doc_id]
            elif excess:
                del kept[:excess]

    def generations(self, doc_id: str) -> list[Entry]:
        """A session's generations, newest first: the current one (if any) and the
        earlier ones kept."""
        current = self._entries.get(SESSION, {}).get(doc_id)
        if current is None:
            return []
        return [current, *reversed(self.earlier.get(doc_id, ()))]

    def earlier_rows(self) -> list[tuple[str, Entry]]:
        return [(doc_id, entry) for doc_id, kept in self.earlier.items() for entry in kept]

    def repoint_earlier(self, doc_id: str, old: Entry, new: Entry) -> bool:
        """Compaction moved an earlier generation's record: it now lies at new."""
        kept = self.earlier.get(doc_id, [])
        for position, entry in enumerate(kept):
            if entry == old:
                kept[position] = new
                self.live_bytes[old.segment] -= old.length
                self.live_bytes[new.segment] += new.length
                return True
        return False

    def _sort_all(self) -> None:
        self._sorted_keys = {
            kind: sorted(doc_id.encode("utf-8") for doc_id in table)
            for kind, table in self._entries.items()
        }
        self._dead = dict.fromkeys(self._entries, 0)

    def get(self, kind: str, doc_id: str) -> Entry | None:
        return self._entries.get(kind, {}).get(doc_id)

    def put(self, kind: str, doc_id: str, entry: Entry) -> None:
        table = self._entries.setdefault(kind, {})
        old = table.get(doc_id)
        if old is None:
            keys = self._sorted_keys.setdefault(kind, [])
            key = doc_id.encode("utf-8")
            at = bisect.bisect_left(keys, key)
            if at < len(keys) and keys[at] == key:  # a dead key comes back to life
                self._dead[kind] -= 1
            else:
                keys.insert(at, key)
        else:
            self.live_bytes[old.segment] -= old.length
        table[doc_id] = entry
        self.live_bytes[entry.segment] += entry.length

    def remove(self, kind: str, doc_id: str) -> None:
        old = self._entries.get(kind, {}).pop(doc_id, None)
        if old is None:
            return
        self.live_bytes[old.segment] -= old.length
        self._dead[kind] = self._dead.get(kind, 0) + 1  # its key stays, dead

    def apply(
        self, changes: Sequence[tuple[str, str, Entry | None]], prepared: Prepared | None = None
    ) -> None:
        """A batch's changes (None: removed), as put() and remove() one by one would make
        them. A large batch is prepare()d first, wherever that stalls no one: here only
        its table edits remain (a dict operation each) and its rebuilt key lists are
        swapped in, so no reader sees half a batch."""
        if prepared is None and len(changes) <= BULK_CHANGES:
            for kind, doc_id, entry in changes:
                if entry is None:
                    self.remove(kind, doc_id)
                else:
                    self.put(kind, doc_id, entry)
            return
        if prepared is None:
            prepared = self.prepare(changes)
        for kind, final in prepared.final.items():
            table = self._entries.setdefault(kind, {})
            for doc_id, entry in final.items():
                if entry is None:
                    table.pop(doc_id, None)
                else:
                    table[doc_id] = entry
        self._sorted_keys.update(prepared.keys)
        self._dead.update(prepared.dead)
        for segment, delta in prepared.live_delta.items():
            self.live_bytes[segment] += delta

    def wants_prepare(self, changes: Sequence[tuple[str, str, Entry | None]]) -> bool:
        """Whether a batch should be prepare()d: a large one, or one of a kind whose sorted
        list holds enough dead keys to be rebuilt."""
        if len(changes) > BULK_CHANGES:
            return True
        return any(
            self._dead.get(kind, 0)
            > max(self.dead_keys_min, len(self._sorted_keys.get(kind, ())) // 4)
            for kind in {kind for kind, _, _ in changes}
        )

    def prepare(self, changes: Sequence[tuple[str, str, Entry | None]]) -> Prepared:
        """What apply() needs of a large batch, computed beside the published index, which
        it only reads (the writer's thread does this while readers go on): each document's
        final entry, the live bytes, and a new sorted key list for a kind that gains keys
        (the published list and the new keys, sorted: one merge of two sorted runs) or
        whose dead keys reached a quarter of its list (filtered out)."""
        prepared = Prepared({}, {}, {}, defaultdict(int), set())
        for kind, doc_id, entry in changes:
            prepared.final.setdefault(kind, {})[doc_id] = entry
        for kind, final in prepared.final.items():
            table = self._entries.get(kind, {})
            keys = self._sorted_keys.get(kind, [])
            dead = self._dead.get(kind, 0)
            added: list[bytes] = []
            for doc_id, entry in final.items():
                old = table.get(doc_id)
                if old is not None:
                    prepared.live_delta[old.segment] -= old.length
                if entry is None:
                    if old is not None:
                        prepared.removed.add((kind, doc_id))
                        dead += 1
                    continue
                prepared.live_delta[entry.segment] += entry.length
                if old is None:
                    key = doc_id.encode("utf-8")
                    at = bisect.bisect_left(keys, key)
                    if at < len(keys) and keys[at] == key:
                        dead -= 1  # a dead key comes back to life
                    else:
                        added.append(key)
            if dead > max(self.dead_keys_min, len(keys) // 4):
                keys = [key for key in keys if _live_after(key.decode("utf-8"), table, final)]
                dead = 0
                if added:
                    keys += added
                    keys.sort()  # two sorted runs: one merge
                prepared.keys[kind] = keys
            elif added:
                prepared.keys[kind] = sorted(keys + added)  # a new list: the published is read
            prepared.dead[kind] = dead
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
        """The range's (id, entry) up to its limit, and whether another lies beyond the
        last one; with live_at_ms, the generations that expired by then are passed over
        like removed ones."""
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
        found: list[tuple[str, Entry]] = []
        positions = range(high - 1, low - 1, -1) if reverse else range(low, high)
        for position in positions:
            doc_id = keys[position].decode("utf-8")
            entry = table.get(doc_id)
            if entry is None or (
                live_at_ms is not None and expired(entry.expires_at_ms, live_at_ms)
            ):
                continue  # removed (a dead key), or expired
            if len(found) == limit:
                return found, True
            found.append((doc_id, entry))
        return found, False


def _live_after(doc_id: str, table: dict[str, Entry], final: dict[str, Entry | None]) -> bool:
    """Whether doc_id is in its table once the batch (final) is applied."""
    return (final[doc_id] if doc_id in final else table.get(doc_id)) is not None


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string starting with prefix
    (UTF-8 never holds 0xff, so prefix + 0xff is above all of them)."""
    return prefix + b"\xff"
