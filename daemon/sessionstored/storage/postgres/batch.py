# One batch as one PostgreSQL transaction, overlapping with the batches of
# every other daemon on the same database.
#
# Theory of operation. A batch decides on what it reads (decide.py) and then
# commits; on many hosts, two batches must never both decide on the same
# state of a document. Each batch therefore locks what it touches, not the
# whole database:
#   - the writers' lock, shared (schema.py): held exclusive only by what needs
#     no batch in flight (a lease change, a delete_prefix, an append, a rekey
#     step);
#   - one advisory lock per document, a keyed hash of its id (a collision
#     only serialises two batches), taken in sorted order so that no two
#     batches wait on each other in a cycle;
#   - the counter row, last, inside ss_take_seqs: the statement before COMMIT.
#     seq is the commit order, gapless: a batch takes its seqs only when all
#     it writes is staged, and holds the row only across its commit.
#
# What a batch decides on is read optimistically, the way etcd's STM reads:
# from this daemon's row cache (rows it wrote or read before), else in one
# query before the transaction, with no lock held. ss_stage then takes the
# locks and, before writing anything, checks that every row decided on still
# has the seq it was read at (0 for no row) and that the key epoch has not
# moved. A row that moved sends the batch back to decide again, with those
# rows read afresh; after MAX_OPTIMISTIC_TRIES it runs exclusive, which
# always succeeds. A save that names no expected generation reads nothing but
# the lease, which the cache holds: such a batch is one round trip,
# ss_stage and ss_take_seqs in one statement, committed as it ends
# (autocommit, synchronous_commit on: its reply arrives after the WAL flush).
#
# A batch that needs the seq at decide time (an append's key is its seq) or a
# range of keys (delete_prefix), or that changes the lease, or that touches
# more than MAX_DOCUMENT_LOCKS documents, runs exclusive: ss_hold_writers takes
# the writers' lock for the session and reads the counter and the batch's rows
# under it; the batch decides, commits the same way, then releases the lock.
# Three round trips, each statement in autocommit.
#
# With failpoints armed (tests), the two halves run as separate statements in
# one explicit transaction, so that a failpoint can hold a batch open between
# them, its rows staged and its locks held, before it takes the counter.
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg

from sessionstore.wire.canonical import digest_bytes_of_canonical

from ..decide import decide_all, fold_txn_results, record_applied
from ..errors import CorruptRecord
from ..mutations import (
    LEASE,
    LEASE_ID,
    SESSION,
    Batch,
    Mutation,
    Outcome,
    Put,
    Remove,
    mutation_keys,
    needs_whole_store,
)
from .batch_state import (
    ABSENT,
    Known,
    PgCommittedState,
    Row,
    RowCache,
    documents_read,
    guessed_absent,
    lock_id,
    rows_to_read,
)
from .binary_arrays import bools, byteas, int4s, int8s, texts
from .connection import CountedConnection, PgDatabase
from .reads import PgReads
from .schema import WRITERS_LOCK

MAX_OPTIMISTIC_TRIES = 8  # then the batch runs exclusive, which always succeeds
# a batch touching more documents runs exclusive: it locks nothing else, while every
# advisory lock takes a slot of the server's lock table (max_locks_per_transaction x
# max_connections; past it PostgreSQL answers "out of shared memory")
MAX_DOCUMENT_LOCKS = 1024
STAGED, STALE, EPOCH_MOVED = 0, -1, -2  # what ss_stage answers


_STAGE_CALL = (
    "ss_stage(%b::boolean, %b::bigint, %b::bigint[], %b::text[], %b::bytea[], %b::bigint[],"
    " %b::text[], %b::bytea[], %b::text[], %b::bytea[], %b::bytea[], %b::bytea[],"
    " %b::bytea[], %b::int[], %b::bigint[], %b::int, %b::bytea[], %b::bytea[])"
)
_TAKE_SEQS_ARGS = (
    "%b::bigint, %b::text[], %b::bytea[], %b::bigint[],"
    " %b::bigint[], %b::text[], %b::bytea[], %b::bytea[], %b::int[], %b::bool[], %b::bigint"
)
# the stage's answer is a scalar subquery: evaluated once, before ss_take_seqs runs
COMMIT_IN_ONE = f"SELECT * FROM ss_take_seqs((SELECT {_STAGE_CALL}), {_TAKE_SEQS_ARGS})"
STAGE = f"SELECT {_STAGE_CALL}"
TAKE_SEQS = f"SELECT * FROM ss_take_seqs(0, {_TAKE_SEQS_ARGS})"
HOLD_WRITERS = "SELECT * FROM ss_hold_writers(%b::text[], %b::bytea[], %b::bool[])"
READ_ROWS = (
    "SELECT r.kind, r.key, d.seq, d.digest, d.size, CASE WHEN r.body THEN d.body END,"
    " d.expires_at_ms"
    " FROM unnest(%b::text[], %b::bytea[], %b::bool[]) AS r(kind, key, body)"
    " LEFT JOIN ss_documents d ON d.kind = r.kind AND d.key = r.key"
)


@dataclass
class Timing:
    """Where the batches' time went since the daemon started, for stats (ms, summed)."""

    batches: int = 0
    round_trips: int = 0  # statements sent on the batch's connection, each waited for
    retries: int = 0
    exclusive: int = 0
    read_ms: float = 0.0  # reading rows the cache lacked, before the transaction
    commit_ms: float = 0.0  # the commit statement(s), round trips and WAL flush included
    counter_wait_ms: float = 0.0  # waiting for the counter row
    counter_held_ms: float = 0.0  # holding it, until the COMMIT began (the flush follows)

    def took(self, waited_us: int | None, held_us: int | None) -> None:
        self.counter_wait_ms += (waited_us or 0) / 1000
        self.counter_held_ms += (held_us or 0) / 1000

    def as_dict(self) -> dict[str, Any]:
        per = max(self.batches, 1)
        return {
            "batches": self.batches,
            "round_trips_per_batch_mean": round(self.round_trips / per, 3),
            "retries": self.retries,
            "exclusive": self.exclusive,
            "read_ms_mean": round(self.read_ms / per, 3),
            "commit_ms_mean": round(self.commit_ms / per, 3),
            "counter_wait_ms_mean": round(self.counter_wait_ms / per, 3),
            "counter_held_before_commit_ms_mean": round(self.counter_held_ms / per, 3),
        }


def runs_exclusive(mutations: Sequence[Mutation]) -> bool:
    return any(needs_whole_store(mutation) for mutation in mutations)


def _touches_many(mutations: Sequence[Mutation]) -> bool:
    touched = 0
    for mutation in mutations:
        touched += len(mutation_keys(mutation) or ())
        if touched > MAX_DOCUMENT_LOCKS:
            return True
    return False


@dataclass
class _Plan:
    """A decided batch as the arrays the two functions take."""

    offset: int  # decided seqs minus this are the changes' ordinals (1, 2, ...)
    deletes: tuple[list[str], list[bytes]] = field(default_factory=lambda: ([], []))
    # kind, key, name, body, digest, size, ordinal, expires_at_ms
    puts: list[list[Any]] = field(default_factory=lambda: [[], [], [], [], [], [], [], []])
    # ordinal, kind, name, digest, size, expired
    changes: list[list[Any]] = field(default_factory=lambda: [[], [], [], [], [], []])
    # a put session's keys its row may lie under, and the key it is written under
    kept: tuple[list[bytes], list[bytes]] = field(default_factory=lambda: ([], []))
    learned: dict[Row, tuple[int, Known]] = field(default_factory=dict)  # row -> (ordinal, seen)
    locks: set[int] = field(default_factory=set)


class BatchCommitter:
    """Commits the store's batches: seals and keys rows with db, reads what an exclusive
    batch ranges over through reads; the row cache is its own."""

    def __init__(
        self, db: PgDatabase, reads: PgReads, failpoint: Callable[[str], None] | None
    ) -> None:
        self.db = db
        self.reads = reads
        self.cache = RowCache()
        self.failpoint = failpoint
        self.timing = Timing()

    # -- reading what a batch decides on -------------------------------------------

    def _read(
        self, conn: psycopg.Connection[Any], rows: Sequence[Row], bodies: set[Row]
    ) -> dict[Row, Known]:
        if not rows:
            return {}
        result = conn.execute(READ_ROWS, _rows_named(rows, bodies)).fetchall()
        return self._known(result)

    def _known(self, result: Sequence[Sequence[Any]]) -> dict[Row, Known]:
        """Rows as read (kind, key, seq, digest, size, body, expires_at_ms; seq None: no
        row), opened, and learned by the cache."""
        found: dict[Row, Known] = {}
        for kind, key, seq, digest, size, body, expires_at_ms in result:
            row = (kind, bytes(key))
            if seq is None:
                found[row] = ABSENT
                continue
            what = kind.encode()
            where = f"ss_documents ({kind}, key {row[1].hex()})"
            plain_digest = self.db.open(bytes(digest), b"digest:" + what, where)
            plain_body = None if body is None else self.db.open(body, b"body:" + what, where)
            if plain_body is not None and digest_bytes_of_canonical(plain_body) != plain_digest:
                raise CorruptRecord(f"postgresql {where}", 0, "body digest mismatch")
            found[row] = Known(seq, plain_digest, size, plain_body, expires_at_ms)
        # only the lease's body is kept: a Rewrite reads its target's afresh
        self.cache.learn(
            {r: k if r[0] == LEASE else replace(k, body=None) for r, k in found.items()}
        )
        return found

    def _state(
        self,
        conn: psycopg.Connection[Any],
        mutations: Sequence[Mutation],
        fresh: set[Row],
    ) -> PgCommittedState:
        documents, body_docs = documents_read(mutations)
        documents.add((LEASE, LEASE_ID))
        body_docs.add((LEASE, LEASE_ID))
        maybe_new = guessed_absent(mutations)
        rows: dict[Row, Known] = {}
        missing: list[Row] = []
        bodies: set[Row] = set()
        for kind, doc_id in documents:
            needs_body = (kind, doc_id) in body_docs
            for key in self.db.keys(kind, doc_id):
                row = (kind, key)
                known = None if row in fresh else self.cache.get(row)
                if known is None and row not in fresh and (kind, doc_id) in maybe_new:
                    known = ABSENT
                no_body = known is not None and known.digest is not None and known.body is None
                if known is None or (needs_body and no_body):
                    missing.append(row)
                    if needs_body:
                        bodies.add(row)
                else:
                    rows[row] = known
        started = time.perf_counter()
        rows.update(self._read(conn, missing, bodies))
        self.timing.read_ms += (time.perf_counter() - started) * 1000

        def reread(row: Row) -> Known:
            return self._read(conn, [row], {row})[row]

        return PgCommittedState(self.db, self.reads, rows, reread)

    # -- committing -------------------------------------------------------------------

    def commit(self, conn: CountedConnection, mutations: Sequence[Mutation], now_ms: int) -> Batch:
        """conn is in autocommit mode. Raises psycopg.Error (the batch's outcome is then
        unknown, io_error), CorruptRecord (a row it read does not open or match its
        digest: nothing is written, io_error), FatalStorageError (a key this daemon
        lacks)."""
        self.timing.batches += 1
        sent = conn.statements
        try:
            return self._commit(conn, mutations, now_ms)
        finally:
            self.timing.round_trips += conn.statements - sent

    def _commit(
        self, conn: psycopg.Connection[Any], mutations: Sequence[Mutation], now_ms: int
    ) -> Batch:
        if runs_exclusive(mutations) or _touches_many(mutations):
            return self._exclusive(conn, mutations, now_ms)
        fresh: set[Row] = set()
        for _ in range(MAX_OPTIMISTIC_TRIES):
            state = self._state(conn, mutations, fresh)
            outcomes, accepted, txn_results = decide_all(
                state, mutations, 1, full=False, now_ms=now_ms
            )
            plan = self._plan(accepted, 0)
            status, base = self._apply(conn, plan, state.consulted, now_ms, exclusive=False)
            if status == STAGED:
                return self._finish(plan, base, outcomes, accepted, txn_results, now_ms)
            self.timing.retries += 1
            if status == EPOCH_MOVED:
                self._rekeyed(conn)
                fresh = set()
            else:
                fresh |= set(state.consulted)
                self.cache.forget(list(state.consulted))
        return self._exclusive(conn, mutations, now_ms)

    def _exclusive(
        self, conn: psycopg.Connection[Any], mutations: Sequence[Mutation], now_ms: int
    ) -> Batch:
        """Under the writers' lock, held for the session from the first statement until
        the batch has committed: three round trips, each statement in autocommit."""
        self.timing.exclusive += 1
        wanted, bodies = rows_to_read(self.db, mutations)
        try:
            held = conn.execute(HOLD_WRITERS, _rows_named(wanted, bodies)).fetchall()
            counter, epoch = held[0][0], held[0][1]
            rekeyed = epoch != self.db.key_epoch
            self.db.check_keying(conn, epoch)
            if rekeyed:  # the rows it read were named under the keys held before
                self.cache.clear()
                wanted, bodies = rows_to_read(self.db, mutations)
                rows = self._read(conn, wanted, bodies)
            else:
                rows = self._known([row[2:] for row in held if row[2] is not None])
            state = PgCommittedState(
                self.db, self.reads, rows, lambda row: self._read(conn, [row], {row})[row]
            )
            state.scan_conn = conn
            outcomes, accepted, txn_results = decide_all(
                state, mutations, counter + 1, full=False, now_ms=now_ms
            )
            plan = self._plan(accepted, counter)
            status, base = self._apply(conn, plan, state.consulted, now_ms, exclusive=True)
            if status != STAGED or base != counter:  # nothing moves under the lock
                raise psycopg.InternalError(
                    f"an exclusive batch found the store moved (stage {status}, seq {base}"
                    f" where {counter} was read)"
                )
        finally:
            _release_writers(conn)
        return self._finish(plan, base, outcomes, accepted, txn_results, now_ms)

    def _rekeyed(self, conn: psycopg.Connection[Any]) -> None:
        row = conn.execute("SELECT key_epoch FROM ss_counter WHERE one = 1").fetchone()
        self.db.check_keying(conn, row[0] if row else 0)
        self.cache.clear()

    def _plan(self, accepted: list[Any], offset: int) -> _Plan:
        db = self.db
        plan = _Plan(offset)
        final: dict[tuple[str, str], tuple[Put | Remove, int, tuple[Any, ...] | None]] = {}
        for _, change, seq in accepted:
            ordinal = seq - offset
            row = None
            if isinstance(change, Put):  # the change's name and digest are the row's
                row = db.document_row(change.kind, change.id, change.body, change.digest, 0)
                _, _, name, _, digest, _, size = row
            else:
                name = db.seal(change.id.encode(), b"name:" + change.kind.encode())
                digest, size = None, 0
            expired = isinstance(change, Remove) and change.expired
            for column, value in zip(
                plan.changes, (ordinal, change.kind, name, digest, size, expired), strict=True
            ):
                column.append(value)
            final[(change.kind, change.id)] = (change, ordinal, row)
        for (kind, doc_id), (change, ordinal, row) in final.items():
            keys = db.keys(kind, doc_id)
            plan.locks.add(lock_id(kind, keys[0]))
            removed = keys[1:] if row is not None else keys
            for key in removed:
                plan.deletes[0].append(kind)
                plan.deletes[1].append(key)
                plan.learned[(kind, key)] = (ordinal, ABSENT)
            if row is not None and isinstance(change, Put):
                _, key, name, body, digest, _, size = row
                if kind == SESSION:
                    plan.kept[0].extend(keys)
                    plan.kept[1].extend([key] * len(keys))
                expires = change.expires_at_ms
                for column, value in zip(
                    plan.puts, (kind, key, name, body, digest, size, ordinal, expires), strict=True
                ):
                    column.append(value)
                lease_body = change.body if kind == LEASE else None
                plan.learned[(kind, key)] = (
                    ordinal,
                    Known(ordinal, change.digest, size, lease_body, expires),
                )
        return plan

    def _apply(
        self,
        conn: psycopg.Connection[Any],
        plan: _Plan,
        consulted: dict[Row, int],
        now_ms: int,
        *,
        exclusive: bool,
    ) -> tuple[int, int]:
        """(ss_stage's answer, the seq before the batch's first)."""
        if exclusive:  # the writers' lock, exclusive, covers every document
            plan.locks.clear()
        else:  # what it decided on is locked too; the lease is the writers' lock's: it
            for kind, key in consulted:  # changes only under it, held exclusive
                if kind != LEASE:
                    plan.locks.add(lock_id(kind, key))
        put_kinds, put_keys, names, bodies, digests, sizes, ordinals, expires = plan.puts
        put_kinds_array, put_keys_array = texts(put_kinds), byteas(put_keys)
        stage_args = (
            exclusive,
            self.db.key_epoch,
            int8s(sorted(plan.locks)),
            texts([kind for kind, _ in consulted]),
            byteas([key for _, key in consulted]),
            int8s(list(consulted.values())),
            texts(plan.deletes[0]),
            byteas(plan.deletes[1]),
            put_kinds_array,
            put_keys_array,
            byteas(names),
            byteas(bodies),
            byteas(digests),
            int4s(sizes),
            int8s(expires),
            self.db.keep_generations,
            byteas(plan.kept[0]),
            byteas(plan.kept[1]),
        )
        change_ordinals, change_kinds, change_names, change_digests, change_sizes, expired = (
            plan.changes
        )
        take_args = (
            len(change_ordinals),
            put_kinds_array,
            put_keys_array,
            int8s(ordinals),
            int8s(change_ordinals),
            texts(change_kinds),
            byteas(change_names),
            byteas(change_digests),
            int4s(change_sizes),
            bools(expired),
            now_ms,
        )
        started = time.perf_counter()
        try:
            if self.failpoint is None:
                row = conn.execute(COMMIT_IN_ONE, (*stage_args, *take_args)).fetchone()
            else:
                row = self._apply_in_steps(conn, stage_args, take_args)
            assert row is not None
            status, base, waited_us, held_us = row
            self.timing.took(waited_us, held_us)
            return status, (-1 if base is None else base)
        finally:
            self.timing.commit_ms += (time.perf_counter() - started) * 1000

    def _apply_in_steps(
        self,
        conn: psycopg.Connection[Any],
        stage_args: tuple[Any, ...],
        take_args: tuple[Any, ...],
    ) -> tuple[int, int | None, int | None, int | None]:
        """The two halves as two statements in one transaction, a failpoint between."""
        assert self.failpoint is not None
        hit = self.failpoint
        hit("before-intent")
        self.timing.round_trips += 2  # the transaction's BEGIN and COMMIT
        with conn.transaction():
            staged = conn.execute(STAGE, stage_args).fetchone()
            status = staged[0] if staged else STALE
            if status != STAGED:
                return status, None, None, None
            hit("after-intent")
            hit("before-commit-record")
            taken = conn.execute(TAKE_SEQS, take_args).fetchone()
        assert taken is not None
        _, base, waited_us, held_us = taken
        return STAGED, int(base), waited_us, held_us

    def _finish(
        self,
        plan: _Plan,
        base: int,
        outcomes: list[Outcome | None],
        accepted: list[Any],
        txn_results: dict[int, list[dict[str, Any]]],
        now_ms: int,
    ) -> Batch:
        if self.failpoint is not None:
            self.failpoint("after-commit-record")
        shift = base - plan.offset
        outcomes = [
            replace(o, seq=o.seq + shift) if o is not None and o.seq is not None else o
            for o in outcomes
        ]
        batch = Batch([], last_seq=base)
        for position, change, seq in accepted:
            record_applied(batch, outcomes, position, change, seq + shift, now_ms)
        self.cache.learn(
            {
                row: known if known.seq == 0 else replace(known, seq=base + ordinal)
                for row, (ordinal, known) in plan.learned.items()
            }
        )
        batch.outcomes = fold_txn_results(outcomes, txn_results)
        return batch


def _rows_named(rows: Sequence[Row], bodies: set[Row]) -> tuple[Any, ...]:
    """READ_ROWS' and HOLD_WRITERS' arguments: each row's kind and key, and whether its
    body is wanted."""
    return (
        texts([kind for kind, _ in rows]),
        byteas([key for _, key in rows]),
        bools([row in bodies for row in rows]),
    )


def _release_writers(conn: psycopg.Connection[Any]) -> None:
    """After an exclusive batch, committed or not; a connection that cannot say so is
    closed, which releases the lock too."""
    if conn.closed:
        return
    try:
        conn.execute("SELECT pg_advisory_unlock(%s)", (WRITERS_LOCK,))
    except psycopg.Error:
        conn.close()
