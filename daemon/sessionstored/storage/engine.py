# The storage interface the daemon's ops and writer use, whatever holds the
# data: the embedded log (store.Store) or PostgreSQL (postgres.PgStore). Reads
# never wait for the writer: the log's come from the event loop (blocking_reads
# False), PostgreSQL's from threads (True, network round trips). Everything
# else comes from the single writer, one call at a time. Only the log has
# segments, spares, index checkpoints and compaction to keep (has_log).
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .documents import Document, Entry, Found, KeyRange
from .history import History
from .log.compaction import CompactResult
from .mutations import Batch, Mutation
from .sealing import Sealer


class Backend(Protocol):
    has_log: bool
    blocking_reads: bool
    shared: bool
    seq: int  # the watch history's: every change up to it is in history
    acknowledged_seq: int  # at least seq, and every seq this daemon acknowledged
    lease: dict[str, Any] | None
    history: History
    sealer: Sealer
    checkpoint_seq: int

    # reads (the readers' thread)
    def head(self, kind: str, doc_id: str) -> Entry | None: ...
    def read(self, kind: str, doc_id: str, *, cached: bool = True) -> Document | None: ...
    def read_entry(self, kind: str, doc_id: str, entry: Entry) -> Document: ...  # any thread
    def cached(self, kind: str, doc_id: str, entry: Entry) -> Document | None: ...
    def remember(self, doc: Document) -> None: ...  # into the readers' cache
    # a read that leaves the readers' thread keeps its entries' files alive meanwhile
    def pin(self, entries: Sequence[Entry]) -> None: ...
    def unpin(self, entries: Sequence[Entry]) -> None: ...
    def list_sessions(
        self, prefix: str, after: str | None, limit: int
    ) -> tuple[list[str], str | None]: ...
    def scan(self, wanted: KeyRange) -> Found: ...
    def session_count(self) -> int: ...
    def current_lease(self) -> dict[str, Any] | None: ...
    def stats(self) -> dict[str, Any]: ...

    @property
    def encrypted(self) -> bool: ...

    # the writer: commit a batch of decided mutations, then publish it to readers
    def commit_durably(self, mutations: Sequence[Mutation]) -> Batch: ...
    def publish(self, batch: Batch) -> None: ...

    # the writer, between batches
    def verify(self) -> tuple[int, list[dict[str, Any]]]: ...
    def compact(self) -> CompactResult: ...
    def close(self) -> None: ...
