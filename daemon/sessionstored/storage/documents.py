# What both engines hand the daemon about a document: where its committed
# generation is (Entry: seq, digest and size, and for the log the segment,
# offset and length of its record; PostgreSQL leaves those 0), the generation
# itself read back (Document), and which keys a page of `list` or
# `checkpoint_scan` covers (KeyRange, Found). A generation may carry an expiry
# (expires_at_ms, wall-clock ms since the epoch; 0 for none): from that moment
# on it is gone for every read, before any sweep removes it. A session's
# generation also says when it was committed (committed_at_ms; 0 where that is
# not known, and for the other kinds, whose history nobody reads).
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

from sessionstore.wire.value_class import value_class

SESSION = "s"


NEVER = 0  # expires_at_ms of a generation that does not expire


def expired(expires_at_ms: int, now_ms: int) -> bool:
    return NEVER < expires_at_ms <= now_ms


class Entry(NamedTuple):
    seq: int
    digest: bytes
    size: int
    segment: int
    offset: int
    length: int
    expires_at_ms: int = NEVER
    committed_at_ms: int = 0


@value_class
class Document:
    kind: str
    id: str
    seq: int
    digest: bytes
    body: bytes
    expires_at_ms: int = NEVER
    committed_at_ms: int = 0


class KeyRange(NamedTuple):
    """The keys of one kind that start with prefix and lie strictly between after and
    before: at most limit of them, in UTF-8 byte order (descending when reverse)."""

    kind: str
    prefix: str = ""
    after: str | None = None
    before: str | None = None
    limit: int = 1000
    reverse: bool = False


Found = tuple[list[tuple[str, Entry]], bool]  # (id, entry) in range order; more beyond?


class RangeReader(Protocol):
    """What deciding a txn reads of the committed state: the index, or PostgreSQL."""

    def get(self, kind: str, doc_id: str) -> Entry | None: ...
    def scan(self, wanted: KeyRange) -> Found: ...


def session_page(
    scan: Callable[[KeyRange], Found], prefix: str, after: str | None, limit: int
) -> tuple[list[str], str | None]:
    """`list`'s page: the ids, and the cursor for the next page (None at the end)."""
    found, more = scan(KeyRange(SESSION, prefix, after, limit=limit))
    ids = [doc_id for doc_id, _ in found]
    return ids, (ids[-1] if more and ids else None)
