# Theory of operation: rotating a sealed PostgreSQL store's key while the
# daemons serve (`sessionstored rekey --database URL`).
#
# 1. Start. Under the schema lock and the writers' lock (schema.py), with every
#    connected daemon holding the new key (pg_stat_activity shows the key ids
#    each daemon's connections hold, keying.py), ss_meta gets rekey_to = the
#    new key id and key_epoch moves. Every batch after that (it checks
#    key_epoch under the same lock, held shared) seals with the new key, and deletes the
#    document's row under the old one. A daemon that lacks the new key stops
#    at its next batch, and no daemon starts without both keys.
# 2. Reseal. Pages of ss_documents rows still sealed with the old key (the key
#    id in the name's envelope says so) are read and sealed again under the
#    new key, with the key column rehashed, outside any lock. Each page is
#    then written in one transaction that holds the writers' lock, so no batch
#    is deciding meanwhile, and only where a row is still the one read (its
#    sealed name, with its random nonce, unchanged): a row a batch rewrote
#    since is already under the new key. The earlier generations of sessions
#    (ss_generations) go the same way. Then ss_changes, which only grows,
#    page by page without the lock.
# 3. End. Under both locks again, with no row left under the old key,
#    sealed_with = the new key id, rekey_to goes, key_epoch moves.
#
# Every step is a transaction, and what is done is in the rows themselves, so
# a pass that dies anywhere is resumed by running it again with the same keys.
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from ..errors import RekeyRefused, SealError
from ..sealing import KEY_ID_BYTES, SEAL_MAGIC, Key, Sealer
from .keying import REKEY_TO, SEALED_WITH, daemons_lacking, read_keying, row_key
from .schema import NOTIFY_CHANNEL, lock_schema, lock_writers

ROWS_PER_TRANSACTION = 128  # the writers' lock is held for one page's UPDATE: batches wait
KEY_ID_AT = len(SEAL_MAGIC) + 1  # where an envelope's key id starts (SQL substring, 1-based)
NOT_UNDER = f"substring(name from {KEY_ID_AT} for {KEY_ID_BYTES}) <> %s"

Progress = Callable[[int, int], None]  # (rows resealed, rows to reseal)
RESEALED_TABLES = ("ss_documents", "ss_generations", "ss_changes")


@dataclass
class RekeyResult:
    documents: int = 0
    generations: int = 0  # earlier generations of sessions
    changes: int = 0
    resumed: bool = False
    already: bool = False


def rekey_database(
    conn: psycopg.Connection[Any],
    old: Key,
    new: Key,
    *,
    rows_per_transaction: int = ROWS_PER_TRANSACTION,
    progress: Progress | None = None,
) -> RekeyResult:
    result = RekeyResult()
    if not _begin(conn, old, new, result):
        return result
    rotation = _Rotation(conn, old, new, rows_per_transaction, progress)
    while True:
        result.documents += rotation.reseal_documents("ss_documents")
        result.generations += rotation.reseal_documents("ss_generations")
        result.changes += rotation.reseal_changes()
        if _end(conn, new):
            return result


def _lock(conn: psycopg.Connection[Any]) -> None:
    lock_schema(conn)
    lock_writers(conn)


def _moved(conn: psycopg.Connection[Any]) -> None:
    conn.execute("UPDATE ss_counter SET key_epoch = key_epoch + 1 WHERE one = 1")
    conn.execute("SELECT pg_notify(%s, 'rekey')", (NOTIFY_CHANNEL,))


def _begin(conn: psycopg.Connection[Any], old: Key, new: Key, result: RekeyResult) -> bool:
    """Marks the rotation started (or finds it started); False when there is nothing to do."""
    with conn.transaction():
        _lock(conn)
        keying = read_keying(conn)
        if keying.rekey_to:
            if keying.rekey_to != new.key_id_hex or keying.sealed_with != old.key_id_hex:
                raise RekeyRefused(
                    f"the database is {keying.describe()}: rerun the rotation with those keys"
                )
            result.resumed = True
            return True
        if keying.sealed_with == new.key_id_hex:
            result.already = True
            return False
        if not keying.sealed_with:
            raise RekeyRefused(
                "the database holds plaintext documents; an online rekey rotates one key to "
                "another: to seal it, back it up and restore it with --new-key-file"
            )
        if keying.sealed_with != old.key_id_hex:
            raise RekeyRefused(
                f"the database is sealed with key id {keying.sealed_with}, "
                f"not the old key's {old.key_id_hex}"
            )
        lacking = daemons_lacking(conn, new.key_id_hex)
        if lacking:
            raise RekeyRefused(
                f"{len(lacking)} connected daemon(s) do not hold the new key "
                f"({'; '.join(lacking)}): restart each with --key-file NEW "
                "--previous-key-file OLD first"
            )
        conn.execute("INSERT INTO ss_meta VALUES (%s, %s)", (REKEY_TO, new.key_id_hex))
        _moved(conn)
    return True


def _end(conn: psycopg.Connection[Any], new: Key) -> bool:
    with conn.transaction():
        _lock(conn)
        for table in RESEALED_TABLES:
            left = conn.execute(
                f"SELECT 1 FROM {table} WHERE {NOT_UNDER} LIMIT 1", (new.key_id,)
            ).fetchone()
            if left is not None:
                return False  # written under the old key meanwhile: another round
        conn.execute("UPDATE ss_meta SET value = %s WHERE name = %s", (new.key_id_hex, SEALED_WITH))
        conn.execute("DELETE FROM ss_meta WHERE name = %s", (REKEY_TO,))
        _moved(conn)
    return True


class _Rotation:
    def __init__(
        self,
        conn: psycopg.Connection[Any],
        old: Key,
        new: Key,
        rows_per_transaction: int,
        progress: Progress | None,
    ) -> None:
        self.conn = conn
        self.new = new
        self.sealer = Sealer(new, [old])
        self.rows = rows_per_transaction
        self.progress = progress
        self.done = 0
        self.total = 0
        for table in RESEALED_TABLES:
            counted = conn.execute(
                f"SELECT count(*) FROM {table} WHERE {NOT_UNDER}", (new.key_id,)
            ).fetchone()
            self.total += int(counted[0]) if counted else 0
        conn.commit()

    def _open(self, data: bytes, what: bytes, where: str) -> bytes:
        try:
            return self.sealer.open(data, what)
        except SealError as error:
            raise RekeyRefused(f"postgresql {where}: {error.reason}") from None

    def _reseal(self, data: bytes, what: bytes, where: str) -> bytes:
        return self.sealer.seal(self._open(data, what, where), what)

    def _advance(self, count: int) -> None:
        self.done += count
        if self.progress is not None:
            self.progress(self.done, max(self.total, self.done))

    def reseal_documents(self, table: str) -> int:
        """ss_documents' rows, or ss_generations' (a session's slot tells them apart), in
        the order of their primary key."""
        place = "slot" if table == "ss_generations" else "seq"  # seq: one row per key
        resealed = 0
        after: tuple[str, bytes, int] = ("", b"", -(1 << 62))
        while True:
            rows = self.conn.execute(
                f"SELECT kind, key, {place}, name, body, digest FROM {table}"
                f" WHERE (kind, key, {place}) > (%s, %s, %s) AND {NOT_UNDER}"
                f" ORDER BY kind, key, {place} LIMIT %s",
                (*after, self.new.key_id, self.rows),
            ).fetchall()
            self.conn.commit()
            if not rows:
                return resealed
            updates = [self._document(table, *row) for row in rows]
            with self.conn.transaction():
                lock_writers(self.conn)
                with self.conn.cursor() as cursor:
                    cursor.executemany(
                        f"UPDATE {table} SET key = %s, name = %s, body = %s, digest = %s"
                        f" WHERE kind = %s AND key = %s AND {place} = %s AND name = %s",
                        updates,
                    )
            resealed += len(rows)
            self._advance(len(rows))
            after = (rows[-1][0], bytes(rows[-1][1]), rows[-1][2])

    def _document(
        self, table: str, kind: str, key: Any, place: int, name: Any, body: Any, digest: Any
    ) -> tuple[Any, ...]:
        what = kind.encode()
        where = f"{table} ({kind}, key {bytes(key).hex()}, {place})"
        doc_id = self._open(bytes(name), b"name:" + what, where)
        try:
            new_key = row_key(self.new, kind, doc_id.decode())
        except UnicodeDecodeError:
            raise RekeyRefused(f"postgresql {where}: the name is not UTF-8") from None
        return (
            new_key,
            self.sealer.seal(doc_id, b"name:" + what),
            self._reseal(bytes(body), b"body:" + what, where),
            self._reseal(bytes(digest), b"digest:" + what, where),
            kind,
            bytes(key),
            place,
            bytes(name),
        )

    def reseal_changes(self) -> int:
        resealed = 0
        after = 0
        while True:
            with self.conn.transaction():
                rows = self.conn.execute(
                    "SELECT seq, kind, name, digest FROM ss_changes"
                    f" WHERE seq > %s AND {NOT_UNDER} ORDER BY seq LIMIT %s",
                    (after, self.new.key_id, self.rows),
                ).fetchall()
                if not rows:
                    return resealed
                updates = []
                for seq, kind, name, digest in rows:
                    what, where = kind.encode(), f"ss_changes (seq {seq})"
                    sealed_digest = (
                        None
                        if digest is None
                        else self._reseal(bytes(digest), b"digest:" + what, where)
                    )
                    updates.append(
                        (self._reseal(bytes(name), b"name:" + what, where), sealed_digest, seq)
                    )
                with self.conn.cursor() as cursor:
                    cursor.executemany(
                        "UPDATE ss_changes SET name = %s, digest = %s WHERE seq = %s", updates
                    )
            resealed += len(rows)
            self._advance(len(rows))
            after = rows[-1][0]
