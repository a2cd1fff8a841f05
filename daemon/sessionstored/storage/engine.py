# The one interface the daemon holds a storage engine by, whichever it is: the
# embedded log (log/store.py) or PostgreSQL (postgres/store.py). The daemon
# names an engine's class only where it starts one (cli.py).
#
# An engine is made of parts, each an object of its own: reads (never waiting
# for the writer: the log's from the event loop, blocking_reads False;
# PostgreSQL's from threads, True: network round trips) and expiry (what the
# sweep removes). Everything else comes from the single writer, one call at a
# time.
#
# What only one engine has is a capability, None on the other:
#   maintenance  the log's upkeep between batches: a spare segment ready for
#                the next rotation, compaction, index checkpoints;
#   follower     PostgreSQL's other hosts: their commits are followed into
#                this daemon's watch history.
# batches_in_flight says how many batches the writer may have committing at
# once: the log's one (one sync at a time), PostgreSQL's several (each on a
# connection of its own; the database orders them, postgres/batch.py).
# local_commits says a commit is a local write and sync (the log), never a
# network round trip: the event loop may wait for a lone small one itself
# (writer.py), for a bounded time.
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from .documents import Document, Entry, Found, KeyRange
from .history import History
from .mutations import Batch, Expire, Mutation
from .sealing import Sealer


@dataclass(frozen=True)
class CompactResult:
    seq: int
    wal_bytes_before: int
    wal_bytes_after: int
    segments_replaced: int
    records_moved: int
    checkpoint: str


@dataclass(frozen=True)
class Problem:
    """One thing `verify` found wrong. problem says what: the log's "unreadable",
    "damaged", "orphan" and "stray_temp"; PostgreSQL's "unreadable" and
    "digest_mismatch". On the wire problem is the map's "kind"; document_kind is
    the kind of document it concerns, where that is known."""

    problem: str
    error: str | None = None
    file: str | None = None
    offset: int | None = None
    seq: int | None = None
    id: str | None = None
    document_kind: str | None = None

    def as_wire(self) -> dict[str, Any]:
        fields = {"kind": self.problem, **asdict(self)}
        del fields["problem"]
        return {name: value for name, value in fields.items() if value is not None}


class StartReport(Protocol):
    """What opening the engine found (the log's recovery, PostgreSQL's connection), for
    `stats.recovery`."""

    def as_dict(self) -> dict[str, Any]: ...


class BackupSnapshot(Protocol):
    """The committed state at one seq, read while the engine goes on serving: every
    document, the lease among them. chunks() blocks (a thread's); close() releases
    what keeps the snapshot readable (the log's pinned segments, PostgreSQL's
    transaction)."""

    @property
    def seq(self) -> int: ...
    @property
    def documents(self) -> int: ...
    def chunks(self) -> Iterator[list[Document]]: ...
    def close(self) -> None: ...


class CompactionRun(Protocol):
    """One planned compaction: copy() runs in a background thread while batches go on,
    switch() on the writer's, between batches; it returns the records it repointed."""

    @property
    def victims(self) -> Sequence[int]: ...
    @property
    def number(self) -> int: ...  # the new segment's (0 when nothing was live)
    def copy(self) -> None: ...
    def switch(self) -> int: ...


class Spares(Protocol):  # the log's segments (segments.Log)
    def close_retired(self) -> None: ...  # read handles of segments compaction replaced
    def want_spare(self) -> bool: ...
    def prepare_spare(self) -> None: ...  # a background thread's: prepares a spare segment


class Compactions(Protocol):
    def due(self) -> bool: ...
    def plan(self, *, dead_only: bool = False) -> CompactionRun | None: ...


class IndexCheckpointing(Protocol):
    def due(self) -> bool: ...
    def write(self) -> str: ...  # an index checkpoint's path


class LogMaintenance(Protocol):
    @property
    def segments(self) -> Spares: ...
    @property
    def compaction(self) -> Compactions: ...
    @property
    def checkpoints(self) -> IndexCheckpointing: ...


class Follower(Protocol):
    def listen(self, stop: threading.Event, wake: Callable[[], None]) -> None: ...
    def follow(self) -> bool: ...  # other hosts' commits into history; True when any


class Reads(Protocol):
    """The committed state, read without waiting for the writer: the log's from its index
    in memory (the readers' thread, the event loop's in the daemon), PostgreSQL's one
    statement at a time on pooled connections (any thread)."""

    def head(self, kind: str, doc_id: str) -> Entry | None: ...
    def read(self, kind: str, doc_id: str, *, cached: bool = True) -> Document | None: ...
    def read_entry(self, kind: str, doc_id: str, entry: Entry) -> Document: ...  # any thread
    # a scan's documents, in its order; any thread. The log's are the generations at
    # the entries; PostgreSQL's (one query) each row as it is now, None for one removed
    # or expired since the scan: seq, digest and body always come from one generation
    def read_entries(
        self, kind: str, found: Sequence[tuple[str, Entry]]
    ) -> list[Document | None]: ...
    def cached(self, kind: str, doc_id: str, entry: Entry) -> Document | None: ...
    # a session's current generation and the earlier ones kept, newest first (generations.py)
    def generations(self, kind: str, doc_id: str) -> list[Entry]: ...
    def read_generation(self, kind: str, doc_id: str, entry: Entry) -> Document: ...  # any thread
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


class Expiry(Protocol):
    """What the sweep removes, and when next (on the event loop; in a thread when
    blocking_reads, as a query is)."""

    def next_ms(self) -> int | None: ...
    # at most limit due documents, from at most limit entries looked at (stale ones too)
    def due(self, now_ms: int, limit: int) -> list[Expire]: ...
    def retry(self, expire: Expire) -> None: ...  # one the sweep did not remove


class Engine(Protocol):
    blocking_reads: bool
    local_commits: bool  # a commit is a local write and sync, never a network round trip

    @property
    def reads(self) -> Reads: ...
    @property
    def expiry(self) -> Expiry: ...

    @property
    def batches_in_flight(self) -> int: ...  # commit_durably may run in this many threads
    @property
    def seq(self) -> int: ...  # the watch history's: every change up to it is in history
    @property
    def history(self) -> History: ...
    @property
    def sealer(self) -> Sealer: ...
    @property
    def lease(self) -> dict[str, Any] | None: ...  # as the last published batch left it
    @property
    def keep_generations(self) -> int: ...  # earlier generations of each session kept
    @property
    def maintenance(self) -> LogMaintenance | None: ...
    @property
    def follower(self) -> Follower | None: ...
    @property
    def acknowledged_seq(self) -> int: ...  # at least seq: every seq this daemon acknowledged
    @property
    def encrypted(self) -> bool: ...

    def stats(self) -> dict[str, Any]: ...
    def backup_snapshot(self) -> BackupSnapshot: ...  # the readers' thread

    # the writer: commit a batch of decided mutations, then publish it to readers
    def commit_durably(self, mutations: Sequence[Mutation]) -> Batch: ...
    def publish(self, batch: Batch) -> None: ...
    def fail(self) -> None: ...  # after a fatal error: commit nothing more

    # the writer, between batches
    def verify(self) -> tuple[int, list[Problem]]: ...
    def compact(self) -> CompactResult: ...
    def close(self) -> None: ...
