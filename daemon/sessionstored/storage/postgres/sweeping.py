# The expiry sweep on PostgreSQL: the one daemon that holds SWEEPER_LOCK finds what
# expired; the writer commits the removals.
from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg

from ..errors import (
    DatabaseRefused,
    DatabaseUnreachable,
)
from ..mutations import Expire
from .connection import PgDatabase, first_line
from .schema import (
    SWEEPER_LOCK,
)

log = logging.getLogger("sessionstored.postgres")


class PgSweeping:
    """The engine's expiry part: one daemon sweeps, the one that holds SWEEPER_LOCK, on a
    connection of its own."""

    def __init__(self, db: PgDatabase) -> None:
        self.db = db
        self._sweep_lock = threading.Lock()
        self._sweeper: psycopg.Connection[Any] | None = None  # holds SWEEPER_LOCK once taken
        self._sweeping = False

    def next_ms(self) -> int | None:
        return None  # other hosts write expiries too: the sweep looks again each round

    def due(self, now_ms: int, limit: int) -> list[Expire]:
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
                log.warning("the expiry sweep waits for the database: %s", first_line(error))
                self.close()
                return []
        due = []
        for kind, name, expires_at_ms in rows:
            doc_id = self.db.open(bytes(name), b"name:" + kind.encode(), "ss_documents").decode()
            due.append(Expire(kind, doc_id, expires_at_ms))
        return due

    def _sweeper_connection(self) -> psycopg.Connection[Any] | None:
        if self._sweeper is None or self._sweeper.closed:
            self._sweeper = self.db.connect()
            self._sweeper.autocommit = True
            self._sweeping = False
        if not self._sweeping:
            row = self._sweeper.execute("SELECT pg_try_advisory_lock(%s)", (SWEEPER_LOCK,))
            got = row.fetchone()
            self._sweeping = bool(got and got[0])
        return self._sweeper if self._sweeping else None

    def retry(self, expire: Expire) -> None:
        pass  # the next round's query finds it again

    def close(self) -> None:
        """Ends the sweeper's connection, and with it SWEEPER_LOCK: another daemon sweeps."""
        if self._sweeper is not None:
            self._sweeper.close()
        self._sweeper, self._sweeping = None, False
