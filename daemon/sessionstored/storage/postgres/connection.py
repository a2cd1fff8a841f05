# The one object every part of the PostgreSQL engine shares (store.py says how it
# works): its connections (the writer's, each batch thread's, a pool for reads), the
# keys it seals with and how it follows a rotation (keying.py), the committed state
# the parts read and move (seq, the watch history, the lease, the batches), and the
# start report. A database that does not answer is DatabaseUnreachable (retry), one
# that refuses is DatabaseRefused (give up), a read that fails is DatabaseUnavailable.
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypedDict

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from ..documents import Entry
from ..errors import (
    CorruptRecord,
    DatabaseRefused,
    DatabaseUnavailable,
    DatabaseUnreachable,
    FatalStorageError,
    KeyingRefused,
    SealError,
)
from ..generations import DEFAULT_KEEP_GENERATIONS
from ..history import History
from ..sealing import Key, Sealer
from .keying import Keying, application_name, read_keying, row_key, row_keys
from .schema import (
    ROWS_BY_KEY,
)

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
READ_TIMEOUT_S = 10.0  # a read waits this long for a pooled connection, then io_error


# getaddrinfo's words (glibc, musl, BSD) for a name that does not exist (EAI_NONAME), as
# psycopg and libpq pass them on; a DNS server that does not answer says "Temporary
# failure in name resolution" (EAI_AGAIN) instead: an outage, retried
UNRESOLVED_HOST = ("Name or service not known", "Name does not resolve", "nodename nor servname")


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else repr(error)


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


class CountedConnection(psycopg.Connection[Any]):
    """A batch's connection: counts the statements sent on it, each one a round trip
    (every statement is waited for before the next), for stats' round trips per batch."""

    statements = 0

    def execute(self, *args: Any, **kwargs: Any) -> psycopg.Cursor[Any]:
        self.statements += 1
        return super().execute(*args, **kwargs)


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


class PgSettings(TypedDict, total=False):
    """PgDatabase's keyword arguments, for PgStore, which passes them on."""

    key: Key | None
    previous_key: Key | None
    password: str | None
    history_changes: int
    keep_generations: int
    max_document_bytes: int
    batches_in_flight: int


class PgDatabase:
    """The database as the engine's parts share it (store.py builds one and hands it to
    each): connections, sealing under the keys the database says, and the committed state
    every part reads and moves."""

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
        batches_in_flight: int = 1,
    ) -> None:
        self.keep_generations = keep_generations
        self.batches_in_flight = batches_in_flight  # each on a connection of its own
        self.url = url
        self.password = password
        self.held = [k for k in (key, previous_key) if k is not None]
        self.sealer = Sealer(key)  # until the store opens and reads what the database says
        self.keying = Keying(key.key_id_hex if key else "")
        self.key_epoch = -1
        self.history = History(history_changes)
        self.history_changes = history_changes
        self.max_document_bytes = max_document_bytes
        # the committed state: the store's batches move it, the follower appends the
        # commits of every host to the history up to seq
        self.seq = 0
        self.acknowledged = 0  # the highest seq this daemon acknowledged (batches, restore)
        self.lease: dict[str, Any] | None = None
        self.batches = 0  # committed by this daemon; the follower trims every so many
        self.announce = False  # this daemon committed since the follower's last NOTIFY
        self.failed = False  # the daemon is stopping after a fatal error: nothing more
        self.keying_refused: str | None = None  # why this daemon must stop (keying.py)
        self._writer: psycopg.Connection[Any] | None = None
        self._pool: ConnectionPool[Any] | None = None
        self._batch_conns = threading.local()  # the writer's threads', one each
        self._opened: list[psycopg.Connection[Any]] = []  # every one, to close

    # -- connections ---------------------------------------------------------------

    def connect(
        self, connection: type[psycopg.Connection[Any]] = psycopg.Connection, **options: Any
    ) -> psycopg.Connection[Any]:
        kwargs: dict[str, Any] = {**self._connection_options(), **options}
        if self.password is not None:
            kwargs["password"] = self.password
        try:
            conn = connection.connect(self.url, **kwargs)
        except psycopg.ProgrammingError as error:  # the URL itself
            raise DatabaseRefused(f"bad database URL: {error}") from None
        except psycopg.OperationalError as error:
            text = first_line(error)
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

    def open_pool(self) -> None:
        """The readers' connections, opened once the schema is there."""
        # autocommit: each read statement sees what committed before it, as it would in
        # a READ COMMITTED transaction, and a connection goes back to the pool without
        # the ROLLBACK round trip that ending such a transaction costs
        options = {**self._connection_options(), "autocommit": True}
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

    def writer_conn(self) -> psycopg.Connection[Any]:
        """Autocommit: a batch is one statement, committed as it ends (batch.py), or an
        explicit transaction."""
        if self._writer is None or self._writer.closed or self._writer.broken:
            self._writer = self.connect(autocommit=True)
        return self._writer

    def batch_conn(self) -> CountedConnection:
        conn: CountedConnection | None = getattr(self._batch_conns, "conn", None)
        if conn is None or conn.closed or conn.broken:
            opened = self.connect(CountedConnection, autocommit=True)
            assert isinstance(opened, CountedConnection)
            conn = self._batch_conns.conn = opened
            for setting in ROWS_BY_KEY:
                conn.execute(f"SET {setting} TO off")
            self._opened = [c for c in self._opened if not c.closed] + [conn]
        return conn

    @contextmanager
    def reader(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; a database that fails or does not answer is an OSError
        (DatabaseUnavailable), which a read answers as io_error."""
        assert self._pool is not None, "open() first"
        if self.failed:
            raise DatabaseUnavailable("the daemon is stopping after a fatal error")
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.Error, PoolTimeout) as error:
            raise DatabaseUnavailable(f"{redacted(self.url)}: {first_line(error)}") from error

    def close(self) -> None:
        """The writer's, the batches' and the pool's connections (each part closes its own)."""
        for conn in (self._writer, *self._opened):
            if conn is not None:
                conn.close()
        self._writer = None
        self._opened = []
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # -- keying ----------------------------------------------------------------------

    def adopt(self, keying: Keying) -> None:
        """Seals as keying says; KeyingRefused if this daemon lacks a key it needs."""
        self.sealer = keying.sealer(self.held)
        self.keying = keying

    def check_keying(self, conn: psycopg.Connection[Any], epoch: int) -> None:
        """A rotation started or ended (key_epoch moved): seal with the key the database
        says from now on, or stop the daemon if it lacks that key."""
        if epoch == self.key_epoch:
            return
        try:
            self.adopt(read_keying(conn))
        except KeyingRefused as error:
            self.keying_refused = str(error)
            self.failed = True
            raise FatalStorageError(str(error)) from None
        self.key_epoch = epoch

    def check_missing(self, conn: psycopg.Connection[Any]) -> None:
        """A row not found, in a daemon holding one key: a rotation that began unseen
        could have moved it under a key this daemon lacks. Then the read is io_error, not
        a false not_found, and the daemon stops (following.py)."""
        if len(self.held) != 1:
            return
        epoch = conn.execute("SELECT key_epoch FROM ss_counter").fetchone()
        try:
            self.check_keying(conn, epoch[0] if epoch else 0)
        except FatalStorageError as error:
            raise DatabaseUnavailable(str(error)) from None

    @property
    def encrypted(self) -> bool:
        return self.sealer.encrypted

    # -- sealing ------------------------------------------------------------------

    def _key(self, kind: str, doc_id: str) -> bytes:
        return row_key(self.sealer.seal_with, kind, doc_id)

    def keys(self, kind: str, doc_id: str) -> list[bytes]:
        """A document's key column under each key held, the sealing key's first."""
        return row_keys(self.sealer, self.held, kind, doc_id)

    def document_row(
        self, kind: str, doc_id: str, body: bytes, digest: bytes, seq: int
    ) -> tuple[Any, ...]:
        """An ss_documents row: the key a keyed hash of the id, the rest sealed."""
        what = kind.encode()
        name = self.seal(doc_id.encode(), b"name:" + what)
        sealed_body = self.seal(body, b"body:" + what)
        return (kind, self._key(kind, doc_id), name, sealed_body,
                self.seal(digest, b"digest:" + what), seq, len(body))  # fmt: skip

    def seal(self, data: bytes, what: bytes) -> bytes:
        return self.sealer.seal(data, what) if self.sealer.encrypted else data

    def open(self, data: bytes, what: bytes, where: str) -> bytes:
        """A sealed field's plaintext; CorruptRecord when it does not open."""
        try:
            return self.sealer.open(data, what) if self.sealer.encrypted else data
        except SealError as error:
            raise CorruptRecord(f"postgresql {where}", 0, error.reason) from None

    def entry(
        self, kind: str, doc_id: str, seq: int, digest: bytes, size: int, expires_at_ms: int
    ) -> Entry:
        where = f"ss_documents ({kind}, {doc_id!r})"
        plain = self.open(digest, b"digest:" + kind.encode(), where)
        return Entry(seq, plain, size, 0, 0, 0, expires_at_ms)
