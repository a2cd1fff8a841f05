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

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import cbor2
import psycopg
from psycopg import IsolationLevel, sql
from psycopg_pool import ConnectionPool, PoolTimeout

from sessionstore.wire.canonical import digest_bytes_of_canonical
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal

from ..documents import Document, Entry, Found, KeyRange, expired, session_page
from ..engine import CompactResult, Problem
from ..errors import (
    CorruptRecord,
    DatabaseRefused,
    DatabaseUnavailable,
    DatabaseUnreachable,
    FatalStorageError,
    KeyingRefused,
    OlderDaemonsConnected,
    RestoreRefused,
    SealError,
)
from ..generations import DEFAULT_KEEP_GENERATIONS
from ..history import History
from ..mutations import LEASE, LEASE_ID, SESSION, Batch, Committed, Expire, Mutation, refused
from ..sealing import Key, Sealer
from .backup import PgBackup
from .batch import BatchCommitter
from .keying import REKEY_TO, SEALED_WITH, Keying, application_name, read_keying, row_key, row_keys
from .rekey import Progress, RekeyResult, rekey_database
from .schema import (
    NOTIFY_CHANNEL,
    ROWS_BY_KEY,
    SCHEMA_VERSION,
    SWEEPER_LOCK,
    ensure_schema,
    lock_writers,
    schema_exists,
)

log = logging.getLogger("sessionstored.postgres")

FOLLOW_PAGE = 1000
RETENTION_EVERY_BATCHES = 500
READ_POOL_CONNECTIONS = 4
CONNECT_TIMEOUT_S = 10
# a database host that vanishes (a partition, a dead machine) is noticed within about
# KEEPALIVE_IDLE_S + KEEPALIVE_COUNT * KEEPALIVE_INTERVAL_S, and the batch fails
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3
CONNECTION_OPTIONS = {
    "connect_timeout": CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": KEEPALIVE_IDLE_S,
    "keepalives_interval": KEEPALIVE_INTERVAL_S,
    "keepalives_count": KEEPALIVE_COUNT,
}
RESTORE_ROWS = 1000  # documents per INSERT round trip of a restore
READ_TIMEOUT_S = 10.0  # a read waits this long for a pooled connection, then io_error


# getaddrinfo's words (glibc, musl, BSD) for a name that does not exist (EAI_NONAME), as
# psycopg and libpq pass them on; a DNS server that does not answer says "Temporary
# failure in name resolution" (EAI_AGAIN) instead: an outage, retried
UNRESOLVED_HOST = ("Name or service not known", "Name does not resolve", "nodename nor servname")


FATAL_SQLSTATES = {"28P01", "28000", "3D000", "42501"}  # password, authorization, no db, privilege


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else repr(error)


def _now_ms() -> int:
    return int(time.time() * 1000)


def redacted(url: str) -> str:
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "(unparsable URL)"
    hosts = str(info.get("host") or "local socket").split(",")
    ports = [port or "5432" for port in str(info.get("port") or "").split(",")]
    if len(ports) == 1:  # one port for every host
        ports = ports * len(hosts)
    where = ",".join(f"{host}:{port}" for host, port in zip(hosts, ports, strict=False))
    user, name = info.get("user", ""), info.get("dbname", "")
    attrs = info.get("target_session_attrs")
    return f"postgresql://{user}@{where}/{name}" + (
        f"?target_session_attrs={attrs}" if attrs else ""
    )


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


@dataclass
class PgReport:
    """What a start found, in the shape of the log engine's recovery report."""

    seq: int = 0
    documents: int = 0
    created_schema: bool = False
    database: str = ""
    duration_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": "postgresql",
            "database": self.database,
            "created_schema": self.created_schema,
            "documents": self.documents,
            "seq": self.seq,
            "duration_ms": round(self.duration_ms, 1),
        }

    def summary(self) -> str:
        made = "created the schema; " if self.created_schema else ""
        return f"{self.database}: {made}{self.documents} documents, seq {self.seq}"


class PgStore:
    blocking_reads = True  # reads are network round trips: the ops run them in threads
    maintenance = None  # no segments, checkpoints or spares to keep: the writer skips them

    def __init__(
        self,
        url: str,
        *,
        key: Key | None = None,
        previous_key: Key | None = None,
        password: str | None = None,
        history_changes: int = 100_000,
        keep_generations: int = DEFAULT_KEEP_GENERATIONS,
        max_document_bytes: int = 256 * 1024 * 1024,
        failpoint: Callable[[str], None] | None = None,
        batches_in_flight: int = 1,
    ) -> None:
        self.keep_generations = keep_generations
        self.batches_in_flight = batches_in_flight  # each on a connection of its own
        self.url = url
        self.password = password
        self.held = [k for k in (key, previous_key) if k is not None]
        self.sealer = Sealer(key)  # until open() reads what the database says (keying.py)
        self.keying = Keying(key.key_id_hex if key else "")
        self._key_epoch = -1
        self.history = History(history_changes)
        self.history_changes = history_changes
        self.max_document_bytes = max_document_bytes
        self.seq = 0
        self._acknowledged = 0
        self.lease: dict[str, Any] | None = None
        self.batches = 0
        self._writer: psycopg.Connection[Any] | None = None
        self._failed = False
        self._keying_refused: str | None = None  # why this daemon must stop (keying.py)
        self._follow_lock = threading.Lock()
        self._pool: ConnectionPool[Any] | None = None
        self._batches = BatchCommitter(self, failpoint)
        self._batch_conns = threading.local()  # the writer's threads', one each
        self._opened: list[psycopg.Connection[Any]] = []  # every one, to close
        self._follower: psycopg.Connection[Any] | None = None
        self._sweep_lock = threading.Lock()
        self._sweeper: psycopg.Connection[Any] | None = None  # holds SWEEPER_LOCK once taken
        self._sweeping = False
        self._announce = False  # this daemon committed since the last NOTIFY
        self._announcer_pid = 0  # the backend that sends them: the listener skips its own
        self._trimmed_at_batch = 0

    # -- connections ---------------------------------------------------------------

    def _connect(self, **options: Any) -> psycopg.Connection[Any]:
        kwargs: dict[str, Any] = {**self._connection_options(), **options}
        if self.password is not None:
            kwargs["password"] = self.password
        try:
            conn = psycopg.connect(self.url, **kwargs)
        except psycopg.ProgrammingError as error:  # the URL itself
            raise DatabaseRefused(f"bad database URL: {error}") from None
        except psycopg.OperationalError as error:
            text = _first_line(error)
            if any(
                state in text
                for state in ("password authentication", "does not exist", "no password")
            ):
                raise DatabaseRefused(f"{redacted(self.url)}: {text}") from None
            unresolved = any(words in text for words in UNRESOLVED_HOST)
            raise DatabaseUnreachable(
                f"{redacted(self.url)}: {text}", unresolved=unresolved
            ) from None
        conn.execute("SET synchronous_commit TO on")
        conn.commit()
        return conn

    def _connection_options(self) -> dict[str, Any]:
        return {**CONNECTION_OPTIONS, "application_name": application_name(self.held)}

    def _writer_conn(self) -> psycopg.Connection[Any]:
        """Autocommit: a batch is one statement, committed as it ends (batch.py), or an
        explicit transaction."""
        if self._writer is None or self._writer.closed or self._writer.broken:
            self._writer = self._connect(autocommit=True)
        return self._writer

    def _batch_conn(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._batch_conns, "conn", None)
        if conn is None or conn.closed or conn.broken:
            conn = self._batch_conns.conn = self._connect(autocommit=True)
            for setting in ROWS_BY_KEY:
                conn.execute(f"SET {setting} TO off")
            self._opened = [c for c in self._opened if not c.closed] + [conn]
        return conn

    def _follower_conn(self) -> psycopg.Connection[Any]:
        if self._follower is None or self._follower.closed or self._follower.broken:
            self._follower = self._connect(autocommit=True)
        return self._follower

    @contextmanager
    def _reader(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; a database that fails or does not answer is an OSError
        (DatabaseUnavailable), which a read answers as io_error."""
        assert self._pool is not None, "open() first"
        if self._failed:
            raise DatabaseUnavailable("the daemon is stopping after a fatal error")
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.Error, PoolTimeout) as error:
            raise DatabaseUnavailable(f"{redacted(self.url)}: {_first_line(error)}") from error

    def open(self) -> PgReport:
        """Connect, create or check the schema, load seq, the lease and the recent history.
        DatabaseUnreachable: retry later; DatabaseRefused: give up."""
        try:
            return self._open_store()
        except psycopg.OperationalError as error:  # the server went away meanwhile
            self.close()
            raise DatabaseUnreachable(f"{redacted(self.url)}: {_first_line(error)}") from None
        except psycopg.Error as error:  # e.g. no right to create the tables
            self.close()
            raise DatabaseRefused(f"{redacted(self.url)}: {_first_line(error)}") from None
        except OlderDaemonsConnected as error:
            self.close()
            raise DatabaseRefused(f"{redacted(self.url)}: {error}") from None

    def _open_store(self) -> PgReport:
        started = time.monotonic()
        report = PgReport(database=redacted(self.url))
        conn = self._writer_conn()
        meta, report.created_schema, epoch = ensure_schema(conn, self.keying.sealed_with)
        self._check_meta(meta)
        self._key_epoch = epoch
        options = self._connection_options()
        if self.password is not None:
            options["password"] = self.password
        self._pool = ConnectionPool(
            self.url,
            min_size=1,
            max_size=READ_POOL_CONNECTIONS,
            kwargs=options,
            open=True,
            timeout=READ_TIMEOUT_S,
            # a pooled connection the server ended (a restart) is replaced before a read
            # gets it, instead of failing that read: one empty query per checkout
            check=ConnectionPool.check_connection,
        )
        row = conn.execute("SELECT seq FROM ss_counter").fetchone()
        first = conn.execute("SELECT min(seq) FROM ss_changes").fetchone()
        conn.commit()
        counter = row[0] if row else 0
        # the history starts after what ss_changes no longer holds; a restored database
        # holds none of it, and its history starts at the backup's seq
        retained_from = counter if first is None or first[0] is None else first[0] - 1
        self.seq = max(0, counter - self.history_changes, min(retained_from, counter))
        self.follow()
        self.lease = self._read_lease(conn)
        conn.commit()
        counted = conn.execute("SELECT count(*) FROM ss_documents").fetchone()
        conn.commit()
        report.documents = counted[0] if counted else 0
        report.seq = self.seq
        report.duration_ms = (time.monotonic() - started) * 1000
        return report

    def rekey(
        self, old: Key, new: Key, *, rows_per_transaction: int, progress: Progress | None
    ) -> RekeyResult:
        """Rotates a sealed database from old to new while its daemons serve (rekey.py); this
        store is not open(): it holds both keys, so it is never a daemon that lacks one."""
        conn = self._writer_conn()
        exists = schema_exists(conn)
        conn.commit()
        if not exists:  # a wrong URL: never make an empty store there
            raise DatabaseRefused(f"{redacted(self.url)}: holds no sessionstore tables")
        meta, _, _ = ensure_schema(conn, self.keying.sealed_with)
        self._check_version(meta)
        return rekey_database(
            conn, old, new, rows_per_transaction=rows_per_transaction, progress=progress
        )

    def _check_meta(self, meta: dict[str, str]) -> None:
        self._check_version(meta)
        keying = Keying(meta.get(SEALED_WITH, ""), meta.get(REKEY_TO, ""))
        try:
            self._adopt(keying)
        except KeyingRefused as error:
            raise DatabaseRefused(str(error)) from None

    @staticmethod
    def _check_version(meta: dict[str, str]) -> None:
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            raise DatabaseRefused(
                f"the database holds schema version {meta.get('schema_version')}; this daemon "
                f"knows version {SCHEMA_VERSION}"
            )

    def _adopt(self, keying: Keying) -> None:
        self.sealer = keying.sealer(self.held)
        self.keying = keying

    def _check_keying(self, conn: psycopg.Connection[Any], epoch: int) -> None:
        """A rotation started or ended (key_epoch moved): seal with the key the database
        says from now on, or stop the daemon if it lacks that key."""
        if epoch == self._key_epoch:
            return
        try:
            self._adopt(read_keying(conn))
        except KeyingRefused as error:
            self._keying_refused = str(error)
            self.fail()
            raise FatalStorageError(str(error)) from None
        self._key_epoch = epoch

    def _check_missing(self, conn: psycopg.Connection[Any]) -> None:
        """A row not found, in a daemon holding one key: a rotation that began unseen
        could have moved it under a key this daemon lacks. Then the read is io_error, not
        a false not_found, and the daemon stops (follow())."""
        if len(self.held) != 1:
            return
        epoch = conn.execute("SELECT key_epoch FROM ss_counter").fetchone()
        try:
            self._check_keying(conn, epoch[0] if epoch else 0)
        except FatalStorageError as error:
            raise DatabaseUnavailable(str(error)) from None

    def close(self) -> None:
        for conn in (self._writer, self._follower, self._sweeper, *self._opened):
            if conn is not None:
                conn.close()
        self._writer = self._follower = self._sweeper = None
        self._opened = []
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @property
    def encrypted(self) -> bool:
        return self.sealer.encrypted

    @property
    def key_epoch(self) -> int:
        return self._key_epoch

    # -- sealing ------------------------------------------------------------------

    def _key(self, kind: str, doc_id: str) -> bytes:
        return row_key(self.sealer.seal_with, kind, doc_id)

    def _keys(self, kind: str, doc_id: str) -> list[bytes]:
        return row_keys(self.sealer, self.held, kind, doc_id)

    def _document_row(
        self, kind: str, doc_id: str, body: bytes, digest: bytes, seq: int
    ) -> tuple[Any, ...]:
        """An ss_documents row: the key a keyed hash of the id, the rest sealed."""
        what = kind.encode()
        name = self._seal(doc_id.encode(), b"name:" + what)
        sealed_body = self._seal(body, b"body:" + what)
        return (kind, self._key(kind, doc_id), name, sealed_body,
                self._seal(digest, b"digest:" + what), seq, len(body))  # fmt: skip

    def _seal(self, data: bytes, what: bytes) -> bytes:
        return self.sealer.seal(data, what) if self.sealer.encrypted else data

    def _open(self, data: bytes, what: bytes, where: str) -> bytes:
        try:
            return self.sealer.open(data, what) if self.sealer.encrypted else data
        except SealError as error:
            raise CorruptRecord(f"postgresql {where}", 0, error.reason) from None

    def _entry(
        self, kind: str, doc_id: str, seq: int, digest: bytes, size: int, expires_at_ms: int
    ) -> Entry:
        where = f"ss_documents ({kind}, {doc_id!r})"
        plain = self._open(digest, b"digest:" + kind.encode(), where)
        return Entry(seq, plain, size, 0, 0, 0, expires_at_ms)

    # -- reads (any thread; each takes a pooled connection) --------------------------

    def head(self, kind: str, doc_id: str) -> Entry | None:
        """The committed generation's entry, None once it expired."""
        with self._reader() as conn:
            entry = self._head_with(conn, kind, doc_id)
        return None if entry is None or expired(entry.expires_at_ms, _now_ms()) else entry

    def _head_with(self, conn: psycopg.Connection[Any], kind: str, doc_id: str) -> Entry | None:
        keys = self._keys(kind, doc_id)
        row = conn.execute(
            "SELECT seq, digest, size, expires_at_ms FROM ss_documents"
            " WHERE kind = %s AND key = ANY(%s) ORDER BY key = %s DESC LIMIT 1",
            (kind, keys, keys[0]),
        ).fetchone()
        if row is None:
            self._check_missing(conn)
            return None
        return self._entry(kind, doc_id, *row)

    def generations(self, kind: str, doc_id: str) -> list[Entry]:
        """A session's row and its earlier generations kept (ss_generations), newest first:
        at most keep_generations of those, though a session not saved since the setting
        shrank holds more until its next save trims them."""
        if kind != SESSION:
            return []
        with self._reader() as conn:
            return self._generations_with(conn, kind, doc_id)

    def _generations_with(
        self, conn: psycopg.Connection[Any], kind: str, doc_id: str
    ) -> list[Entry]:
        keys = self._keys(kind, doc_id)
        rows = conn.execute(
            "(SELECT seq, digest, size, expires_at_ms, committed_at_ms, true FROM ss_documents"
            "  WHERE kind = %s AND key = ANY(%s))"
            " UNION ALL (SELECT seq, digest, size, expires_at_ms, committed_at_ms, false"
            "  FROM ss_generations WHERE kind = %s AND key = ANY(%s) ORDER BY seq DESC LIMIT %s)"
            " ORDER BY 6 DESC, 1 DESC",
            (kind, keys, kind, keys, self.keep_generations),
        ).fetchall()
        if not rows or not rows[0][5] or expired(rows[0][3], _now_ms()):
            return []  # no session (its leftovers, if any, go with its next removal or save)
        where = f"ss_documents ({kind}, {doc_id!r})"
        return [
            Entry(seq, self._open(digest, b"digest:" + kind.encode(), where), size, 0, 0, 0,
                  expires_at_ms, committed_at_ms)
            for seq, digest, size, expires_at_ms, committed_at_ms, _ in rows
        ]  # fmt: skip

    def read_generation(self, kind: str, doc_id: str, entry: Entry) -> Document:
        with self._reader() as conn:
            return self._read_generation_with(conn, kind, doc_id, entry)

    def _read_generation_with(
        self, conn: psycopg.Connection[Any], kind: str, doc_id: str, entry: Entry
    ) -> Document:
        keys = self._keys(kind, doc_id)
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
        with self._reader() as conn:
            doc = self._read_with(conn, kind, doc_id)
        return None if doc is None or expired(doc.expires_at_ms, _now_ms()) else doc

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

    def read_entries(self, kind: str, found: Sequence[tuple[str, Entry]]) -> list[Document]:
        """A scan's documents in one query instead of a round trip each."""
        if not found:
            return []
        named = {key: doc_id for doc_id, _ in found for key in self._keys(kind, doc_id)}
        with self._reader() as conn:
            rows = conn.execute(
                "SELECT key, seq, digest, body, expires_at_ms FROM ss_documents"
                " WHERE kind = %s AND key = ANY(%s)",
                (kind, list(named)),
            ).fetchall()
        docs = {}
        for key, seq, digest, body, expires_at_ms in rows:
            doc_id = named[bytes(key)]
            docs[doc_id] = self._document(kind, doc_id, seq, digest, body, expires_at_ms)
        missing = next((doc_id for doc_id, _ in found if doc_id not in docs), None)
        if missing is not None:
            raise CorruptRecord(f"postgresql ss_documents ({kind}, {missing!r})", 0, "gone")
        return [docs[doc_id] for doc_id, _ in found]

    def _read_with(self, conn: psycopg.Connection[Any], kind: str, doc_id: str) -> Document | None:
        keys = self._keys(kind, doc_id)
        row = conn.execute(
            "SELECT seq, digest, body, expires_at_ms FROM ss_documents"
            " WHERE kind = %s AND key = ANY(%s) ORDER BY key = %s DESC LIMIT 1",
            (kind, keys, keys[0]),
        ).fetchone()
        if row is None:
            self._check_missing(conn)
            return None
        return self._document(kind, doc_id, *row)

    def _document(
        self, kind: str, doc_id: str, seq: int, digest: Any, body: Any, expires_at_ms: int
    ) -> Document:
        where = f"ss_documents ({kind}, {doc_id!r})"
        entry = self._entry(kind, doc_id, seq, digest, 0, expires_at_ms)
        plain = self._open(body, b"body:" + kind.encode(), where)
        if digest_bytes_of_canonical(plain) != entry.digest:
            raise CorruptRecord(f"postgresql {where}", 0, "body digest mismatch")
        return Document(kind, doc_id, entry.seq, entry.digest, plain, expires_at_ms)

    def scan(self, wanted: KeyRange) -> Found:
        """The range's entries, passing over the generations that expired (a page still
        holds up to its limit of the others)."""
        now_ms = _now_ms()
        found: list[tuple[str, Entry]] = []
        with self._reader() as conn:
            while True:
                page, more = self._scan_with(conn, wanted._replace(limit=wanted.limit - len(found)))
                found += [(i, e) for i, e in page if not expired(e.expires_at_ms, now_ms)]
                if not more or len(found) == wanted.limit:
                    return found, more
                last = page[-1][0]
                wanted = (
                    wanted._replace(before=last) if wanted.reverse else wanted._replace(after=last)
                )

    def _scan_with(self, conn: psycopg.Connection[Any], wanted: KeyRange) -> Found:
        if self.sealer.encrypted:
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
            (bytes(key).decode(), self._entry(kind, bytes(key).decode(), *rest))
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
            doc_id = self._open(bytes(name), b"name:" + kind.encode(), "ss_documents").decode()
            key = doc_id.encode()
            if not key.startswith(prefix.encode()):
                continue
            if (after is not None and key <= after.encode()) or (
                before is not None and key >= before.encode()
            ):
                continue
            named.append((key, doc_id, seq, digest, size, expires_at_ms))
        named.sort(reverse=reverse)
        found = [(i, self._entry(kind, i, s, d, z, x)) for _, i, s, d, z, x in named[:limit]]
        return found, len(named) > limit

    def list_sessions(
        self, prefix: str, after: str | None, limit: int
    ) -> tuple[list[str], str | None]:
        return session_page(self.scan, prefix, after, limit)

    # -- expiry: one daemon sweeps, the one that holds SWEEPER_LOCK --------------------

    def next_expiry_ms(self) -> int | None:
        return None  # other hosts write expiries too: the sweep looks again each round

    def due_expirations(self, now_ms: int, limit: int) -> list[Expire]:
        """At most limit documents that expired by now_ms, by the partial index on
        expires_at_ms; none unless this daemon is the sweeper (it takes the lock when no
        daemon holds it: the next one takes over once the sweeper's connection ends). A
        thread's call: the sweep runs it off the event loop."""
        with self._sweep_lock:
            try:
                conn = self._sweeper_connection()
                if conn is None:
                    return []
                rows = conn.execute(
                    "SELECT kind, name, expires_at_ms FROM ss_documents"
                    " WHERE expires_at_ms > 0 AND expires_at_ms <= %s"
                    " ORDER BY expires_at_ms LIMIT %s",
                    (now_ms, limit),
                ).fetchall()
            except (psycopg.Error, DatabaseUnreachable, DatabaseRefused) as error:
                log.warning("the expiry sweep waits for the database: %s", _first_line(error))
                self._drop_sweeper()
                return []
        due = []
        for kind, name, expires_at_ms in rows:
            doc_id = self._open(bytes(name), b"name:" + kind.encode(), "ss_documents").decode()
            due.append(Expire(kind, doc_id, expires_at_ms))
        return due

    def _sweeper_connection(self) -> psycopg.Connection[Any] | None:
        if self._sweeper is None or self._sweeper.closed:
            self._sweeper = self._connect()
            self._sweeper.autocommit = True
            self._sweeping = False
        if not self._sweeping:
            row = self._sweeper.execute("SELECT pg_try_advisory_lock(%s)", (SWEEPER_LOCK,))
            got = row.fetchone()
            self._sweeping = bool(got and got[0])
        return self._sweeper if self._sweeping else None

    def _drop_sweeper(self) -> None:
        if self._sweeper is not None:
            self._sweeper.close()
        self._sweeper, self._sweeping = None, False

    def retry_expiration(self, expire: Expire) -> None:
        pass  # the next round's query finds it again

    def session_count(self) -> int:
        with self._reader() as conn:
            row = conn.execute(
                "SELECT count(*) FROM ss_documents WHERE kind = %s", (SESSION,)
            ).fetchone()
        return row[0] if row else 0

    def current_lease(self) -> dict[str, Any] | None:
        with self._reader() as conn:
            return self._read_lease(conn)

    def _read_lease(self, conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
        doc = self._read_with(conn, LEASE, LEASE_ID)
        return cbor2.loads(doc.body) if doc is not None else None

    # -- following every host's commits -------------------------------------------

    def follow(self) -> bool:
        """Append the commits after self.seq, in seq order, to the watch history; then,
        off the writer's path, wake the other hosts (NOTIFY) for this daemon's own
        commits, and trim ss_changes to the retention now and then. One round trip a
        page, on a connection of its own."""
        if self._keying_refused is not None:  # a read saw it first
            raise FatalStorageError(self._keying_refused)
        with self._follow_lock:
            try:
                return self._follow(self._follower_conn())
            except psycopg.Error as error:
                if self._follower is not None:
                    self._follower.close()
                self._follower = None
                raise DatabaseUnavailable(f"{redacted(self.url)}: {_first_line(error)}") from error

    def _follow(self, conn: psycopg.Connection[Any]) -> bool:
        moved = False
        while True:
            rows = conn.execute(
                "SELECT k.key_epoch, c.seq, c.kind, c.name, c.digest, c.committed_at_ms, c.size,"
                " c.expired"
                " FROM ss_counter k LEFT JOIN LATERAL (SELECT * FROM ss_changes"
                " WHERE seq > %s ORDER BY seq LIMIT %s) c ON true",
                (self.seq, FOLLOW_PAGE),
            ).fetchall()
            self._check_keying(conn, rows[0][0] if rows else 0)
            if not rows or rows[0][1] is None:
                break
            changes = []
            for _, seq, kind, name, digest, at_ms, size, swept in rows:
                what = kind.encode()
                doc_id = self._open(bytes(name), b"name:" + what, "ss_changes").decode()
                plain = (
                    None
                    if digest is None
                    else self._open(bytes(digest), b"digest:" + what, "ss_changes")
                )
                changes.append(Committed(seq, kind, doc_id, plain, at_ms, size, swept))
            self.history.extend(changes)
            self.seq = rows[-1][1]
            moved = True
            if len(rows) < FOLLOW_PAGE:
                break
        if self._announce:
            self._announce = False
            self._announcer_pid = conn.info.backend_pid
            conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, str(self.seq)))
        if self.batches - self._trimmed_at_batch >= RETENTION_EVERY_BATCHES:
            self._trimmed_at_batch = self.batches
            self._trim(conn, self.seq)
        return moved

    def backup_snapshot(self) -> PgBackup:
        """A connection of its own, so the pool's readers go on, in one REPEATABLE READ,
        READ ONLY transaction: every row of the backup is of that snapshot."""
        conn = self._connect()
        try:
            conn.isolation_level = IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            row = conn.execute("SELECT seq FROM ss_counter").fetchone()
            counted = conn.execute(
                "SELECT (SELECT count(*) FROM ss_documents) + (SELECT count(*) FROM ss_generations)"
            ).fetchone()
        except psycopg.Error as error:
            conn.close()
            raise DatabaseUnavailable(f"{redacted(self.url)}: {_first_line(error)}") from error
        seq, documents = (int(row[0]) if row else 0), (int(counted[0]) if counted else 0)
        return PgBackup(conn, seq, documents, self._open)

    @property
    def follower(self) -> PgStore:
        """Other daemons commit too: the server follows ss_changes (follow())."""
        return self

    def listen(self, stop: threading.Event, wake: Callable[[], None]) -> None:
        """Call wake() whenever any host commits (NOTIFY), until stop is set. A thread's
        loop; a lost connection is reopened after a second."""
        while not stop.is_set():
            try:
                with self._connect(autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    while not stop.is_set():
                        for note in conn.notifies(timeout=1.0, stop_after=1):
                            if note.pid != self._announcer_pid:  # not our own
                                wake()
            except (psycopg.Error, DatabaseUnreachable, DatabaseRefused):
                stop.wait(1.0)

    # -- the writer ---------------------------------------------------------------

    def restore(self, documents: Iterable[Document], seq: int) -> int:
        """A backup's documents into this (empty) database, each at its own seq, the
        counter at the backup's: one transaction, so a restore that fails leaves the
        database as it was. Returns how many documents it wrote. Sessions go into
        ss_generations first, where the newest generation of each is then moved to
        ss_documents: the others are its earlier generations."""
        conn = self._writer_conn()
        written = 0
        with conn.transaction():
            lock_writers(conn)
            row = conn.execute("SELECT seq FROM ss_counter WHERE one = 1 FOR UPDATE").fetchone()
            counted = conn.execute("SELECT count(*) FROM ss_documents").fetchone()
            if (row and row[0]) or (counted and counted[0]):
                raise RestoreRefused(
                    f"{redacted(self.url)}: not empty (seq {row[0] if row else 0}); "
                    "restore builds a new store only"
                )
            rows: list[tuple[Any, ...]] = []
            for doc in documents:
                row = self._document_row(doc.kind, doc.id, doc.body, doc.digest, doc.seq)
                rows.append((*row, doc.expires_at_ms, doc.committed_at_ms))
                if len(rows) >= RESTORE_ROWS:
                    written += self._insert_documents(conn, rows)
                    rows = []
            written += self._insert_documents(conn, rows)
            for statement in RESTORE_SESSIONS:
                conn.execute(statement)
            conn.execute("UPDATE ss_counter SET seq = %s WHERE one = 1", (seq,))
        self.seq = self._acknowledged = seq
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

    def fail(self) -> None:
        """The daemon is stopping after a fatal error: nothing more is committed."""
        self._failed = True

    def commit_durably(self, mutations: Sequence[Mutation]) -> Batch:
        if self._failed:
            raise FatalStorageError("the store failed earlier; nothing more is committed")
        conn = None
        try:
            conn = self._batch_conn()
            return self._commit(conn, mutations)
        except CorruptRecord as error:  # a row it decides on is damaged: nothing written
            failure = refused(ErrorCode.IO_ERROR, str(error))
            return Batch([failure] * len(mutations), last_seq=self.seq)
        except (psycopg.Error, DatabaseUnreachable, DatabaseRefused, OSError) as error:
            if conn is not None:  # rolled back, if not committed: the next batch reconnects
                conn.close()
            message = (
                f"the database failed this batch, nothing is acknowledged: {_first_line(error)}"
            )
            failure = refused(ErrorCode.IO_ERROR, message)
            return Batch([failure] * len(mutations), last_seq=self.seq)

    def _commit(self, conn: psycopg.Connection[Any], mutations: Sequence[Mutation]) -> Batch:
        batch = self._batches.commit(conn, mutations, _now_ms())
        if batch.committed:
            self.batches += 1
        return batch

    def _trim(self, conn: psycopg.Connection[Any], last_seq: int) -> int:
        cursor = conn.execute(
            "DELETE FROM ss_changes WHERE seq <= %s", (last_seq - self.history_changes,)
        )
        return cursor.rowcount

    @property
    def acknowledged_seq(self) -> int:
        """`stats` reports this: the follower may not have reached this daemon's own
        commits yet, and a reply's seq must not be ahead of what stats says after it."""
        return max(self.seq, self._acknowledged)

    def publish(self, batch: Batch) -> None:
        """The watch history comes from follow(), in global seq order; a local batch
        only refreshes the lease this daemon shows, and the seq it has acknowledged."""
        if batch.committed:
            self._acknowledged = max(self._acknowledged, batch.last_seq)
            self._announce = True
        if batch.lease_body is not None:
            self.lease = cbor2.loads(batch.lease_body)
        elif any(c.kind == LEASE and c.digest is None for c in batch.committed):
            self.lease = None

    # -- between batches -------------------------------------------------------------

    def verify(self) -> tuple[int, list[Problem]]:
        problems: list[Problem] = []
        checked = 0
        with self._reader() as conn, conn.cursor(name="ss_verify") as cursor:
            cursor.execute("SELECT kind, name, body, digest FROM ss_documents")
            for kind, name, body, digest in cursor:
                checked += 1
                what = kind.encode()
                try:
                    doc_id = self._open(bytes(name), b"name:" + what, "ss_documents").decode()
                    plain = self._open(bytes(body), b"body:" + what, f"ss_documents ({kind})")
                    stored = self._open(bytes(digest), b"digest:" + what, f"ss_documents ({kind})")
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
            conn.commit()
        return checked, problems

    def compact(self) -> CompactResult:
        before = self._bytes_and_seq()[0]
        conn = self._writer_conn()
        with conn.transaction():
            row = conn.execute("SELECT seq FROM ss_counter").fetchone()
            seq = row[0] if row else 0
            removed = self._trim(conn, seq)
        return CompactResult(seq, before, self._bytes_and_seq()[0], 0, removed, "")

    def _bytes_and_seq(self) -> tuple[int, int]:
        """The tables' bytes, and the database's seq (what every host has committed)."""
        with self._reader() as conn:
            row = conn.execute(
                "SELECT pg_total_relation_size('ss_documents')"
                " + pg_total_relation_size('ss_changes')"
                " + pg_total_relation_size('ss_generations'), (SELECT seq FROM ss_counter)"
            ).fetchone()
            conn.commit()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def stats(self) -> dict[str, Any]:
        size, database_seq = self._bytes_and_seq()
        return {
            "backend": "postgresql",
            "database": redacted(self.url),
            "wal_bytes": size,
            # commits of any host this daemon has not followed into its watch history yet
            "follower_lag_seqs": max(0, database_seq - self.seq),
            "history_oldest_seq": self.history.oldest_seq(),
            "sealed_with_key_id": self.sealer.key_id_hex,
            "batch_transactions": self._batches.timing.as_dict(),
            "rekeying_to_key_id": self.keying.rekey_to or None,
        }
