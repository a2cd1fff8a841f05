# The storage engine: commits batches of document mutations durably, serves
# committed documents, keeps the recent history for watch, checkpoints its
# index, and compacts its log. open_store() (recovery.py) returns one ready to
# serve; segments.py says how a batch reaches the disk.
#
# One batch, in order:
#   1. decide every mutation against the committed state, in commit order:
#      the lease fence, CAS (`expect`) and Rewrites (update, fork, lease
#      changes) are all decided here, so nothing slips between a check and its
#      commit; the accepted ones get consecutive seqs;
#   2. write their intent records (the new generations themselves) and the
#      batch's commit record to the log, and fdatasync it once: durable;
#   3. publish (the readers' thread): the index, the watch history, the lease.
#
# Failure rules. Until the sync the batch can be undone: the log is rewound
# (zeros over what was written), nothing is applied and the seqs are reused,
# so `seq` counts committed mutations only. A full disk there is `no_space`
# (removals still go into the segment's reserve), an injected fault
# `io_error`. A failed fdatasync is FatalStorageError: the daemon fails the
# batch and exits, and recovery decides at the next start (fsyncgate: after a
# failed sync, the page cache can no longer be trusted to hold what we wrote).
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import cbor2

from sessionstore.wire.codes import ErrorCode

from ..clock import epoch_ms
from ..decide import Accepted, decide_all, fold_txn_results, record_applied
from ..documents import NEVER, Document, Entry
from ..engine import CompactResult, Problem
from ..errors import DiskFull, FatalStorageError, InjectedFault
from ..generations import DEFAULT_KEEP_GENERATIONS
from ..history import History
from ..mutations import (
    LEASE,
    LEASE_ID,
    SESSION,
    Batch,
    Committed,
    Mutation,
    Outcome,
    Put,
    Remove,
    refused,
    split_batches,
)
from ..sealing import Key, Sealer
from . import reserve
from .backup import LogBackup
from .cache import DEFAULT_CAPACITY_BYTES, DocumentCache
from .check import check
from .checkpointing import Checkpointing
from .compaction import Compactor
from .durable import Failpoint, no_failpoint
from .fs import ENOSPC_ERRNOS, FileSystem
from .index import Index, Prepared
from .index_checkpoint import DamageRow, IndexCheckpoints, IndexCheckpointState
from .records import Commit, encode_commit, encode_data, encode_removal
from .segments import DEFAULT_SEGMENT_BYTES, Log
from .state import LogState
from .store_reads import LogCommittedState, LogReads
from .sweeping import LogExpiry

DEFAULT_MAX_DOCUMENT_BYTES = 256 * 1024 * 1024
DEFAULT_HISTORY_CHANGES = 100_000
DEFAULT_CHECKPOINT_EVERY_CHANGES = 100_000
DEFAULT_CHECKPOINT_EVERY_BYTES = 256 * 1024 * 1024
DEFAULT_COMPACT_DEAD_SHARE = 0.4


@dataclass
class Recovered:
    """What recovery rebuilt; Store.adopt() takes it whole."""

    index: Index
    history: list[Committed]
    seq: int
    batch: int
    damaged: dict[int, DamageRow]
    checkpoint: IndexCheckpointState | None
    bytes_since_checkpoint: int
    retiring: list[int]  # named only by an older checkpoint: removed after the next one


@dataclass
class LogBatch(Batch):
    prepared: Prepared | None = None  # the index's new tables, for a large batch


class StoreOptions(TypedDict, total=False):
    """Store's keyword arguments, for the functions that pass them on (open_store)."""

    max_document_bytes: int
    history_changes: int
    checkpoint_every: int
    checkpoint_every_bytes: int
    compact_dead_share: float
    read_cache_bytes: int
    segment_bytes: int
    keep_generations: int
    failpoint: Failpoint
    key: Key | None


@dataclass(frozen=True)
class LogUpkeep:
    """What the writer keeps between batches (engine.LogMaintenance)."""

    segments: Log
    compaction: Compactor
    checkpoints: Checkpointing


class Store:
    """The engine: its parts share one LogState (state.py) and are objects of their own:
    reads (store_reads.py), expiry (sweeping.py), checkpointing (checkpointing.py) and
    compaction (compaction.py); here are set-up, the commit path and publish()."""

    blocking_reads = False  # reads come from the in-memory index and the page cache
    batches_in_flight = 1  # one append and sync at a time: the log's order is the commit order
    local_commits = True
    follower = None  # this daemon is the only writer

    def __init__(
        self,
        fs: FileSystem,
        root: str,
        *,
        max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
        history_changes: int = DEFAULT_HISTORY_CHANGES,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY_CHANGES,
        checkpoint_every_bytes: int = DEFAULT_CHECKPOINT_EVERY_BYTES,
        compact_dead_share: float = DEFAULT_COMPACT_DEAD_SHARE,
        read_cache_bytes: int = DEFAULT_CAPACITY_BYTES,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        keep_generations: int = DEFAULT_KEEP_GENERATIONS,
        failpoint: Failpoint = no_failpoint,
        key: Key | None = None,
    ) -> None:
        self.max_document_bytes = max_document_bytes
        self.key = key
        sealer = Sealer(key)
        self.state = LogState(
            fs,
            root,
            sealer,
            Log(fs, root, segment_bytes),
            History(history_changes),
            DocumentCache(read_cache_bytes),
            keep_generations,
            failpoint,
        )
        self.reads = LogReads(self.state)
        self.expiry = LogExpiry(self.state)
        self.checkpointing = Checkpointing(
            self.state,
            IndexCheckpoints(fs, root, sealer),
            every_changes=checkpoint_every,
            every_bytes=checkpoint_every_bytes,
            history_changes=history_changes,
        )
        self.compactor = Compactor(self.state, self.checkpointing, compact_dead_share)
        self.maintenance = LogUpkeep(self.state.log, self.compactor, self.checkpointing)
        self._lock_fd: int | None = None

    # -- what the daemon reads of the state (engine.Engine) ---------------------------

    @property
    def seq(self) -> int:
        return self.state.seq

    @property
    def acknowledged_seq(self) -> int:
        return self.state.seq  # one writer: what it publishes is what it acknowledged

    @property
    def history(self) -> History:
        return self.state.history

    @property
    def sealer(self) -> Sealer:
        return self.state.sealer

    @property
    def lease(self) -> dict[str, Any] | None:
        return self.state.lease

    @property
    def keep_generations(self) -> int:
        return self.state.keep_generations

    @property
    def encrypted(self) -> bool:
        return self.state.sealer.encrypted

    # -- set-up (recovery.py) ---------------------------------------------------

    def hold_lock(self, fd: int) -> None:
        self._lock_fd = fd

    def set_sealer(self, sealer: Sealer) -> None:
        self.state.sealer = sealer
        self.checkpointing.files.sealer = sealer

    def adopt(self, recovered: Recovered) -> None:
        state = self.state
        state.index = recovered.index
        state.index.trim_earlier(state.keep_generations)
        state.expiries.rebuild(state.index)
        state.history.clear()
        state.history.extend(recovered.history)
        state.seq = recovered.seq
        state.batch = recovered.batch
        state.damaged = recovered.damaged
        self.checkpointing.adopt(
            recovered.checkpoint, recovered.bytes_since_checkpoint, recovered.retiring
        )
        state.cache = DocumentCache(state.cache.capacity_bytes)
        state.lease = None
        if state.index.get(LEASE, LEASE_ID) is not None or state.damage_of(LEASE, LEASE_ID):
            doc = self.reads.read(LEASE, LEASE_ID, cached=False)  # CorruptRecord if damaged
            state.lease = cbor2.loads(doc.body) if doc else None

    # -- the commit path (the writer's thread only) ---------------------------------

    def commit(self, mutations: Sequence[Mutation]) -> list[Outcome]:
        """Commit and publish in one call: for tests and tools that own the store."""
        outcomes: list[Outcome] = []
        for batch in split_batches(list(mutations), lambda m: m):
            result = self.commit_durably(batch)
            self.publish(result)
            outcomes.extend(result.outcomes)
        return outcomes

    def commit_durably(self, mutations: Sequence[Mutation]) -> Batch:
        """Make one batch durable (see split_batches for what may share one). Then publish()."""
        self.state.refuse_if_failed()
        decided_on = LogCommittedState(self.reads, self.max_document_bytes)
        now_ms = epoch_ms()
        outcomes, accepted, txn_results = decide_all(
            decided_on, mutations, self.state.seq + 1, full=False, now_ms=now_ms
        )
        batch = LogBatch([], last_seq=self.state.seq)
        try:
            if accepted:
                try:
                    self._write_batch(accepted, outcomes, batch, now_ms)
                except DiskFull:
                    outcomes, accepted, txn_results = decide_all(
                        decided_on, mutations, self.state.seq + 1, full=True, now_ms=now_ms
                    )
                    if accepted:
                        self._write_batch(accepted, outcomes, batch, now_ms)
        except DiskFull:
            for position, _, _ in accepted:
                outcomes[position] = refused(ErrorCode.NO_SPACE, "disk full")
        except FatalStorageError:
            self.state.failed = True
            raise
        batch.outcomes = fold_txn_results(outcomes, txn_results)
        assert len(batch.outcomes) == len(mutations)
        index = self.state.index
        if index.wants_prepare(batch.changes):  # publish() then applies it cheaply
            batch.prepared = index.prepare(batch.changes)
        return batch

    def _write_batch(
        self,
        accepted: list[Accepted],
        outcomes: list[Outcome | None],
        batch: Batch,
        committed_at_ms: int,
    ) -> None:
        state, log = self.state, self.state.log
        number = state.batch + 1
        records: list[bytes] = []
        for _, change, seq in accepted:
            if isinstance(change, Put):
                doc = Document(
                    change.kind, change.id, seq, change.digest, change.body, change.expires_at_ms
                )
                records.append(encode_data(state.sealer, number, doc))
            else:
                records.append(
                    encode_removal(
                        state.sealer, number, seq, change.kind, change.id, expired=change.expired
                    )
                )
        intents = b"".join(records)
        first_seq, last_seq = accepted[0][2], accepted[-1][2]
        commit = encode_commit(Commit(number, first_seq, last_seq, len(records), committed_at_ms))
        only_removals = all(isinstance(change, Remove) for _, change, _ in accepted)
        needed = len(intents) + len(commit)
        if not log.fits(needed, only_removals=only_removals):
            try:
                log.rotate(needed)
            except OSError as error:
                if isinstance(error, DiskFull):
                    raise
                raise FatalStorageError(f"cannot start a new log segment: {error}") from error
        segment, start = log.active, log.offset
        try:
            state.failpoint("before-intent")
            log.write(intents)
            state.failpoint("after-intent")
            state.failpoint("before-commit-record")
            log.write(commit)
        except OSError as error:
            self._undo(start, error, accepted, outcomes)
            return
        synced_from = time.perf_counter()
        try:
            log.sync()
        except OSError as error:
            raise FatalStorageError(f"fdatasync of the log failed: {error}") from error
        batch.sync_s = time.perf_counter() - synced_from
        state.batch = number
        self.checkpointing.bytes_since += needed
        try:
            state.failpoint("after-commit-record")
        except OSError as error:  # durable but unanswered: stop, recovery keeps it
            raise FatalStorageError(f"after the commit record: {error}") from error

        offset = start
        for (position, change, seq), record in zip(accepted, records, strict=True):
            entry = None
            if isinstance(change, Put):
                entry = Entry(
                    seq,
                    change.digest,
                    len(change.body),
                    segment,
                    offset,
                    len(record),
                    change.expires_at_ms,
                    committed_at_ms if change.kind == SESSION else 0,
                )
            batch.changes.append((change.kind, change.id, entry))
            record_applied(batch, outcomes, position, change, seq, committed_at_ms)
            offset += len(record)

    def _undo(
        self,
        start: int,
        error: OSError,
        accepted: list[Accepted],
        outcomes: list[Outcome | None],
    ) -> None:
        """The batch failed before its sync: rewind the log and refuse every change."""
        try:
            self.state.log.rewind(start)
        except OSError as rewind_error:
            raise FatalStorageError(f"cannot rewind the log: {rewind_error}") from error
        if isinstance(error, InjectedFault):
            code, message = ErrorCode.IO_ERROR, str(error)
        elif error.errno in ENOSPC_ERRNOS:
            code, message = ErrorCode.NO_SPACE, "disk full"
        else:
            raise FatalStorageError(f"writing the log failed: {error}") from error
        for position, _, _ in accepted:
            outcomes[position] = refused(code, message)

    def publish(self, batch: Batch) -> None:
        """Make a durable batch visible to readers (the event loop's thread in the daemon)."""
        state = self.state
        prepared = batch.prepared if isinstance(batch, LogBatch) else None
        replaced = self._replaced_sessions(batch.changes)
        state.index.apply(batch.changes, prepared)
        for doc_id, old, removed in replaced:
            state.index.retain(doc_id, old, removed, state.keep_generations)
        if prepared is not None:
            state.cache.discard_all(prepared.removed)
        else:
            for kind, doc_id, entry in batch.changes:
                if entry is None:
                    state.cache.discard(kind, doc_id)
        if state.damaged:
            for kind, doc_id, _entry in batch.changes:
                for id_hash in state.sealer.id_hashes(kind, doc_id):
                    state.damaged.pop(id_hash, None)
        for kind, doc_id, entry in batch.changes:
            state.expiries.schedule(kind, doc_id, NEVER if entry is None else entry.expires_at_ms)
        state.history.extend(batch.committed)
        if batch.lease_body is not None:
            state.lease = cbor2.loads(batch.lease_body)
        state.seq = batch.last_seq

    def _replaced_sessions(
        self, changes: Sequence[tuple[str, str, Entry | None]]
    ) -> list[tuple[str, Entry | None, bool]]:
        """Each session change's id, the generation it replaced, and whether it removed
        the session: what the earlier generations kept need (none kept: nothing)."""
        index = self.state.index
        if not self.state.keep_generations and not index.earlier:
            return []
        replaced: list[tuple[str, Entry | None, bool]] = []
        latest: dict[str, Entry | None] = {}
        for kind, doc_id, entry in changes:
            if kind != SESSION:
                continue
            old = latest[doc_id] if doc_id in latest else index.get(SESSION, doc_id)
            replaced.append((doc_id, old, entry is None))
            latest[doc_id] = entry
        return replaced

    def fail(self) -> None:
        self.state.failed = True

    @property
    def failed(self) -> bool:
        return self.state.failed

    def close(self) -> None:
        try:
            self.state.log.close()
        except OSError as error:
            raise FatalStorageError(f"closing the log failed: {error}") from error
        finally:
            if self._lock_fd is not None:
                self.state.fs.close(self._lock_fd)
                self._lock_fd = None

    def backup_snapshot(self) -> LogBackup:
        return LogBackup(self.state)

    def verify(self) -> tuple[int, list[Problem]]:
        return check(self.state, self.checkpointing.retiring)

    def compact(self) -> CompactResult:
        self.state.refuse_if_failed()
        return self.compactor.compact()

    def stats(self) -> dict[str, Any]:
        state, log = self.state, self.state.log
        dead, used = self.compactor.dead_bytes()
        return {
            "state_dir": state.root,  # `sessionstore where` asks the daemon, not the defaults
            "wal_bytes": log.size_bytes,
            "live_bytes": sum(state.index.live_bytes.values()),
            "log_segments": len(log.used),
            "log_dead_bytes": dead,
            "log_dead_share": round(dead / used, 3) if used else 0.0,
            "log_segments_made": dict(log.segments_made),  # by how: zero_filled, preallocated
            "checkpoint_seq": self.checkpointing.seq,
            "history_oldest_seq": state.history.oldest_seq(),
            "damaged_documents": len(state.damaged),
            "expiry_schedule_entries": len(state.expiries),
            "compaction_reserve_bytes": reserve.held_bytes(state),
            "sealed_with_key_id": state.sealer.key_id_hex,
            "read_cache": {
                "bytes": state.cache.used_bytes,
                "hits": state.cache.hits,
                "misses": state.cache.misses,
            },
        }
