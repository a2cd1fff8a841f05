# Which key seals a PostgreSQL store, and how a daemon finds a document's row
# while the key is being rotated online (rekey.py).
#
# ss_meta says it: sealed_with names the key id the rows are sealed with, and,
# during a rotation, rekey_to names the key they are being resealed with. A
# daemon holds one or two keys (--key-file, --previous-key-file). It seals
# with what the database says (rekey_to during a rotation, else sealed_with)
# and opens with any key it holds. It must hold the sealing key, and during a
# rotation the old one too; otherwise it is refused at start, and a running
# daemon stops at its next batch (the ss_counter row's key_epoch changes at
# each start and end of a rotation, under the writers' lock held exclusive; a
# batch checks it under the same lock, held shared: batch.py).
#
# A row is found by a keyed hash of its id, so a document has a different key
# column under each key; a read asks for the hashes under every key held, and
# a write puts the row under the sealing key and deletes it under the others.
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from ..errors import KeyingRefused
from ..sealing import Key, Sealer

SEALED_WITH = "sealed_with"
REKEY_TO = "rekey_to"
DAEMON_APPLICATION = "sessionstored keys="  # + the key ids a daemon holds, comma-separated
SCHEMA_MARK = " schema=5"  # then this: the daemon commits the way schema.py's version 5 says


@dataclass(frozen=True)
class Keying:
    sealed_with: str  # key id hex, "" for plaintext
    rekey_to: str = ""  # key id hex while a rotation runs

    @property
    def sealing(self) -> str:
        return self.rekey_to or self.sealed_with

    def describe(self) -> str:
        if self.rekey_to:
            return f"being rekeyed from key id {self.sealed_with} to key id {self.rekey_to}"
        if self.sealed_with:
            return f"sealed with key id {self.sealed_with}"
        return "plaintext"

    def sealer(self, held: Sequence[Key]) -> Sealer:
        """Seals with the database's sealing key and opens with every key held."""
        ids = {key.key_id_hex: key for key in held}
        if not self.sealed_with:
            if held:
                raise KeyingRefused("the database holds plaintext documents: start without a key")
            return Sealer(None)
        needed = [self.sealed_with] + ([self.rekey_to] if self.rekey_to else [])
        missing = [key_id for key_id in needed if key_id not in ids]
        if missing:
            have = ", ".join(ids) or "none"
            hint = (
                "start with both keys (--key-file and --previous-key-file)"
                if self.rekey_to
                else "start with that key"
            )
            raise KeyingRefused(
                f"the database is {self.describe()}; this daemon holds key ids: {have}: {hint}"
            )
        sealing = ids[self.sealing]
        return Sealer(sealing, [key for key in held if key is not sealing])


def read_keying(conn: psycopg.Connection[Any]) -> Keying:
    meta = dict(
        conn.execute(
            "SELECT name, value FROM ss_meta WHERE name IN (%s, %s)", (SEALED_WITH, REKEY_TO)
        ).fetchall()
    )
    return Keying(meta.get(SEALED_WITH, ""), meta.get(REKEY_TO, ""))


def row_key(key: Key | None, kind: str, doc_id: str) -> bytes:
    """The key column of a document's row: a keyed hash of its id, its UTF-8 bytes in a
    plaintext store."""
    if key is None:
        return doc_id.encode("utf-8")
    return hmac.new(key.name_key, f"{kind}\0{doc_id}".encode(), hashlib.sha256).digest()


def row_keys(sealer: Sealer, held: Sequence[Key], kind: str, doc_id: str) -> list[bytes]:
    """Every key column the document's row may have: the sealing key's first."""
    first = row_key(sealer.seal_with, kind, doc_id)
    rest = [row_key(key, kind, doc_id) for key in held if key is not sealer.seal_with]
    return [first, *(key for key in rest if key != first)]


def application_name(held: Sequence[Key]) -> str:
    """What pg_stat_activity shows for a daemon's connections: a rotation refuses to start
    while a connected daemon lacks the new key."""
    return DAEMON_APPLICATION + ",".join(key.key_id_hex for key in held) + SCHEMA_MARK


def daemons_lacking(conn: psycopg.Connection[Any], key_id: str) -> list[str]:
    """The connected daemons (of this database) that do not hold key_id, one line each."""
    rows = conn.execute(
        "SELECT DISTINCT application_name, coalesce(host(client_addr), 'local socket')"
        " FROM pg_stat_activity WHERE datname = current_database()"
        " AND starts_with(application_name, %s) ORDER BY 1, 2",
        (DAEMON_APPLICATION,),
    ).fetchall()
    lacking = []
    for name, where in rows:
        held = str(name)[len(DAEMON_APPLICATION) :].split(SCHEMA_MARK)[0].split(",")
        if key_id not in held:
            lacking.append(f"a daemon at {where} holding key ids {','.join(held) or 'none'}")
    return lacking
