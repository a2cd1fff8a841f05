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

import errno
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
from . import compaction, reserve
from .backup import LogBackup
from .cache import DEFAULT_CAPACITY_BYTES, DocumentCache
from .check import check
from .durable import Failpoint, no_failpoint
from .expiries import Expiries
from .fs import ENOSPC_ERRNOS, FileSystem
from .index import Index, Prepared
from .index_checkpoint import DamageRow, IndexCheckpoints, IndexCheckpointState
from .maintenance import Upkeep
from .records import Commit, encode_commit, encode_data, encode_removal
from .segments import DEFAULT_SEGMENT_BYTES, Log
from .store_reads import LogCommittedState, LogReads

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


class Store(LogReads):
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
        self.fs = fs
        self.root = root
        self.max_document_bytes = max_document_bytes
        self.history_changes = history_changes
        self.checkpoint_every = checkpoint_every
        self.checkpoint_every_bytes = checkpoint_every_bytes
        self.compact_dead_share = compact_dead_share
        self.keep_generations = keep_generations
        self.failpoint = failpoint
        self.key = key
        self.sealer = Sealer(key)
        self.log = Log(fs, root, segment_bytes)
        self.checkpoints = IndexCheckpoints(fs, root, self.sealer)
        self.index = Index()
        self.expiries = Expiries()
        self.cache = DocumentCache(read_cache_bytes)
        self._upkeep = Upkeep(self)
        self.history = History(history_changes)
        self.seq = 0
        self.batch = 0  # number of the last batch written
        self.lease: dict[str, Any] | None = None
        self.damaged: dict[int, DamageRow] = {}  # id hash -> a committed record found damaged
        self.checkpoint_seq = 0
        self.checkpoint_generation = 0
        self.bytes_since_checkpoint = 0
        self.retiring: list[int] = []  # segments to unlink once a checkpoint no longer names them
        self._lock_fd: int | None = None
        self._failed = False

    # -- set-up (recovery.py) ---------------------------------------------------

    def hold_lock(self, fd: int) -> None:
        self._lock_fd = fd

    def set_sealer(self, sealer: Sealer) -> None:
        self.sealer = sealer
        self.checkpoints.sealer = sealer

    def adopt(self, recovered: Recovered) -> None:
        self.index = recovered.index
        self.index.trim_earlier(self.keep_generations)
        self.expiries.rebuild(self.index)
        self.history.clear()
        self.history.extend(recovered.history)
        self.seq = recovered.seq
        self.batch = recovered.batch
        self.damaged = recovered.damaged
        checkpoint = recovered.checkpoint
        self.checkpoint_seq = checkpoint.seq if checkpoint else 0
        self.checkpoint_generation = checkpoint.generation if checkpoint else 0
        self.bytes_since_checkpoint = recovered.bytes_since_checkpoint
        self.retiring = list(recovered.retiring)
        self.cache = DocumentCache(self.cache.capacity_bytes)
        self.lease = None
        if self.index.get(LEASE, LEASE_ID) is not None or self.damage_of(LEASE, LEASE_ID):
            doc = self.read(LEASE, LEASE_ID, cached=False)  # CorruptRecord if damaged
            self.lease = cbor2.loads(doc.body) if doc else None

    @property
    def encrypted(self) -> bool:
        return self.sealer.encrypted

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
        if self._failed:
            raise FatalStorageError("the store failed earlier and must be reopened")
        state = LogCommittedState(self, self.max_document_bytes)
        now_ms = epoch_ms()
        outcomes, accepted, txn_results = decide_all(
            state, mutations, self.seq + 1, full=False, now_ms=now_ms
        )
        batch = LogBatch([], last_seq=self.seq)
        try:
            if accepted:
                try:
                    self._write_batch(accepted, outcomes, batch, now_ms)
                except DiskFull:
                    outcomes, accepted, txn_results = decide_all(
                        state, mutations, self.seq + 1, full=True, now_ms=now_ms
                    )
                    if accepted:
                        self._write_batch(accepted, outcomes, batch, now_ms)
        except DiskFull:
            for position, _, _ in accepted:
                outcomes[position] = refused(ErrorCode.NO_SPACE, "disk full")
        except FatalStorageError:
            self._failed = True
            raise
        batch.outcomes = fold_txn_results(outcomes, txn_results)
        assert len(batch.outcomes) == len(mutations)
        if self.index.wants_prepare(batch.changes):  # publish() then applies it cheaply
            batch.prepared = self.index.prepare(batch.changes)
        return batch

    def _write_batch(
        self,
        accepted: list[Accepted],
        outcomes: list[Outcome | None],
        batch: Batch,
        committed_at_ms: int,
    ) -> None:
        number = self.batch + 1
        records: list[bytes] = []
        for _, change, seq in accepted:
            if isinstance(change, Put):
                doc = Document(
                    change.kind, change.id, seq, change.digest, change.body, change.expires_at_ms
                )
                records.append(encode_data(self.sealer, number, doc))
            else:
                records.append(
                    encode_removal(
                        self.sealer, number, seq, change.kind, change.id, expired=change.expired
                    )
                )
        intents = b"".join(records)
        first_seq, last_seq = accepted[0][2], accepted[-1][2]
        commit = encode_commit(Commit(number, first_seq, last_seq, len(records), committed_at_ms))
        only_removals = all(isinstance(change, Remove) for _, change, _ in accepted)
        needed = len(intents) + len(commit)
        if not self.log.fits(needed, only_removals=only_removals):
            try:
                self.log.rotate(needed)
            except OSError as error:
                if isinstance(error, DiskFull):
                    raise
                raise FatalStorageError(f"cannot start a new log segment: {error}") from error
        segment, start = self.log.active, self.log.offset
        try:
            self.failpoint("before-intent")
            self.log.write(intents)
            self.failpoint("after-intent")
            self.failpoint("before-commit-record")
            self.log.write(commit)
        except OSError as error:
            self._undo(start, error, accepted, outcomes)
            return
        synced_from = time.perf_counter()
        try:
            self.log.sync()
        except OSError as error:
            raise FatalStorageError(f"fdatasync of the log failed: {error}") from error
        batch.sync_s = time.perf_counter() - synced_from
        self.batch = number
        self.bytes_since_checkpoint += needed
        try:
            self.failpoint("after-commit-record")
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
            self.log.rewind(start)
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
        prepared = batch.prepared if isinstance(batch, LogBatch) else None
        replaced = self._replaced_sessions(batch.changes)
        self.index.apply(batch.changes, prepared)
        for doc_id, old, removed in replaced:
            self.index.retain(doc_id, old, removed, self.keep_generations)
        if prepared is not None:
            self.cache.discard_all(prepared.removed)
        else:
            for kind, doc_id, entry in batch.changes:
                if entry is None:
                    self.cache.discard(kind, doc_id)
        if self.damaged:
            for kind, doc_id, _entry in batch.changes:
                for id_hash in self.sealer.id_hashes(kind, doc_id):
                    self.damaged.pop(id_hash, None)
        for kind, doc_id, entry in batch.changes:
            self.expiries.schedule(kind, doc_id, NEVER if entry is None else entry.expires_at_ms)
        self.history.extend(batch.committed)
        if batch.lease_body is not None:
            self.lease = cbor2.loads(batch.lease_body)
        self.seq = batch.last_seq

    def _replaced_sessions(
        self, changes: Sequence[tuple[str, str, Entry | None]]
    ) -> list[tuple[str, Entry | None, bool]]:
        """Each session change's id, the generation it replaced, and whether it removed
        the session: what the earlier generations kept need (none kept: nothing)."""
        if not self.keep_generations and not self.index.earlier:
            return []
        replaced: list[tuple[str, Entry | None, bool]] = []
        latest: dict[str, Entry | None] = {}
        for kind, doc_id, entry in changes:
            if kind != SESSION:
                continue
            old = latest[doc_id] if doc_id in latest else self.index.get(SESSION, doc_id)
            replaced.append((doc_id, old, entry is None))
            latest[doc_id] = entry
        return replaced

    # -- checkpoints (the writer's thread, between batches) ------------------------------

    def index_checkpoint_due(self) -> bool:
        return (
            self.seq - self.checkpoint_seq >= self.checkpoint_every
            or self.bytes_since_checkpoint >= self.checkpoint_every_bytes
        )

    def checkpoint_state(self) -> IndexCheckpointState:
        return IndexCheckpointState(
            generation=self.checkpoint_generation + 1,
            seq=self.seq,
            batch=self.batch,
            position=(self.log.active, self.log.offset),
            next_segment=self.log.next_number,
            segments=dict(self.log.used),
            index=self.index,
            history=self.history.after(0, self.history_changes),
            damaged=list(self.damaged.values()),
        )

    def write_index_checkpoint(self) -> str:
        """Write an index checkpoint, then remove segments that no checkpoint names.
        DiskFull (the store goes on) or InjectedFault (before-rename) change nothing;
        any other error is FatalStorageError."""
        if self._failed:
            raise FatalStorageError("the store failed earlier and must be reopened")
        state = self.checkpoint_state()
        try:
            path = self.checkpoints.write(state, self.failpoint)
        except InjectedFault as fault:
            if fault.point == "before-rename":
                raise
            self._failed = True
            raise FatalStorageError(f"index checkpoint: {fault}") from fault
        except OSError as error:
            if error.errno in ENOSPC_ERRNOS:
                raise DiskFull(errno.ENOSPC, "no space for an index checkpoint") from None
            self._failed = True
            raise FatalStorageError(f"index checkpoint failed: {error}") from error
        self.checkpoint_generation = state.generation
        self.checkpoint_seq = state.seq
        self.bytes_since_checkpoint = 0
        if self.retiring:
            retired, self.retiring = self.retiring, []
            self.log.forget(retired)
            try:
                self.log.remove(retired)
            except OSError as error:
                self._failed = True
                raise FatalStorageError(f"removing compacted segments failed: {error}") from error
        return path

    def retire(self, segments: Sequence[int]) -> None:
        """Segments the log no longer holds: unlinked once a checkpoint no longer names
        them (the newest one still may)."""
        self.retiring.extend(segments)

    def fail(self) -> None:
        self._failed = True

    @property
    def failed(self) -> bool:
        return self._failed

    def close(self) -> None:
        try:
            self.log.close()
        except OSError as error:
            raise FatalStorageError(f"closing the log failed: {error}") from error
        finally:
            if self._lock_fd is not None:
                self.fs.close(self._lock_fd)
                self._lock_fd = None

    def backup_snapshot(self) -> LogBackup:
        return LogBackup(self)

    @property
    def maintenance(self) -> Upkeep:
        """Segments, spares, checkpoints and compaction: what the writer keeps."""
        return self._upkeep

    def verify(self) -> tuple[int, list[Problem]]:
        return check(self)

    def compaction_due(self) -> bool:
        return compaction.compaction_due(self)

    def compact(self) -> CompactResult:
        if self._failed:
            raise FatalStorageError("the store failed earlier and must be reopened")
        return compaction.compact(self)

    def stats(self) -> dict[str, Any]:
        dead, used = compaction.dead_bytes(self)
        return {
            "state_dir": self.root,  # `sessionstore where` asks the daemon, not the defaults
            "wal_bytes": self.log.size_bytes,
            "live_bytes": sum(self.index.live_bytes.values()),
            "log_segments": len(self.log.used),
            "log_dead_bytes": dead,
            "log_dead_share": round(dead / used, 3) if used else 0.0,
            "log_segments_made": dict(self.log.segments_made),  # by how: zero_filled, preallocated
            "checkpoint_seq": self.checkpoint_seq,
            "history_oldest_seq": self.history.oldest_seq(),
            "damaged_documents": len(self.damaged),
            "expiry_schedule_entries": len(self.expiries),
            "compaction_reserve_bytes": reserve.held_bytes(self),
            "sealed_with_key_id": self.sealer.key_id_hex,
            "read_cache": {
                "bytes": self.cache.used_bytes,
                "hits": self.cache.hits,
                "misses": self.cache.misses,
            },
        }
