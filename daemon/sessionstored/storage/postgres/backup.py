# PostgreSQL's side of a backup (engine.BackupSnapshot): one REPEATABLE READ,
# READ ONLY transaction on a connection of its own, so every row it reads is of
# the same snapshot, the counter's seq included, while the other daemons and
# this one's readers and writer go on (MVCC: nobody waits for it). Rows come
# through a server-side cursor a chunk at a time, opened and checked as a read
# checks them: the documents, then the earlier generations of sessions kept.
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg import IsolationLevel

from sessionstore.wire.canonical import digest_bytes_of_canonical

from ..documents import SESSION, Document
from ..errors import CorruptRecord, DatabaseUnavailable
from .connection import PgDatabase, first_line, redacted

CHUNK_ROWS = 256


OpenField = Callable[[bytes, bytes, str], bytes]  # (sealed, what it is, where) -> plain


class PgBackup:
    """conn: in a REPEATABLE READ, READ ONLY transaction that already read seq and the
    count of documents (snapshot()); the snapshot owns it from here."""

    def __init__(
        self, conn: psycopg.Connection[Any], seq: int, documents: int, open_field: OpenField
    ) -> None:
        self._conn = conn
        self._seq = seq
        self._documents = documents
        self._open = open_field

    @property
    def seq(self) -> int:
        return self._seq

    @property
    def documents(self) -> int:
        return self._documents

    def chunks(self) -> Iterator[list[Document]]:
        for table in ("ss_documents", "ss_generations"):
            with self._conn.cursor(name="ss_backup") as cursor:
                cursor.execute(
                    "SELECT kind, name, seq, digest, body, expires_at_ms, committed_at_ms"
                    f" FROM {table}"
                )
                while rows := cursor.fetchmany(CHUNK_ROWS):
                    yield [self._document(*row) for row in rows]

    def _document(
        self,
        kind: str,
        name: Any,
        seq: int,
        digest: Any,
        body: Any,
        expires_at_ms: int,
        committed_at_ms: int,
    ) -> Document:
        what = kind.encode()
        doc_id = self._open(bytes(name), b"name:" + what, "ss_documents").decode()
        where = f"ss_documents ({kind}, {doc_id!r})"
        stored = self._open(bytes(digest), b"digest:" + what, where)
        plain = self._open(bytes(body), b"body:" + what, where)
        if digest_bytes_of_canonical(plain) != stored:
            raise CorruptRecord(f"postgresql {where}", 0, "body digest mismatch")
        at_ms = committed_at_ms if kind == SESSION else 0
        return Document(kind, doc_id, seq, stored, plain, expires_at_ms, at_ms)

    def close(self) -> None:
        if not self._conn.closed:
            self._conn.rollback()
            self._conn.close()


def snapshot(db: PgDatabase) -> PgBackup:
    """A connection of its own, so the pool's readers go on, in one REPEATABLE READ,
    READ ONLY transaction: every row of the backup is of that snapshot."""
    conn = db.connect()
    try:
        conn.isolation_level = IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        row = conn.execute("SELECT seq FROM ss_counter").fetchone()
        counted = conn.execute(
            "SELECT (SELECT count(*) FROM ss_documents) + (SELECT count(*) FROM ss_generations)"
        ).fetchone()
    except psycopg.Error as error:
        conn.close()
        raise DatabaseUnavailable(f"{redacted(db.url)}: {first_line(error)}") from error
    seq, documents = (int(row[0]) if row else 0), (int(counted[0]) if counted else 0)
    return PgBackup(conn, seq, documents, db.open)
