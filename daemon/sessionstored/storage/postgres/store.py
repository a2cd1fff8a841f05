# The PostgreSQL backend: the same ops, with one database shared by the
# daemons of several hosts instead of the log.
#
# Theory of operation. A batch is one transaction, with synchronous_commit on,
# and a reply of ok means it committed. It locks the documents it touches,
# not the database, checks that what it decided on has not moved, and takes
# its seqs from the one row of ss_counter only as its last statement before
# COMMIT (batch.py says how), so batches of every daemon overlap while seq
# stays the commit order for the whole database, gapless: a reader that sees
# seq N committed sees every seq below N too. CAS, create-only, the fence,
# update, fork and txn hold across hosts. Each change is written to
# ss_documents and appended to ss_changes. ss_changes is the watch history
# and the truth; NOTIFY is only a wake-up. Every daemon follows ss_changes in
# seq order into its watch history (follow(), off the writer's path, which
# also sends this daemon's NOTIFY and trims ss_changes to the last
# history_changes rows), so a watcher on any host sees every host's commits,
# none skipped.
#
# With a key, ids, bodies and digests are sealed here before they reach the
# database. A document is found by a keyed hash of its id (keying.py, which
# also says how the key is rotated while the daemons serve). Ranges are then
# read by decrypting the kind's names, O(n) in the kind's documents. Without a
# key, ids are stored as their UTF-8 bytes, and bytea order is UTF-8 order.
#
# Failure rules. A lost connection or a failed statement fails the batch with
# io_error, never a false ok, and the next batch reconnects. When the COMMIT
# itself fails, the outcome is unknown; the batch is answered io_error, as
# when a daemon dies before its reply.
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Unpack

import cbor2
import psycopg

from sessionstore.wire.canonical import digest_bytes_of_canonical
from sessionstore.wire.codes import ErrorCode

from ..clock import epoch_ms
from ..documents import Document
from ..engine import CompactResult, Problem
from ..errors import (
    CorruptRecord,
    DatabaseRefused,
    DatabaseUnreachable,
    FatalStorageError,
    KeyingRefused,
    OlderDaemonsConnected,
    RestoreRefused,
)
from ..history import History
from ..mutations import LEASE, SESSION, Batch, Mutation, refused
from ..sealing import Key, Sealer
from .backup import PgBackup, snapshot
from .batch import BatchCommitter
from .connection import (
    CountedConnection,
    PgDatabase,
    PgReport,
    PgSettings,
    first_line,
    redacted,
)
from .following import PgFollowing
from .keying import REKEY_TO, SEALED_WITH, Keying
from .reads import PgReads
from .rekey import Progress, RekeyResult, rekey_database
from .schema import (
    SCHEMA_VERSION,
    ensure_schema,
    lock_writers,
    schema_exists,
)
from .sweeping import PgSweeping

RESTORE_ROWS = 1000  # documents per INSERT round trip of a restore

# a restore's sessions, all in ss_generations first: the newest of each becomes its row
# (each in a slot of its own, -seq), then the others take the ring's slots 0, 1, ...
# oldest first, and the row's generation says where the next save goes
RESTORE_SESSIONS = (
    "INSERT INTO ss_documents (kind, key, name, body, digest, seq, size, expires_at_ms,"
    " committed_at_ms) SELECT DISTINCT ON (kind, key) kind, key, name, body, digest, seq, size,"
    " expires_at_ms, committed_at_ms FROM ss_generations ORDER BY kind, key, seq DESC",
    "DELETE FROM ss_generations g USING ss_documents d"
    " WHERE g.kind = d.kind AND g.key = d.key AND g.seq = d.seq",
    "UPDATE ss_generations g SET slot = r.n FROM (SELECT kind, key, seq, row_number()"
    " OVER (PARTITION BY kind, key ORDER BY seq) - 1 AS n FROM ss_generations) r"
    " WHERE g.kind = r.kind AND g.key = r.key AND g.seq = r.seq",
    "UPDATE ss_documents d SET generation = c.n FROM (SELECT kind, key, count(*) AS n"
    " FROM ss_generations GROUP BY kind, key) c WHERE d.kind = c.kind AND d.key = c.key",
)


class PgStore:
    """The engine itself, made of parts that share one PgDatabase (connection.py), db:
    its connections, sealing and committed state. reads is PgReads (reads.py), expiry
    is PgSweeping (sweeping.py), follower is PgFollowing (following.py), and the
    batches are BatchCommitter's (batch.py). Here are opening, committing and publishing
    the batches, restore, rekey, backup and the maintenance ops."""

    blocking_reads = True  # reads are network round trips: the ops run them in threads
    local_commits = False
    maintenance = None  # no segments, checkpoints or spares to keep: the writer skips them

    def __init__(
        self,
        url: str,
        *,
        failpoint: Callable[[str], None] | None = None,
        **settings: Unpack[PgSettings],
    ) -> None:
        self.db = PgDatabase(url, **settings)
        self.reads = PgReads(self.db)
        self.expiry = PgSweeping(self.db)
        self.follower = PgFollowing(self.db)  # other daemons commit too: the server follows
        self._batches = BatchCommitter(self.db, self.reads, failpoint)

    # -- what the daemon reads of the engine ------------------------------------------

    @property
    def seq(self) -> int:
        return self.db.seq

    @property
    def history(self) -> History:
        return self.db.history

    @property
    def sealer(self) -> Sealer:
        return self.db.sealer

    @property
    def lease(self) -> dict[str, Any] | None:
        return self.db.lease

    @property
    def keep_generations(self) -> int:
        return self.db.keep_generations

    @property
    def batches_in_flight(self) -> int:
        return self.db.batches_in_flight

    @property
    def encrypted(self) -> bool:
        return self.db.encrypted

    @property
    def acknowledged_seq(self) -> int:
        """`stats` reports this: the follower may not have reached this daemon's own
        commits yet, and a reply's seq must not be ahead of what stats says after it."""
        return max(self.db.seq, self.db.acknowledged)

    # -- opening ------------------------------------------------------------------------

    def open(self) -> PgReport:
        """Connect, create or check the schema, load seq, the lease and the recent history.
        DatabaseUnreachable: retry later; DatabaseRefused: give up."""
        url = self.db.url
        try:
            return self._open_store()
        except psycopg.OperationalError as error:  # the server went away meanwhile
            self.close()
            raise DatabaseUnreachable(f"{redacted(url)}: {first_line(error)}") from None
        except psycopg.Error as error:  # e.g. no right to create the tables
            self.close()
            raise DatabaseRefused(f"{redacted(url)}: {first_line(error)}") from None
        except OlderDaemonsConnected as error:
            self.close()
            raise DatabaseRefused(f"{redacted(url)}: {error}") from None

    def _open_store(self) -> PgReport:
        db = self.db
        started = time.monotonic()
        report = PgReport(database=redacted(db.url))
        conn = db.writer_conn()
        meta, report.created_schema, epoch = ensure_schema(conn, db.keying.sealed_with)
        self._check_meta(meta)
        db.key_epoch = epoch
        db.open_pool()
        row = conn.execute("SELECT seq FROM ss_counter").fetchone()
        first = conn.execute("SELECT min(seq) FROM ss_changes").fetchone()
        conn.commit()
        counter = row[0] if row else 0
        # the history starts after what ss_changes no longer holds; a restored database
        # holds none of it, and its history starts at the backup's seq
        retained_from = counter if first is None or first[0] is None else first[0] - 1
        db.seq = max(0, counter - db.history_changes, min(retained_from, counter))
        self.follower.follow()
        db.lease = self.reads.read_lease(conn)
        conn.commit()
        counted = conn.execute("SELECT count(*) FROM ss_documents").fetchone()
        conn.commit()
        report.documents = counted[0] if counted else 0
        report.seq = db.seq
        report.duration_ms = (time.monotonic() - started) * 1000
        return report

    def rekey(
        self, old: Key, new: Key, *, rows_per_transaction: int, progress: Progress | None
    ) -> RekeyResult:
        """Rotates a sealed database from old to new while its daemons serve (rekey.py); this
        store is not open(): it holds both keys, so it is never a daemon that lacks one."""
        conn = self.db.writer_conn()
        exists = schema_exists(conn)
        conn.commit()
        if not exists:  # a wrong URL: never make an empty store there
            raise DatabaseRefused(f"{redacted(self.db.url)}: holds no sessionstore tables")
        meta, _, _ = ensure_schema(conn, self.db.keying.sealed_with)
        self._check_version(meta)
        return rekey_database(
            conn, old, new, rows_per_transaction=rows_per_transaction, progress=progress
        )

    def _check_meta(self, meta: dict[str, str]) -> None:
        self._check_version(meta)
        keying = Keying(meta.get(SEALED_WITH, ""), meta.get(REKEY_TO, ""))
        try:
            self.db.adopt(keying)
        except KeyingRefused as error:
            raise DatabaseRefused(str(error)) from None

    @staticmethod
    def _check_version(meta: dict[str, str]) -> None:
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            raise DatabaseRefused(
                f"the database holds schema version {meta.get('schema_version')}; this daemon "
                f"knows version {SCHEMA_VERSION}"
            )

    def backup_snapshot(self) -> PgBackup:
        return snapshot(self.db)

    # -- the writer ---------------------------------------------------------------

    def restore(self, documents: Iterable[Document], seq: int) -> int:
        """A backup's documents into this (empty) database, each at its own seq, the
        counter at the backup's: one transaction, so a restore that fails leaves the
        database as it was. Returns how many documents it wrote. Sessions go into
        ss_generations first, where the newest generation of each is then moved to
        ss_documents: the others are its earlier generations."""
        conn = self.db.writer_conn()
        written = 0
        with conn.transaction():
            lock_writers(conn)
            row = conn.execute("SELECT seq FROM ss_counter WHERE one = 1 FOR UPDATE").fetchone()
            counted = conn.execute("SELECT count(*) FROM ss_documents").fetchone()
            if (row and row[0]) or (counted and counted[0]):
                raise RestoreRefused(
                    f"{redacted(self.db.url)}: not empty (seq {row[0] if row else 0}); "
                    "restore builds a new store only"
                )
            rows: list[tuple[Any, ...]] = []
            for doc in documents:
                row = self.db.document_row(doc.kind, doc.id, doc.body, doc.digest, doc.seq)
                rows.append((*row, doc.expires_at_ms, doc.committed_at_ms))
                if len(rows) >= RESTORE_ROWS:
                    written += self._insert_documents(conn, rows)
                    rows = []
            written += self._insert_documents(conn, rows)
            for statement in RESTORE_SESSIONS:
                conn.execute(statement)
            conn.execute("UPDATE ss_counter SET seq = %s WHERE one = 1", (seq,))
        self.db.seq = self.db.acknowledged = seq
        return written

    @staticmethod
    def _insert_documents(conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]]) -> int:
        columns = "kind, key, name, body, digest, seq, size, expires_at_ms, committed_at_ms"
        values = "%s, %s, %s, %s, %s, %s, %s, %s, %s"
        with conn.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO ss_documents ({columns}) VALUES ({values})",
                [row for row in rows if row[0] != SESSION],
            )
            cursor.executemany(  # a slot of its own until RESTORE_SESSIONS
                f"INSERT INTO ss_generations ({columns}, slot) VALUES ({values}, %s)",
                [(*row, -row[5]) for row in rows if row[0] == SESSION],
            )
        return len(rows)

    def commit_durably(self, mutations: Sequence[Mutation]) -> Batch:
        if self.db.failed:
            raise FatalStorageError("the store failed earlier; nothing more is committed")
        conn = None
        try:
            conn = self.db.batch_conn()
            return self._commit(conn, mutations)
        except CorruptRecord as error:  # a row it decides on is damaged: nothing written
            failure = refused(ErrorCode.IO_ERROR, str(error))
            return Batch([failure] * len(mutations), last_seq=self.seq)
        except (psycopg.Error, DatabaseUnreachable, DatabaseRefused, OSError) as error:
            if conn is not None:  # rolled back, if not committed: the next batch reconnects
                conn.close()
            message = (
                f"the database failed this batch, nothing is acknowledged: {first_line(error)}"
            )
            failure = refused(ErrorCode.IO_ERROR, message)
            return Batch([failure] * len(mutations), last_seq=self.seq)

    def _commit(self, conn: CountedConnection, mutations: Sequence[Mutation]) -> Batch:
        batch = self._batches.commit(conn, mutations, epoch_ms())
        if batch.committed:
            self.db.batches += 1
        return batch

    def publish(self, batch: Batch) -> None:
        """The watch history comes from follow(), in global seq order; a local batch
        only refreshes the lease this daemon shows, and the seq it has acknowledged."""
        db = self.db
        if batch.committed:
            db.acknowledged = max(db.acknowledged, batch.last_seq)
            db.announce = True
        if batch.lease_body is not None:
            db.lease = cbor2.loads(batch.lease_body)
        elif any(c.kind == LEASE and c.digest is None for c in batch.committed):
            db.lease = None

    def fail(self) -> None:
        """The daemon is stopping after a fatal error: nothing more is committed."""
        self.db.failed = True

    # -- between batches -------------------------------------------------------------

    def verify(self) -> tuple[int, list[Problem]]:
        db = self.db
        problems: list[Problem] = []
        checked = 0
        # a named cursor lives in a transaction: the pool's connections are autocommit
        with db.reader() as conn, conn.transaction(), conn.cursor(name="ss_verify") as cursor:
            cursor.execute("SELECT kind, name, body, digest FROM ss_documents")
            for kind, name, body, digest in cursor:
                checked += 1
                what = kind.encode()
                try:
                    doc_id = db.open(bytes(name), b"name:" + what, "ss_documents").decode()
                    plain = db.open(bytes(body), b"body:" + what, f"ss_documents ({kind})")
                    stored = db.open(bytes(digest), b"digest:" + what, f"ss_documents ({kind})")
                except CorruptRecord as error:
                    problems.append(
                        Problem("unreadable", str(error), error.path, document_kind=kind)
                    )
                    continue
                if digest_bytes_of_canonical(plain) != stored:
                    mismatch = "the body does not match its digest"
                    problems.append(
                        Problem(
                            "digest_mismatch",
                            mismatch,
                            "ss_documents",
                            id=doc_id,
                            document_kind=kind,
                        )
                    )
        return checked, problems

    def compact(self) -> CompactResult:
        before = self._bytes_and_seq()[0]
        conn = self.db.writer_conn()
        with conn.transaction():
            row = conn.execute("SELECT seq FROM ss_counter").fetchone()
            seq = row[0] if row else 0
            removed = self.follower.trim(conn, seq)
        return CompactResult(seq, before, self._bytes_and_seq()[0], 0, removed, "")

    def _bytes_and_seq(self) -> tuple[int, int]:
        """The tables' bytes, and the database's seq (what every host has committed)."""
        with self.db.reader() as conn:
            row = conn.execute(
                "SELECT pg_total_relation_size('ss_documents')"
                " + pg_total_relation_size('ss_changes')"
                " + pg_total_relation_size('ss_generations'), (SELECT seq FROM ss_counter)"
            ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def stats(self) -> dict[str, Any]:
        size, database_seq = self._bytes_and_seq()
        return {
            "backend": "postgresql",
            "database": redacted(self.db.url),
            "wal_bytes": size,
            # commits of any host this daemon has not followed into its watch history yet
            "follower_lag_seqs": max(0, database_seq - self.seq),
            "history_oldest_seq": self.history.oldest_seq(),
            "sealed_with_key_id": self.sealer.key_id_hex,
            "batch_transactions": self._batches.timing.as_dict(),
            "rekeying_to_key_id": self.db.keying.rekey_to or None,
        }

    def close(self) -> None:
        """Every connection: the sweeper's, the follower's and db's."""
        self.expiry.close()
        self.follower.close()
        self.db.close()
