# The PostgreSQL engine's reads: any thread, each on a pooled connection, every
# sealed field opened (and a missing row checked against a rotation, keying.py).
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import cbor2
import psycopg
from psycopg import sql

from sessionstore.wire.canonical import digest_bytes_of_canonical
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal

from ..clock import epoch_ms
from ..documents import Document, Entry, Found, KeyRange, expired, session_page
from ..errors import (
    CorruptRecord,
)
from ..mutations import LEASE, LEASE_ID, SESSION
from .connection import PgDatabase


class PgReads:
    """The engine's reads part: any thread, each read on a pooled connection of db's.
    read_lease and the *_with methods read on a connection given: the store's as it
    opens, an exclusive batch's under the writers' lock (batch_state.py)."""

    def __init__(self, db: PgDatabase) -> None:
        self.db = db

    def head(self, kind: str, doc_id: str) -> Entry | None:
        """The committed generation's entry, None once it expired."""
        with self.db.reader() as conn:
            entry = self._head_with(conn, kind, doc_id)
        return None if entry is None or expired(entry.expires_at_ms, epoch_ms()) else entry

    def _head_with(self, conn: psycopg.Connection[Any], kind: str, doc_id: str) -> Entry | None:
        row = self._row(conn, kind, doc_id, "seq, digest, size, expires_at_ms")
        return None if row is None else self.db.entry(kind, doc_id, *row)

    def _row(
        self, conn: psycopg.Connection[Any], kind: str, doc_id: str, columns: str
    ) -> tuple[Any, ...] | None:
        """A document's row under either key (the current key's first), or None; a row
        missing is checked against a rotation this daemon has not seen (keying.py)."""
        keys = self.db.keys(kind, doc_id)
        row = conn.execute(
            f"SELECT {columns} FROM ss_documents"
            " WHERE kind = %s AND key = ANY(%s) ORDER BY key = %s DESC LIMIT 1",
            (kind, keys, keys[0]),
        ).fetchone()
        if row is None:
            self.db.check_missing(conn)
        return row

    def generations(self, kind: str, doc_id: str) -> list[Entry]:
        """A session's row and its earlier generations kept (ss_generations), newest first:
        at most keep_generations of those, though a session not saved since the setting
        shrank holds more until its next save trims them."""
        if kind != SESSION:
            return []
        with self.db.reader() as conn:
            return self.generations_with(conn, kind, doc_id)

    def generations_with(
        self, conn: psycopg.Connection[Any], kind: str, doc_id: str
    ) -> list[Entry]:
        keys = self.db.keys(kind, doc_id)
        rows = conn.execute(
            "(SELECT seq, digest, size, expires_at_ms, committed_at_ms, true FROM ss_documents"
            "  WHERE kind = %s AND key = ANY(%s))"
            " UNION ALL (SELECT seq, digest, size, expires_at_ms, committed_at_ms, false"
            "  FROM ss_generations WHERE kind = %s AND key = ANY(%s) ORDER BY seq DESC LIMIT %s)"
            " ORDER BY 6 DESC, 1 DESC",
            (kind, keys, kind, keys, self.db.keep_generations),
        ).fetchall()
        if not rows or not rows[0][5] or expired(rows[0][3], epoch_ms()):
            return []  # no session (its leftovers, if any, go with its next removal or save)
        where = f"ss_documents ({kind}, {doc_id!r})"
        return [
            Entry(seq, self.db.open(digest, b"digest:" + kind.encode(), where), size, 0, 0, 0,
                  expires_at_ms, committed_at_ms)
            for seq, digest, size, expires_at_ms, committed_at_ms, _ in rows
        ]  # fmt: skip

    def read_generation(self, kind: str, doc_id: str, entry: Entry) -> Document:
        with self.db.reader() as conn:
            return self.read_generation_with(conn, kind, doc_id, entry)

    def read_generation_with(
        self, conn: psycopg.Connection[Any], kind: str, doc_id: str, entry: Entry
    ) -> Document:
        keys = self.db.keys(kind, doc_id)
        row = conn.execute(
            "SELECT seq, digest, body, expires_at_ms FROM ss_documents"
            " WHERE kind = %s AND key = ANY(%s) AND seq = %s"
            " UNION ALL SELECT seq, digest, body, expires_at_ms FROM ss_generations"
            " WHERE kind = %s AND key = ANY(%s) AND seq = %s LIMIT 1",
            (kind, keys, entry.seq, kind, keys, entry.seq),
        ).fetchone()
        if row is None:  # a save trimmed it since it was listed
            raise Refusal(
                ErrorCode.COMPACTED,
                f"session {doc_id!r}: the generation at seq {entry.seq} is no longer kept",
            )
        doc = self._document(kind, doc_id, *row)
        return dataclasses.replace(doc, committed_at_ms=entry.committed_at_ms)

    def read(self, kind: str, doc_id: str, *, cached: bool = True) -> Document | None:
        """The committed generation, None once it expired."""
        with self.db.reader() as conn:
            doc = self._read_with(conn, kind, doc_id)
        return None if doc is None or expired(doc.expires_at_ms, epoch_ms()) else doc

    def cached(self, kind: str, doc_id: str, entry: Entry) -> Document | None:
        return None  # no cache: every read is the database's

    def remember(self, doc: Document) -> None:
        pass

    def pin(self, entries: Sequence[Entry]) -> None:
        pass  # rows, not files: nothing to keep alive

    def unpin(self, entries: Sequence[Entry]) -> None:
        pass

    def read_entry(self, kind: str, doc_id: str, entry: Entry) -> Document:
        doc = self.read(kind, doc_id)
        if doc is None:
            raise CorruptRecord(f"postgresql ss_documents ({kind}, {doc_id!r})", 0, "gone")
        return doc

    def read_entries(self, kind: str, found: Sequence[tuple[str, Entry]]) -> list[Document | None]:
        """A scan's documents in one query instead of a round trip each: each row as it is
        now (a write may have replaced it since the scan listed it), None for one removed
        or expired since."""
        if not found:
            return []
        named = {key: doc_id for doc_id, _ in found for key in self.db.keys(kind, doc_id)}
        with self.db.reader() as conn:
            rows = conn.execute(
                "SELECT key, seq, digest, body, expires_at_ms FROM ss_documents"
                " WHERE kind = %s AND key = ANY(%s)",
                (kind, list(named)),
            ).fetchall()
        now_ms = epoch_ms()
        docs: dict[str, Document] = {}
        for key, seq, digest, body, expires_at_ms in rows:
            doc_id = named[bytes(key)]
            held = docs.get(doc_id)  # a rotation may hold it under both keys: the newest
            if not expired(expires_at_ms, now_ms) and (held is None or seq > held.seq):
                docs[doc_id] = self._document(kind, doc_id, seq, digest, body, expires_at_ms)
        return [docs.get(doc_id) for doc_id, _ in found]

    def _read_with(self, conn: psycopg.Connection[Any], kind: str, doc_id: str) -> Document | None:
        row = self._row(conn, kind, doc_id, "seq, digest, body, expires_at_ms")
        return None if row is None else self._document(kind, doc_id, *row)

    def _document(
        self, kind: str, doc_id: str, seq: int, digest: Any, body: Any, expires_at_ms: int
    ) -> Document:
        where = f"ss_documents ({kind}, {doc_id!r})"
        entry = self.db.entry(kind, doc_id, seq, digest, 0, expires_at_ms)
        plain = self.db.open(body, b"body:" + kind.encode(), where)
        if digest_bytes_of_canonical(plain) != entry.digest:
            raise CorruptRecord(f"postgresql {where}", 0, "body digest mismatch")
        return Document(kind, doc_id, entry.seq, entry.digest, plain, expires_at_ms)

    def scan(self, wanted: KeyRange) -> Found:
        """The range's entries, passing over the generations that expired (a page still
        holds up to its limit of the others)."""
        now_ms = epoch_ms()
        found: list[tuple[str, Entry]] = []
        with self.db.reader() as conn:
            while True:
                page, more = self.scan_with(conn, wanted._replace(limit=wanted.limit - len(found)))
                found += [(i, e) for i, e in page if not expired(e.expires_at_ms, now_ms)]
                if not more or len(found) == wanted.limit:
                    return found, more
                last = page[-1][0]
                wanted = (
                    wanted._replace(before=last) if wanted.reverse else wanted._replace(after=last)
                )

    def scan_with(self, conn: psycopg.Connection[Any], wanted: KeyRange) -> Found:
        if self.db.sealer.encrypted:
            return self._scan_sealed(conn, wanted)
        kind, prefix, after, before, limit, reverse = wanted
        low, high = prefix.encode(), prefix.encode() + b"\xff"
        clauses = [sql.SQL("kind = %s AND key >= %s AND key < %s")]
        params: list[Any] = [kind, low, high]
        if after is not None:
            clauses.append(sql.SQL("key > %s"))
            params.append(after.encode())
        if before is not None:
            clauses.append(sql.SQL("key < %s"))
            params.append(before.encode())
        query = sql.SQL(
            "SELECT key, seq, digest, size, expires_at_ms FROM ss_documents WHERE {}"
            " ORDER BY key {} LIMIT %s"
        ).format(sql.SQL(" AND ").join(clauses), sql.SQL("DESC" if reverse else "ASC"))
        rows = conn.execute(query, [*params, limit + 1]).fetchall()
        found = [
            (bytes(key).decode(), self.db.entry(kind, bytes(key).decode(), *rest))
            for key, *rest in rows[:limit]
        ]
        return found, len(rows) > limit

    def _scan_sealed(self, conn: psycopg.Connection[Any], wanted: KeyRange) -> Found:
        kind, prefix, after, before, limit, reverse = wanted
        rows = conn.execute(
            "SELECT name, seq, digest, size, expires_at_ms FROM ss_documents WHERE kind = %s",
            (kind,),
        ).fetchall()
        named = []
        for name, seq, digest, size, expires_at_ms in rows:
            doc_id = self.db.open(bytes(name), b"name:" + kind.encode(), "ss_documents").decode()
            key = doc_id.encode()
            if not key.startswith(prefix.encode()):
                continue
            if (after is not None and key <= after.encode()) or (
                before is not None and key >= before.encode()
            ):
                continue
            named.append((key, doc_id, seq, digest, size, expires_at_ms))
        named.sort(reverse=reverse)
        found = [(i, self.db.entry(kind, i, s, d, z, x)) for _, i, s, d, z, x in named[:limit]]
        return found, len(named) > limit

    def list_sessions(
        self, prefix: str, after: str | None, limit: int
    ) -> tuple[list[str], str | None]:
        return session_page(self.scan, prefix, after, limit)

    def session_count(self) -> int:
        with self.db.reader() as conn:
            row = conn.execute(
                "SELECT count(*) FROM ss_documents WHERE kind = %s", (SESSION,)
            ).fetchone()
        return row[0] if row else 0

    def current_lease(self) -> dict[str, Any] | None:
        with self.db.reader() as conn:
            return self.read_lease(conn)

    def read_lease(self, conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
        doc = self._read_with(conn, LEASE, LEASE_ID)
        return cbor2.loads(doc.body) if doc is not None else None
