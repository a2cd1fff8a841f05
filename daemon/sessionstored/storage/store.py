# The storage engine: commits batches of document mutations durably, serves
# committed documents, keeps the recent history for watch, checkpoints the
# index, and (through recovery.py) rebuilds itself at every open.
#
# One batch, in order (the failpoint names of the wire contract in brackets):
#   1. decide every mutation against the committed state, in commit order:
#      the lease fence, CAS (`expect`), and Rewrites (update, fork, lease
#      changes) are all decided here, so nothing slips between a check and its
#      commit;
#   2. [before-intent] append an intent per accepted mutation, fsync the WAL
#      [after-intent];
#   3. write each new generation to tmp/ and fsync it (in parallel threads);
#   4. [before-rename] rename each into docs/ (or unlink, for a removal)
#      [after-rename], then one fsync of docs/ for the whole batch;
#   5. [before-commit-record] append a commit record per mutation
#      [after-commit-record]; the caller may now acknowledge.
#
# The commit records of step 5 are written but not fsynced: the next batch's
# intent fsync (or close, or a checkpoint) carries them to disk. That is safe
# because recovery seals an intent whose effect is on disk (the file with that
# seq and digest is in place, or the removed file is gone), and step 4's
# directory fsync put it there before any reply. It saves one fsync per batch.
#
# Failure rules. Before any rename the batch can be undone: temps are removed,
# an abort record per intent is written and synced, and the batch's seqs are
# reused, so `seq` counts committed mutations only. A full disk there is
# `no_space`, an injected fault `io_error`; any other I/O error is fatal. From
# the first rename on nothing can be undone: every error is FatalStorageError,
# the daemon fails the batch and exits, and recovery decides at the next start.
from __future__ import annotations

import errno
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

import cbor2

from sessionstore.canonical import digest_bytes_of_canonical

from .cache import DEFAULT_CAPACITY_BYTES, DocumentCache
from .checkpoint import Checkpoints
from .files import CorruptDocument, Document, DocumentFiles
from .fs import ENOSPC_ERRNOS, FileSystem
from .history import History
from .index import Entry, Index
from .mutations import (
    ANY,
    LEASE,
    LEASE_ID,
    SESSION,
    Committed,
    Mutation,
    Outcome,
    Put,
    Refused,
    Remove,
    Rewrite,
    history_records,
    split_batches,
)
from .sealing import Key, Sealer
from .wal import WriteAheadLog

DEFAULT_MAX_DOCUMENT_BYTES = 256 * 1024 * 1024
DEFAULT_HISTORY_CHANGES = 100_000
DEFAULT_CHECKPOINT_EVERY_CHANGES = 50_000


class FatalStorageError(Exception):
    """The store can no longer promise durability: stop, and let recovery run at the next start."""


class InjectedFault(OSError):
    def __init__(self, point: str) -> None:
        super().__init__(errno.EIO, f"injected fault at failpoint {point}")
        self.point = point


class StoreLocked(Exception):
    pass


class ReadRace(Exception):
    """The document is being replaced by the batch in flight; retry once it is published."""


@dataclass
class Batch:
    outcomes: list[Outcome]
    changes: list[tuple[str, str, Entry | None]] = field(default_factory=list)
    committed: list[Committed] = field(default_factory=list)
    last_seq: int = 0
    lease_body: bytes | None = None


@dataclass(frozen=True)
class CompactResult:
    seq: int
    wal_bytes_before: int
    wal_bytes_after: int
    segments_replaced: int
    checkpoint: str


Failpoint = Callable[[str], None]


def _no_failpoint(_name: str) -> None:
    return None


def _now_ms() -> int:
    return int(time.time() * 1000)


class Store:
    def __init__(
        self,
        fs: FileSystem,
        root: str,
        *,
        max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
        history_changes: int = DEFAULT_HISTORY_CHANGES,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY_CHANGES,
        read_cache_bytes: int = DEFAULT_CAPACITY_BYTES,
        failpoint: Failpoint = _no_failpoint,
        executor: Executor | None = None,
        key: Key | None = None,
    ) -> None:
        self.fs = fs
        self.root = root
        self.max_document_bytes = max_document_bytes
        self.history_changes = history_changes
        self.checkpoint_every = checkpoint_every
        self.failpoint = failpoint
        self.executor = executor
        self.key = key
        self.sealer = Sealer(key)
        self.files = DocumentFiles(fs, root, max_document_bytes, self.sealer)
        self.wal = WriteAheadLog(fs, f"{root}/wal", self.sealer)
        self.checkpoints = Checkpoints(fs, root, self.sealer)
        self.index = Index()
        self.cache = DocumentCache(read_cache_bytes)
        self.seq = 0
        self.checkpoint_seq = 0
        self.history = History(history_changes)
        self.lease: dict[str, Any] | None = None
        self._inflight: frozenset[tuple[str, str]] = frozenset()
        self._lock_fd: int | None = None
        self._failed = False

    def open(self) -> Any:
        from .recovery import recover

        try:
            return recover(self)
        except BaseException:
            self._release_lock()
            raise

    def set_sealer(self, sealer: Sealer) -> None:
        """Recovery decides the sealer from FORMAT (and a key rotation in progress)."""
        self.sealer = sealer
        self.files.sealer = sealer
        self.wal.sealer = sealer
        self.checkpoints.sealer = sealer

    @property
    def encrypted(self) -> bool:
        return self.sealer.encrypted

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            self.fs.close(self._lock_fd)
            self._lock_fd = None

    # -- reads (any thread; never blocks on the writer) --------------------

    def head(self, kind: str, doc_id: str) -> Entry | None:
        return self.index.get(kind, doc_id)

    def read(self, kind: str, doc_id: str, *, cached: bool = True) -> Document | None:
        """The committed generation. cached=False for any thread but the readers' (the
        event loop's in the daemon): the cache is not shared between threads."""
        entry = self.index.get(kind, doc_id)
        if entry is None:
            return None
        if cached and (hit := self.cache.get(kind, doc_id, entry.seq, entry.digest)) is not None:
            return hit
        doc = self.files.read(kind, doc_id)
        if doc is not None and doc.seq == entry.seq and doc.digest == entry.digest:
            if cached:
                self.cache.put(doc)
            return doc
        if (kind, doc_id) in self._inflight:
            raise ReadRace(doc_id)
        path = self.files.path(kind, doc_id)
        if doc is None:
            raise CorruptDocument(path, 0, f"file missing for committed seq {entry.seq}")
        raise CorruptDocument(
            path, 0, f"file holds seq {doc.seq}, the committed generation is seq {entry.seq}"
        )

    # -- the commit path (the writer's thread only) -------------------------

    def commit(self, mutations: Sequence[Mutation]) -> list[Outcome]:
        """Commit and publish in one call: for tests and tools that own the store."""
        outcomes: list[Outcome] = []
        for batch in split_batches(list(mutations), lambda m: m):
            result = self.commit_durably(batch)
            self.publish(result)
            outcomes.extend(result.outcomes)
        return outcomes

    def _fence_refusal(self, fence: Any) -> Refused | None:
        lease = self.lease
        holder = lease.get("holder") if lease else None
        epoch = lease.get("epoch") if lease else None
        if fence is ANY:
            if holder is None:
                return None
            return Refused(
                "fenced",
                f"the lease is held by {holder!r} (epoch {epoch}); pass it as 'lease'",
                epoch=epoch,
                holder=holder,
            )
        if holder is not None and fence == (holder, epoch):
            return None
        return Refused(
            "fenced",
            f"lease {fence!r} is not the current one (epoch {epoch})",
            epoch=epoch,
            holder=holder,
        )

    def _read_committed(self, kind: str, doc_id: str) -> bytes | None:
        doc = self.read(kind, doc_id, cached=False)  # the writer's thread: no cache
        return doc.body if doc is not None else None

    def _decide(self, mutation: Mutation, next_seq: int) -> Put | Remove | Outcome:
        """The concrete change a mutation makes now, or the outcome that refuses it."""
        fenced = not isinstance(mutation, Rewrite) or mutation.fenced
        refusal = self._fence_refusal(mutation.fence) if fenced else None
        if refusal is not None:
            return Outcome(
                False, code=refusal.code, message=refusal.message, details=refusal.details
            )
        entry = self.index.get(mutation.kind, mutation.id)
        current = entry.digest if entry else None
        if mutation.expect is not ANY and mutation.expect != current:
            return Outcome(False, code="conflict", message="expectation not met", current=current)
        if isinstance(mutation, Remove):
            if entry is None:
                return Outcome(True, seq=next_seq - 1, existed=False, changed=False)
            return mutation
        if isinstance(mutation, Put):
            return mutation
        try:
            source = self._read_committed(*mutation.source) if mutation.source else None
            body = mutation.apply(self._read_committed(mutation.kind, mutation.id), source)
        except Refused as refused:
            return Outcome(
                False, code=refused.code, message=refused.message, details=refused.details
            )
        except (CorruptDocument, OSError) as error:
            return Outcome(False, code="io_error", message=str(error))
        if body is None:
            return Outcome(True, seq=next_seq - 1, existed=entry is not None, changed=False)
        if len(body) > self.max_document_bytes:
            return Outcome(False, code="too_large", message=f"result is {len(body)} bytes")
        return Put(mutation.kind, mutation.id, body, digest_bytes_of_canonical(body))

    def commit_durably(self, mutations: Sequence[Mutation]) -> Batch:
        """Make one batch durable (see split_batches for what may share one). Then publish()."""
        if self._failed:
            raise FatalStorageError("the store failed earlier and must be reopened")
        outcomes: list[Outcome | None] = [None] * len(mutations)
        accepted: list[tuple[int, Put | Remove, int]] = []
        next_seq = self.seq + 1
        for position, mutation in enumerate(mutations):
            decided = self._decide(mutation, next_seq)
            if isinstance(decided, Outcome):
                outcomes[position] = decided
                continue
            accepted.append((position, decided, next_seq))
            next_seq += 1
        batch = Batch([], last_seq=self.seq)
        if accepted:
            try:
                self._commit_accepted(accepted, outcomes, batch)
            except FatalStorageError:
                self._failed = True
                raise
        batch.outcomes = [o for o in outcomes if o is not None]
        assert len(batch.outcomes) == len(mutations)
        return batch

    def publish(self, batch: Batch) -> None:
        """Make a durable batch visible to readers (the event loop's thread in the daemon)."""
        for kind, doc_id, entry in batch.changes:
            if entry is None:
                self.index.remove(kind, doc_id)
                self.cache.discard(kind, doc_id)
            else:
                self.index.put(kind, doc_id, entry)
        self.history.extend(batch.committed)
        if batch.lease_body is not None:
            self.lease = cbor2.loads(batch.lease_body)
        self.seq = batch.last_seq
        self._inflight = frozenset()

    def _commit_accepted(
        self,
        accepted: list[tuple[int, Put | Remove, int]],
        outcomes: list[Outcome | None],
        batch: Batch,
    ) -> None:
        self._rotate_wal_if_full(accepted[0][2])
        intents: list[list[Any]] = []
        for _, mutation, seq in accepted:
            if isinstance(mutation, Put):
                intents.append(
                    ["I", seq, mutation.kind, mutation.id, mutation.digest, len(mutation.body)]
                )
            else:
                intents.append(["R", seq, mutation.kind, mutation.id])
        puts = [(m, seq) for _, m, seq in accepted if isinstance(m, Put)]
        # Several new generations go to tmp/ in the pool while the intents are synced: a
        # temp file is nobody's until its rename, which waits for both.
        writing = self._start_temp_writes(puts)
        try:
            self.failpoint("before-intent")
            self.wal.append(intents)
        except OSError as error:
            self._finish_temp_writes(writing, keep=False)
            self._fail_undoable(accepted, outcomes, error, intents_written=False, temps=[])
            return
        self._sync_wal("intent records")

        # Until the first rename everything is undoable; each exit collects the temp writes.
        try:
            self.failpoint("after-intent")
        except OSError as error:
            self._finish_temp_writes(writing, keep=False)
            self._fail_undoable(accepted, outcomes, error, intents_written=True, temps=[])
            return
        try:
            temps = self._finish_temp_writes(writing, keep=True)
        except OSError as error:
            self._fail_undoable(accepted, outcomes, error, intents_written=True, temps=[])
            return
        try:
            self.failpoint("before-rename")
        except OSError as error:
            self._fail_undoable(accepted, outcomes, error, intents_written=True, temps=temps)
            return

        self._inflight = frozenset((m.kind, m.id) for _, m, _ in accepted)
        temp_of = dict(zip((id(m) for m, _ in puts), temps, strict=True))
        committed_at_ms = _now_ms()
        step = "rename into docs/"
        try:
            for position, (_, mutation, _) in enumerate(accepted):
                if position:
                    self.failpoint("before-rename")
                if isinstance(mutation, Put):
                    self.files.install(temp_of[id(mutation)], mutation.kind, mutation.id)
                else:
                    self.files.remove(mutation.kind, mutation.id)
                self.failpoint("after-rename")
            step = "fsync of docs/"
            self.files.sync()
            step = "commit records"
            self.failpoint("before-commit-record")
            self.wal.append([["C", [seq for _, _, seq in accepted], committed_at_ms]])
            self.failpoint("after-commit-record")
        except OSError as error:
            raise FatalStorageError(
                f"{step} failed after the point of no return: {error}"
            ) from error

        for position, mutation, seq in accepted:
            if isinstance(mutation, Put):
                entry = Entry(seq, mutation.digest, len(mutation.body))
                batch.changes.append((mutation.kind, mutation.id, entry))
                batch.committed.append(
                    Committed(
                        seq,
                        mutation.kind,
                        mutation.id,
                        mutation.digest,
                        committed_at_ms,
                        len(mutation.body),
                    )
                )
                outcomes[position] = Outcome(True, seq=seq, digest=mutation.digest)
                if mutation.kind == LEASE and mutation.id == LEASE_ID:
                    batch.lease_body = mutation.body
            else:
                batch.changes.append((mutation.kind, mutation.id, None))
                batch.committed.append(
                    Committed(seq, mutation.kind, mutation.id, None, committed_at_ms)
                )
                outcomes[position] = Outcome(True, seq=seq, existed=True)
        batch.last_seq = accepted[-1][2]

    def _rotate_wal_if_full(self, next_seq: int) -> None:
        """A new segment starts at a batch boundary, so segment N holds seqs below N+1's name."""
        try:
            if self.wal.needs_rotation():
                self.wal.rotate(next_seq)
        except OSError as error:
            raise FatalStorageError(f"cannot start a new WAL segment: {error}") from error

    def _start_temp_writes(self, puts: list[tuple[Put, int]]) -> list[Any]:
        """Futures writing each temp file in the pool, or the documents to write inline."""
        docs = [Document(m.kind, m.id, seq, m.digest, m.body) for m, seq in puts]
        if self.executor is None or len(docs) < 2:
            return docs  # one file: a thread handoff costs about what the overlap saves
        return [self.executor.submit(self.files.write_temp, doc) for doc in docs]

    def _finish_temp_writes(self, writing: list[Any], *, keep: bool) -> list[str]:
        """The temp paths once all are written and synced; on any failure none is left behind
        and the first error is raised. keep=False: the batch is off, remove them all."""
        paths: list[str] = []
        first_error: OSError | None = None
        for item in writing:
            try:
                paths.append(
                    item.result() if isinstance(item, Future) else self.files.write_temp(item)
                )
            except OSError as error:
                first_error = first_error or error
                if not isinstance(item, Future):
                    break
        if keep and first_error is None:
            return paths
        self._remove_temps(paths)
        if keep and first_error is not None:
            raise first_error
        return []

    def _remove_temps(self, paths: list[str]) -> None:
        for path in paths:
            try:
                self.fs.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as error:
                raise FatalStorageError(f"cannot remove temp file {path}: {error}") from error

    def _fail_undoable(
        self,
        accepted: list[tuple[int, Put | Remove, int]],
        outcomes: list[Outcome | None],
        error: OSError,
        *,
        intents_written: bool,
        temps: list[str],
    ) -> None:
        if isinstance(error, InjectedFault):
            code = "io_error"
        elif error.errno in ENOSPC_ERRNOS:
            code = "no_space"
        else:
            raise FatalStorageError(f"I/O error while preparing a batch: {error}") from error
        self._remove_temps(temps)
        if intents_written:
            # Abort records only save recovery a look at the files: an intent left open is
            # rolled back at boot, and a later intent with the same seq supersedes it. So a
            # full disk here is no reason to stop.
            try:
                self.wal.append([["A", seq] for _, _, seq in accepted])
            except OSError as abort_error:
                if abort_error.errno not in ENOSPC_ERRNOS:
                    raise FatalStorageError(f"cannot write abort records: {abort_error}") from None
            else:
                self._sync_wal("abort records")
        message = "disk full" if code == "no_space" else str(error)
        for position, _, _ in accepted:
            outcomes[position] = Outcome(False, code=code, message=message)

    def _sync_wal(self, what: str) -> None:
        try:
            self.wal.sync()
        except OSError as error:
            raise FatalStorageError(f"fsync of the WAL failed ({what}): {error}") from error

    # -- checkpoints and compaction (the writer's thread, between batches) ----

    def checkpoint_due(self) -> bool:
        return self.seq - self.checkpoint_seq >= self.checkpoint_every

    def compact(self) -> CompactResult:
        """Checkpoint the index, then drop WAL segments that neither boot nor watch needs."""
        if self._failed:
            raise FatalStorageError("the store failed earlier and must be reopened")
        before = self.wal.size_bytes
        segments_before = len(self.wal.list_segments())
        retained = self.history.after(0, self.history_changes)
        try:
            self._sync_wal("before a checkpoint")
            path = self.checkpoints.write(self.seq, self.index)
            self.checkpoint_seq = self.seq
            history = history_records(retained)
            first = retained[0].seq if retained else self.seq + 1
            self.wal.rewrite(history, first, self.seq + 1, self.files.tmp_dir)
        except OSError as error:
            self._failed = True
            raise FatalStorageError(f"compaction failed: {error}") from error
        return CompactResult(self.seq, before, self.wal.size_bytes, segments_before, path)

    def close(self) -> None:
        if not self._failed:
            try:
                self.wal.close()
            except OSError as error:
                raise FatalStorageError(f"closing the WAL failed: {error}") from error
        self._release_lock()

    def session_count(self) -> int:
        return self.index.count(SESSION)
