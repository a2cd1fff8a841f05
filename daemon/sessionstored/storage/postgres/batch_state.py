# What a batch on PostgreSQL decides against (batch.py says how a batch runs): the
# rows it reads, the row cache of what this daemon last saw of each, and the
# committed state as decide.py sees it, each row it consulted remembered with its seq
# so that ss_stage can check that none has moved.
from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import cbor2
import psycopg

from ..documents import Entry, Found, KeyRange
from ..generations import generation_at
from ..mutations import (
    ANY,
    LEASE,
    LEASE_ID,
    Mutation,
    Put,
    Rewrite,
    Sweep,
    Txn,
)
from ..txn import TxnDelete, TxnPut
from .connection import PgDatabase
from .reads import PgReads

Row = tuple[str, bytes]  # (kind, key column)

CACHE_ROWS = 200_000  # rows the cache remembers before it starts afresh


def lock_id(kind: str, key: bytes) -> int:
    """A document's advisory lock: a hash of its key column (itself a keyed hash of the
    id in a sealed store), as a signed 64-bit key."""
    digest = hashlib.blake2b(kind.encode() + b"\0" + key, digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True)
class Known:
    """A row as last seen: its seq (0: there was no row), the plaintext digest, the size,
    for the lease its body, and its expiry (0: none)."""

    seq: int
    digest: bytes | None = None
    size: int = 0
    body: bytes | None = None
    expires_at_ms: int = 0


ABSENT = Known(0)


class RowCache:
    """(kind, key column) -> Known. Only a guess: ss_stage checks every row a batch decided
    on, so a stale row costs a retry, never a wrong decision."""

    def __init__(self, limit: int = CACHE_ROWS) -> None:
        self._rows: dict[Row, Known] = {}
        self._limit = limit
        self._lock = threading.Lock()

    def get(self, row: Row) -> Known | None:
        return self._rows.get(row)

    def learn(self, rows: dict[Row, Known]) -> None:
        with self._lock:
            if len(self._rows) + len(rows) > self._limit:
                self._rows.clear()
            self._rows.update(rows)

    def forget(self, rows: Sequence[Row]) -> None:
        with self._lock:
            for row in rows:
                self._rows.pop(row, None)

    def clear(self) -> None:
        with self._lock:
            self._rows.clear()


def documents_read(
    mutations: Sequence[Mutation],
) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """The documents a batch's decisions read (decide.py, txn.py), and those whose bodies
    they need (a Rewrite's, a txn put's that keeps fields). A save or a txn's put that
    names no condition reads none."""
    documents: set[tuple[str, str]] = set()
    bodies: set[tuple[str, str]] = set()
    for mutation in mutations:
        if isinstance(mutation, Txn):
            documents |= {(r.kind, r.id) for r in mutation.requires}
            for op in mutation.ops:
                if isinstance(op, TxnDelete) or (isinstance(op, TxnPut) and op.if_absent):
                    documents.add((op.kind, op.id))
                if isinstance(op, TxnPut) and op.keep:
                    bodies.add((op.kind, op.id))
        elif isinstance(mutation, Rewrite):
            bodies.add((mutation.kind, mutation.id))
            if mutation.source is not None:
                bodies.add(mutation.source)
        elif isinstance(mutation, Sweep):
            documents |= {(due.kind, due.id) for due in mutation.due}
        elif not (isinstance(mutation, Put) and mutation.expect is ANY):
            documents.add((mutation.kind, mutation.id))
    return documents | bodies, bodies


def guessed_absent(mutations: Sequence[Mutation]) -> set[tuple[str, str]]:
    """Documents that a batch may take to be absent when the cache knows nothing of
    them: those a txn's put keeps fields of (most such puts make a new item). ss_stage
    checks the guess like any row consulted; a wrong one costs a retry, with a read."""
    return {
        (op.kind, op.id)
        for mutation in mutations
        if isinstance(mutation, Txn)
        for op in mutation.ops
        if isinstance(op, TxnPut) and op.keep
    }


class PgCommittedState:
    """The committed state as a batch decides on it (decide.py's CommittedState): rows
    from the cache or read, each one consulted remembered with its seq for ss_stage;
    an exclusive batch reads ranges and earlier generations through reads, on its own
    connection (scan_conn)."""

    def __init__(
        self,
        db: PgDatabase,
        reads: PgReads,
        rows: dict[Row, Known],
        reread: Callable[[Row], Known],
    ) -> None:
        self.db = db
        self.reads = reads
        self.rows = rows
        self.reread = reread
        self.max_document_bytes = db.max_document_bytes
        self.consulted: dict[Row, int] = {}
        self.lease: dict[str, Any] | None = None
        body = self.body(LEASE, LEASE_ID)
        self.lease = cbor2.loads(body) if body is not None else None
        self.scan_conn: psycopg.Connection[Any] | None = None

    def _row(self, row: Row) -> Known:
        known = self.rows.get(row)
        if known is None:  # not foreseen: read it now (decided on, so checked too)
            known = self.rows[row] = self.reread(row)
        self.consulted[row] = known.seq
        return known

    def _present(self, kind: str, doc_id: str) -> Known | None:
        found = None
        for key in self.db.keys(kind, doc_id):
            known = self._row((kind, key))
            if found is None and known.digest is not None:
                found = known
        return found

    def get(self, kind: str, doc_id: str) -> Entry | None:
        known = self._present(kind, doc_id)
        if known is None or known.digest is None:
            return None
        return Entry(known.seq, known.digest, known.size, 0, 0, 0, known.expires_at_ms)

    def body(self, kind: str, doc_id: str) -> bytes | None:
        known = self._present(kind, doc_id)
        return None if known is None else known.body

    def damaged(self, kind: str, doc_id: str) -> bool:
        return False

    def body_at(self, kind: str, doc_id: str, at: int) -> bytes | None:
        """Only an exclusive batch reads an earlier generation: under the writers' lock."""
        assert self.scan_conn is not None, "an earlier generation is read only exclusive"
        entries = self.reads.generations_with(self.scan_conn, kind, doc_id)
        entry = generation_at(entries, at, doc_id)
        if entry is None:
            return None
        return self.reads.read_generation_with(self.scan_conn, kind, doc_id, entry).body

    def scan(self, wanted: KeyRange) -> Found:
        """Only an exclusive batch scans (delete_prefix): under the writers' lock."""
        assert self.scan_conn is not None, "a range is read only by an exclusive batch"
        return self.reads.scan_with(self.scan_conn, wanted)


def rows_to_read(db: PgDatabase, mutations: Sequence[Mutation]) -> tuple[list[Row], set[Row]]:
    """Every row a batch decides on, the lease's among them (read afresh under the
    writers' lock: the cache may be behind), and those whose bodies it needs."""
    documents, body_documents = documents_read(mutations)
    documents.add((LEASE, LEASE_ID))
    body_documents.add((LEASE, LEASE_ID))
    rows: list[Row] = []
    bodies: set[Row] = set()
    for kind, doc_id in sorted(documents):
        for key in db.keys(kind, doc_id):
            rows.append((kind, key))
            if (kind, doc_id) in body_documents:
                bodies.add((kind, key))
    return rows, bodies
