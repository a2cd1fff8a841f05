# Every host's commits, followed in seq order from ss_changes into this daemon's
# watch history (NOTIFY only wakes it), and ss_changes trimmed to the history kept.
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg

from ..errors import (
    DatabaseRefused,
    DatabaseUnavailable,
    DatabaseUnreachable,
    FatalStorageError,
)
from ..mutations import Committed
from .connection import PgDatabase, first_line, redacted
from .schema import (
    NOTIFY_CHANNEL,
)

FOLLOW_PAGE = 1000
RETENTION_EVERY_BATCHES = 500
LISTEN_CHECK_STOP_S = 0.25  # the listener looks at its stop event this often


class PgFollowing:
    """The engine's follower part: follow() moves db's seq and history on, on a connection
    of its own; listen() wakes it whenever any host commits."""

    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        self._follow_lock = threading.Lock()
        self._follower: psycopg.Connection[Any] | None = None
        self._announcer_pid = 0  # the backend that sends NOTIFY: the listener skips its own
        self._trimmed_at_batch = 0

    def follow(self) -> bool:
        """Append the commits after db.seq, in seq order, to the watch history; then,
        off the writer's path, wake the other hosts (NOTIFY) for this daemon's own
        commits, and trim ss_changes to the retention now and then. One round trip a
        page, on a connection of its own."""
        if self.db.keying_refused is not None:  # a read saw it first
            raise FatalStorageError(self.db.keying_refused)
        with self._follow_lock:
            try:
                return self._follow(self._follower_conn())
            except psycopg.Error as error:
                self.close()  # the next round reconnects
                raise DatabaseUnavailable(
                    f"{redacted(self.db.url)}: {first_line(error)}"
                ) from error

    def _follower_conn(self) -> psycopg.Connection[Any]:
        if self._follower is None or self._follower.closed or self._follower.broken:
            self._follower = self.db.connect(autocommit=True)
        return self._follower

    def _follow(self, conn: psycopg.Connection[Any]) -> bool:
        db = self.db
        moved = False
        while True:
            rows = conn.execute(
                "SELECT k.key_epoch, c.seq, c.kind, c.name, c.digest, c.committed_at_ms, c.size,"
                " c.expired"
                " FROM ss_counter k LEFT JOIN LATERAL (SELECT * FROM ss_changes"
                " WHERE seq > %s ORDER BY seq LIMIT %s) c ON true",
                (db.seq, FOLLOW_PAGE),
            ).fetchall()
            db.check_keying(conn, rows[0][0] if rows else 0)
            if not rows or rows[0][1] is None:
                break
            changes = []
            for _, seq, kind, name, digest, at_ms, size, swept in rows:
                what = kind.encode()
                doc_id = db.open(bytes(name), b"name:" + what, "ss_changes").decode()
                plain = (
                    None
                    if digest is None
                    else db.open(bytes(digest), b"digest:" + what, "ss_changes")
                )
                changes.append(Committed(seq, kind, doc_id, plain, at_ms, size, swept))
            db.history.extend(changes)
            db.seq = rows[-1][1]
            moved = True
            if len(rows) < FOLLOW_PAGE:
                break
        if db.announce:
            db.announce = False
            self._announcer_pid = conn.info.backend_pid
            conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, str(db.seq)))
        if db.batches - self._trimmed_at_batch >= RETENTION_EVERY_BATCHES:
            self._trimmed_at_batch = db.batches
            self.trim(conn, db.seq)
        return moved

    def listen(self, stop: threading.Event, wake: Callable[[], None]) -> None:
        """Call wake() whenever any host commits (NOTIFY), until stop is set. A thread's
        loop; a lost connection is reopened after a second."""
        while not stop.is_set():
            try:
                with self.db.connect(autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    while not stop.is_set():
                        for note in conn.notifies(timeout=LISTEN_CHECK_STOP_S, stop_after=1):
                            if note.pid != self._announcer_pid:  # not our own
                                wake()
            except (psycopg.Error, DatabaseUnreachable, DatabaseRefused):
                stop.wait(1.0)

    def trim(self, conn: psycopg.Connection[Any], last_seq: int) -> int:
        """ss_changes down to the last history_changes changes before last_seq."""
        cursor = conn.execute(
            "DELETE FROM ss_changes WHERE seq <= %s", (last_seq - self.db.history_changes,)
        )
        return cursor.rowcount

    def close(self) -> None:
        if self._follower is not None:
            self._follower.close()
        self._follower = None
