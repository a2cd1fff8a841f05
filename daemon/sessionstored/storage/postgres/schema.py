# The PostgreSQL backend's tables, made (or moved to this version) by the
# first daemon to start, under an advisory lock so that daemons starting
# together make them once.
from __future__ import annotations

from typing import Any

import psycopg

from .keying import SEALED_WITH

SCHEMA_VERSION = 2  # 2: ss_counter.key_epoch (online rekey)
NOTIFY_CHANNEL = "sessionstore_changes"
SCHEMA_LOCK = 0x5E55_1057  # pg_advisory_xact_lock key: one daemon creates the schema
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS ss_meta (name text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ss_counter"
    " (one int PRIMARY KEY CHECK (one = 1), seq bigint NOT NULL,"
    " key_epoch bigint NOT NULL DEFAULT 0)",
    "INSERT INTO ss_counter VALUES (1, 0) ON CONFLICT DO NOTHING",
    "CREATE TABLE IF NOT EXISTS ss_documents (kind text NOT NULL, key bytea NOT NULL,"
    " name bytea NOT NULL, body bytea NOT NULL, digest bytea NOT NULL, seq bigint NOT NULL,"
    " size int NOT NULL, PRIMARY KEY (kind, key))",
    "CREATE TABLE IF NOT EXISTS ss_changes (seq bigint PRIMARY KEY, kind text NOT NULL,"
    " name bytea NOT NULL, digest bytea, committed_at_ms bigint NOT NULL, size int NOT NULL)",
)
MIGRATE_FROM_1 = "ALTER TABLE ss_counter ADD COLUMN key_epoch bigint NOT NULL DEFAULT 0"


def lock_schema(conn: psycopg.Connection[Any]) -> None:
    """Inside a transaction: no daemon makes or checks the schema until it ends."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))


def schema_exists(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT to_regclass('ss_meta') IS NOT NULL").fetchone()
    return bool(row and row[0])


def ensure_schema(
    conn: psycopg.Connection[Any], sealed_with: str
) -> tuple[dict[str, str], bool, int]:
    """Creates the tables (a new database is sealed_with that key id, "" for plaintext),
    or moves them to this version; returns ss_meta, whether it created them, and the key
    epoch."""
    with conn.transaction():
        lock_schema(conn)
        created = not schema_exists(conn)
        for statement in SCHEMA:
            conn.execute(statement)
        meta = dict(conn.execute("SELECT name, value FROM ss_meta").fetchall())
        if not meta:
            meta = {"schema_version": str(SCHEMA_VERSION), SEALED_WITH: sealed_with}
            with conn.cursor() as cursor:
                cursor.executemany("INSERT INTO ss_meta VALUES (%s, %s)", list(meta.items()))
        if meta.get("schema_version") == "1":
            conn.execute(MIGRATE_FROM_1)
            meta["schema_version"] = str(SCHEMA_VERSION)
            conn.execute(
                "UPDATE ss_meta SET value = %s WHERE name = 'schema_version'",
                (meta["schema_version"],),
            )
        epoch = conn.execute("SELECT key_epoch FROM ss_counter").fetchone()
    return meta, created, int(epoch[0]) if epoch else 0
