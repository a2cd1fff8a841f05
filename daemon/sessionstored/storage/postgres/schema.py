# The PostgreSQL backend's tables and the two functions a batch commits
# through (batch.py says how), made or moved to this version by the first
# daemon to start, under an advisory lock so that daemons starting together
# make them once.
from __future__ import annotations

from typing import Any

import psycopg

from ..errors import OlderDaemonsConnected
from .keying import DAEMON_APPLICATION, SCHEMA_MARK, SEALED_WITH

# 2: ss_counter.key_epoch (online rekey); 3: batches overlap (ss_stage); 4: expiry;
# 5: earlier generations of sessions (ss_generations)
SCHEMA_VERSION = 5
NOTIFY_CHANNEL = "sessionstore_changes"
SCHEMA_LOCK = 0x5E55_1057  # pg_advisory_xact_lock key: one daemon creates the schema
# Every batch holds this advisory lock shared, from before it checks what it decided
# on to its commit; what needs no batch in flight (a lease change, a delete_prefix, an
# append, a rekey step, a restore) holds it exclusive. A document's own lock is a
# 64-bit keyed hash (batch.py), in the same key space: a collision only serialises.
WRITERS_LOCK = 0x5E55_1058

TABLES = (
    "CREATE TABLE IF NOT EXISTS ss_meta (name text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ss_counter"
    " (one int PRIMARY KEY CHECK (one = 1), seq bigint NOT NULL,"
    " key_epoch bigint NOT NULL DEFAULT 0)",
    "INSERT INTO ss_counter VALUES (1, 0) ON CONFLICT DO NOTHING",
    "CREATE TABLE IF NOT EXISTS ss_documents (kind text NOT NULL, key bytea NOT NULL,"
    " name bytea NOT NULL, body bytea NOT NULL, digest bytea NOT NULL, seq bigint NOT NULL,"
    " size int NOT NULL, expires_at_ms bigint NOT NULL DEFAULT 0, PRIMARY KEY (kind, key))",
    "CREATE TABLE IF NOT EXISTS ss_changes (seq bigint PRIMARY KEY, kind text NOT NULL,"
    " name bytea NOT NULL, digest bytea, committed_at_ms bigint NOT NULL, size int NOT NULL,"
    " expired boolean NOT NULL DEFAULT false)",
)
# version 5: each session's earlier generations kept (--keep-generations), their rows as
# ss_documents' were, under the session's key; and when each generation was committed
GENERATIONS = (
    "ALTER TABLE ss_documents ADD COLUMN IF NOT EXISTS committed_at_ms bigint NOT NULL DEFAULT 0",
    # a session's row: how many generations it had before this one (the ring's position)
    "ALTER TABLE ss_documents ADD COLUMN IF NOT EXISTS generation bigint NOT NULL DEFAULT 0",
    "CREATE TABLE IF NOT EXISTS ss_generations (kind text NOT NULL, key bytea NOT NULL,"
    " slot int NOT NULL, seq bigint NOT NULL, name bytea NOT NULL, body bytea NOT NULL,"
    " digest bytea NOT NULL, size int NOT NULL, expires_at_ms bigint NOT NULL DEFAULT 0,"
    " committed_at_ms bigint NOT NULL DEFAULT 0, PRIMARY KEY (kind, key, slot))",
)
# a version-4 store's rows get their commit time from the changes still kept
FILL_COMMITTED_AT = (
    "UPDATE ss_documents d SET committed_at_ms = c.committed_at_ms FROM ss_changes c"
    " WHERE c.seq = d.seq AND d.committed_at_ms = 0"
)
# version 4: a document may expire (0: never), the sweep finds the due ones by this
# index, and a change records whether the sweep made it
EXPIRY = (
    "ALTER TABLE ss_documents ADD COLUMN IF NOT EXISTS expires_at_ms bigint NOT NULL DEFAULT 0",
    "ALTER TABLE ss_changes ADD COLUMN IF NOT EXISTS expired boolean NOT NULL DEFAULT false",
    "CREATE INDEX IF NOT EXISTS ss_documents_expiry ON ss_documents (expires_at_ms)"
    " WHERE expires_at_ms > 0",
)
# version 3's functions, replaced by those below (other arguments: a new overload)
VERSION_3_FUNCTIONS = (
    "DROP FUNCTION IF EXISTS ss_stage(boolean, bigint, bigint[], text[], bytea[], bigint[],"
    " text[], bytea[], text[], bytea[], bytea[], bytea[], bytea[], int[])",
    "DROP FUNCTION IF EXISTS ss_take_seqs(bigint, bigint, text[], bytea[], bigint[], bigint[],"
    " text[], bytea[], bytea[], int[], bigint)",
    "DROP FUNCTION IF EXISTS ss_hold_writers(text[], bytea[], boolean[])",
)
# version 4's, replaced by the one that keeps earlier generations
VERSION_4_FUNCTIONS = (
    "DROP FUNCTION IF EXISTS ss_stage(boolean, bigint, bigint[], text[], bytea[], bigint[],"
    " text[], bytea[], text[], bytea[], bytea[], bytea[], bytea[], int[], bigint[])",
)
# The tables whose bodies PostgreSQL 14 and later compress with lz4 rather than pglz
# (where the server is built with it): about a fifth less of the server's CPU per
# 4 KiB save at 64 clients, 53-58 us against 67-69 (pg_cpu_split in the performance
# page). Rows written before keep their pglz bodies; both read back the same.
LZ4_BODIES = ("ss_documents", "ss_generations")
LZ4_SINCE_VERSION = 140000  # server_version_num
# the one daemon that sweeps expired documents holds this session advisory lock
SWEEPER_LOCK = 0x5E55_1059

# A batch connection's plans (the functions' statements, its prepared reads) are
# made once and kept: made while a table is small, they would scan it whole (a hash
# join against the batch's rows) and go on scanning it as it grows. On those
# connections each row a batch names is found by its primary key instead. The two
# batch functions run their statements on generic plans (plan_cache_mode): left to
# choose, the plan cache at times planned them afresh at every call, 110-180 us each
# time (bench/pg_statements.py), for plans no better at any batch size measured.
ROWS_BY_KEY = ("enable_seqscan", "enable_hashjoin", "enable_mergejoin")  # each set off

# ss_stage: the first half of a batch, inside its transaction. It takes the writers'
# lock (shared, or exclusive), then each document's lock in the order given (sorted:
# no two batches wait on each other in a cycle). Then, each statement seeing what
# committed before it (READ COMMITTED, a volatile function), it checks that the key
# epoch and every row the batch decided on are as the daemon believed (seq, 0 for
# no row), and only then deletes and writes the batch's rows, their seq still 0.
# A session's row that a put replaces is first kept in ss_generations (under
# the session's key: p_kept_from names each key its row may lie under, during
# an online rekey the old one too, p_kept_to the key it is written under),
# over the oldest of the newest p_keep; a removed session's go with it.
# 0: staged; -1: a row moved (decide again); -2: the key epoch moved.
STAGE = f"""
CREATE OR REPLACE FUNCTION ss_stage(
    p_exclusive boolean, p_epoch bigint, p_locks bigint[],
    p_read_kinds text[], p_read_keys bytea[], p_read_seqs bigint[],
    p_del_kinds text[], p_del_keys bytea[],
    p_put_kinds text[], p_put_keys bytea[], p_put_names bytea[], p_put_bodies bytea[],
    p_put_digests bytea[], p_put_sizes int[], p_put_expires bigint[],
    p_keep int, p_kept_from bytea[], p_kept_to bytea[]
) RETURNS bigint LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    epoch bigint;
    moved boolean;
BEGIN
    IF p_exclusive THEN
        PERFORM pg_advisory_xact_lock({WRITERS_LOCK});
    ELSE
        PERFORM pg_advisory_xact_lock_shared({WRITERS_LOCK});
    END IF;
    PERFORM pg_advisory_xact_lock(k) FROM unnest(p_locks) AS k;
    SELECT c.key_epoch, EXISTS (
        SELECT 1 FROM unnest(p_read_kinds, p_read_keys, p_read_seqs) AS r(kind, key, seq)
        LEFT JOIN ss_documents d ON d.kind = r.kind AND d.key = r.key
        WHERE coalesce(d.seq, 0) <> r.seq)
    INTO epoch, moved FROM ss_counter c WHERE c.one = 1;
    IF epoch <> p_epoch THEN
        RETURN -2;
    END IF;
    IF moved THEN
        RETURN -1;
    END IF;
    IF cardinality(p_kept_to) > 0 THEN  -- an online rekey's move: they follow the row
        UPDATE ss_generations g SET key = k.to_key
            FROM unnest(p_kept_from, p_kept_to) AS k(from_key, to_key)
            WHERE k.from_key <> k.to_key AND g.kind = 's' AND g.key = k.from_key;
    END IF;
    -- one statement, one snapshot: each row a put replaces goes into its session's ring
    -- of p_keep slots, over the oldest kept (slot: the session's generation number mod
    -- p_keep), slots beyond p_keep (a smaller setting) go, and the puts are staged.
    -- A save costs the same whatever p_keep: no scan of the session's generations.
    WITH replaced AS (
        SELECT k.to_key AS key, d.seq, d.name, d.body, d.digest, d.size, d.expires_at_ms,
               d.committed_at_ms, d.generation
        FROM unnest(p_kept_from, p_kept_to) AS k(from_key, to_key)
        JOIN ss_documents d ON d.kind = 's' AND d.key = k.from_key
    ), kept AS (
        INSERT INTO ss_generations (kind, key, slot, seq, name, body, digest, size,
                                    expires_at_ms, committed_at_ms)
            SELECT 's', key, generation % p_keep, seq, name, body, digest, size,
                   expires_at_ms, committed_at_ms
            FROM replaced WHERE p_keep > 0
            ON CONFLICT (kind, key, slot) DO UPDATE SET seq = EXCLUDED.seq,
                name = EXCLUDED.name, body = EXCLUDED.body, digest = EXCLUDED.digest,
                size = EXCLUDED.size, expires_at_ms = EXCLUDED.expires_at_ms,
                committed_at_ms = EXCLUDED.committed_at_ms
    ), dropped AS (
        DELETE FROM ss_generations g USING replaced r
            WHERE g.kind = 's' AND g.key = r.key AND g.slot >= p_keep
    )
    INSERT INTO ss_documents (kind, key, name, body, digest, seq, size, expires_at_ms,
                              generation)
        SELECT u.kind, u.key, u.name, u.body, u.digest, 0, u.size, u.expires,
               coalesce(r.generation + 1, 0)
        FROM unnest(p_put_kinds, p_put_keys, p_put_names, p_put_bodies, p_put_digests,
                    p_put_sizes, p_put_expires) AS u(kind, key, name, body, digest, size, expires)
        LEFT JOIN replaced r ON u.kind = 's' AND r.key = u.key
        ON CONFLICT (kind, key) DO UPDATE SET name = EXCLUDED.name, body = EXCLUDED.body,
            digest = EXCLUDED.digest, seq = 0, size = EXCLUDED.size,
            expires_at_ms = EXCLUDED.expires_at_ms, generation = EXCLUDED.generation;
    IF cardinality(p_del_keys) > 0 THEN
        DELETE FROM ss_generations g USING unnest(p_del_kinds, p_del_keys) AS r(kind, key)
            WHERE r.kind = 's' AND g.kind = 's' AND g.key = r.key;
        DELETE FROM ss_documents d USING unnest(p_del_kinds, p_del_keys) AS r(kind, key)
            WHERE d.kind = r.kind AND d.key = r.key;
    END IF;
    RETURN 0;
END $$
"""

# ss_take_seqs: the second half, the last statement before COMMIT, given what
# ss_stage answered (it does nothing unless that is 0). It takes the counter row's
# lock, which it holds across the commit only: seq is the commit order, gapless. It
# stamps the staged rows and appends the changes. It answers the stage's status, the
# seq before the batch's first (the counter, when the batch changes nothing), and how
# long it waited for the counter row and then held it until the commit (microseconds).
TAKE_SEQS = """
CREATE OR REPLACE FUNCTION ss_take_seqs(
    p_status bigint, p_count bigint, p_put_kinds text[], p_put_keys bytea[],
    p_put_ords bigint[], p_change_ords bigint[], p_change_kinds text[],
    p_change_names bytea[], p_change_digests bytea[], p_change_sizes int[],
    p_change_expired boolean[], p_at_ms bigint,
    OUT status bigint, OUT base bigint, OUT waited_us bigint, OUT held_us bigint
) LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    asked timestamptz;
    got timestamptz;
BEGIN
    status := p_status;
    IF p_status <> 0 THEN
        RETURN;
    END IF;
    IF p_count = 0 THEN
        base := (SELECT seq FROM ss_counter WHERE one = 1);
        RETURN;
    END IF;
    asked := clock_timestamp();
    WITH counter AS (
        UPDATE ss_counter SET seq = seq + p_count WHERE one = 1
        RETURNING seq - p_count AS first, clock_timestamp() AS at
    ), stamped AS (
        UPDATE ss_documents d SET seq = counter.first + u.ord, committed_at_ms = p_at_ms
        FROM counter, unnest(p_put_kinds, p_put_keys, p_put_ords) AS u(kind, key, ord)
        WHERE d.kind = u.kind AND d.key = u.key
    ), appended AS (
        INSERT INTO ss_changes (seq, kind, name, digest, committed_at_ms, size, expired)
        SELECT counter.first + c.ord, c.kind, c.name, c.digest, p_at_ms, c.size, c.expired
        FROM counter, unnest(p_change_ords, p_change_kinds, p_change_names, p_change_digests,
                             p_change_sizes, p_change_expired)
                      AS c(ord, kind, name, digest, size, expired)
    )
    SELECT counter.first, counter.at INTO base, got FROM counter;
    waited_us := (extract(epoch FROM got - asked) * 1000000)::bigint;
    held_us := (extract(epoch FROM clock_timestamp() - got) * 1000000)::bigint;
END $$
"""
# ss_hold_writers: an exclusive batch's first statement. It takes the writers' lock
# for the session (the batch releases it once committed: its statements between run
# in autocommit), then, now that no batch is in flight, reads the counter, the key
# epoch and the rows the batch decides on (each statement of a volatile function
# sees what committed before it). One row for the counter when none is asked for.
HOLD_WRITERS = f"""
CREATE OR REPLACE FUNCTION ss_hold_writers(p_kinds text[], p_keys bytea[], p_bodies boolean[])
RETURNS TABLE (counter bigint, epoch bigint, kind text, key bytea, seq bigint, digest bytea,
               size int, body bytea, expires_at_ms bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_lock({WRITERS_LOCK});
    RETURN QUERY
        SELECT c.seq, c.key_epoch, r.kind, r.key, d.seq, d.digest, d.size,
               CASE WHEN r.body THEN d.body END, d.expires_at_ms
        FROM ss_counter c
        LEFT JOIN unnest(p_kinds, p_keys, p_bodies) AS r(kind, key, body) ON true
        LEFT JOIN ss_documents d ON d.kind = r.kind AND d.key = r.key
        WHERE c.one = 1;
END $$
"""
FUNCTIONS = (STAGE, TAKE_SEQS, HOLD_WRITERS)
MIGRATE_FROM_1 = "ALTER TABLE ss_counter ADD COLUMN key_epoch bigint NOT NULL DEFAULT 0"


def compress_bodies_with_lz4(conn: psycopg.Connection[Any]) -> None:
    """Inside the schema's transaction; a table already set is not locked again."""
    if conn.info.server_version < LZ4_SINCE_VERSION:
        return
    unset = conn.execute(
        "SELECT attrelid::regclass::text FROM pg_attribute WHERE attname = 'body'"
        " AND attrelid = ANY(%s::regclass[]) AND attcompression <> 'l'",
        (list(LZ4_BODIES),),
    ).fetchall()
    for (table,) in unset:
        try:
            with conn.transaction():  # a savepoint: a server without lz4 refuses
                conn.execute(f"ALTER TABLE {table} ALTER COLUMN body SET COMPRESSION lz4")
        except psycopg.errors.FeatureNotSupported:
            return


def lock_schema(conn: psycopg.Connection[Any]) -> None:
    """Inside a transaction: no daemon makes or checks the schema until it ends."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))


def lock_writers(conn: psycopg.Connection[Any]) -> None:
    """Inside a transaction: no batch of any daemon is deciding or committing until it
    ends (a lease change, a rekey step, a restore)."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITERS_LOCK,))


def schema_exists(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT to_regclass('ss_meta') IS NOT NULL").fetchone()
    return bool(row and row[0])


def _older_daemons(conn: psycopg.Connection[Any]) -> int:
    """Connected daemons of an earlier version: a version-2 one commits under the counter
    row's lock alone (a batch of theirs and one of ours could both decide on the same
    row), a version-3 one knows no expiry (its writes would keep a row's old one), a
    version-4 one keeps no earlier generations (its saves would drop them)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND starts_with(application_name, %s) AND strpos(application_name, %s) = 0",
        (DAEMON_APPLICATION, SCHEMA_MARK),
    ).fetchone()
    return int(row[0]) if row else 0


def ensure_schema(
    conn: psycopg.Connection[Any], sealed_with: str
) -> tuple[dict[str, str], bool, int]:
    """Creates the tables (a new database is sealed_with that key id, "" for plaintext),
    or moves them to this version; returns ss_meta, whether it created them, and the key
    epoch."""
    fill_committed_at = False
    with conn.transaction():
        lock_schema(conn)
        created = not schema_exists(conn)
        for statement in TABLES:
            conn.execute(statement)
        meta = dict(conn.execute("SELECT name, value FROM ss_meta").fetchall())
        if not meta:
            meta = {"schema_version": str(SCHEMA_VERSION), SEALED_WITH: sealed_with}
            with conn.cursor() as cursor:
                cursor.executemany("INSERT INTO ss_meta VALUES (%s, %s)", list(meta.items()))
        if meta.get("schema_version") == "1":
            conn.execute(MIGRATE_FROM_1)
            meta["schema_version"] = "2"
        if meta.get("schema_version") in ("2", "3", "4"):
            older = _older_daemons(conn)
            if older:
                raise OlderDaemonsConnected(
                    f"{older} connections of daemons of an earlier version use this "
                    "database: stop them, then start this version on every host"
                )
            for statement in VERSION_3_FUNCTIONS + VERSION_4_FUNCTIONS:
                conn.execute(statement)
            fill_committed_at = True
            meta["schema_version"] = str(SCHEMA_VERSION)
        if meta.get("schema_version") == str(SCHEMA_VERSION):
            for statement in EXPIRY + GENERATIONS:
                conn.execute(statement)
            if fill_committed_at:
                conn.execute(FILL_COMMITTED_AT)
            for statement in FUNCTIONS:
                conn.execute(statement)
            compress_bodies_with_lz4(conn)
            conn.execute(
                "UPDATE ss_meta SET value = %s WHERE name = 'schema_version'",
                (meta["schema_version"],),
            )
        epoch = conn.execute("SELECT key_epoch FROM ss_counter").fetchone()
    return meta, created, int(epoch[0]) if epoch else 0
