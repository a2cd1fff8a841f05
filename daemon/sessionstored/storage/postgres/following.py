# Every host's commits, followed in seq order from ss_changes into this daemon's
# watch history (NOTIFY only wakes it), and a backup's consistent snapshot.
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import IsolationLevel

from ..errors import (
    DatabaseRefused,
    DatabaseUnavailable,
    DatabaseUnreachable,
    FatalStorageError,
)
from ..mutations import Committed
from .backup import PgBackup
from .connection import PgConnection, first_line, redacted
from .schema import (
    NOTIFY_CHANNEL,
)

FOLLOW_PAGE = 1000
RETENTION_EVERY_BATCHES = 500
LISTEN_CHECK_STOP_S = 0.25  # the listener looks at its stop event this often


class PgFollowing(PgConnection):
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
                raise DatabaseUnavailable(f"{redacted(self.url)}: {first_line(error)}") from error

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
            raise DatabaseUnavailable(f"{redacted(self.url)}: {first_line(error)}") from error
        seq, documents = (int(row[0]) if row else 0), (int(counted[0]) if counted else 0)
        return PgBackup(conn, seq, documents, self._open)

    def listen(self, stop: threading.Event, wake: Callable[[], None]) -> None:
        """Call wake() whenever any host commits (NOTIFY), until stop is set. A thread's
        loop; a lost connection is reopened after a second."""
        while not stop.is_set():
            try:
                with self._connect(autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    while not stop.is_set():
                        for note in conn.notifies(timeout=LISTEN_CHECK_STOP_S, stop_after=1):
                            if note.pid != self._announcer_pid:  # not our own
                                wake()
            except (psycopg.Error, DatabaseUnreachable, DatabaseRefused):
                stop.wait(1.0)

    def _trim(self, conn: psycopg.Connection[Any], last_seq: int) -> int:
        """ss_changes down to the last history_changes changes before last_seq."""
        cursor = conn.execute(
            "DELETE FROM ss_changes WHERE seq <= %s", (last_seq - self.history_changes,)
        )
        return cursor.rowcount
