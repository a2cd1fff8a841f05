# Theory of operation
#
# Recovery runs at every open, before anything is served, and is idempotent:
# recovering twice leaves the same store as recovering once.
#
#   1. Lay out and lock: state dir with wal/, docs/, tmp/, ckpt/ (real
#      directories, no symlinks), an exclusive flock on "lock" so a second
#      daemon on the same directory refuses to start, and the FORMAT marker,
#      which also names the key a sealed store needs (metadata.py).
#   2. Load the newest intact index checkpoint, if any, and read the WAL (wal.py
#      cuts a torn tail, keeping a .broken copy). The WAL must reach back to the
#      checkpoint; a gap is corruption.
#   3. Replay every retained record into the watch history; those after the
#      checkpoint also into the index. Intents are held by seq, a commit applies one, an
#      abort drops it. Sequence numbers that repeat or go backwards, or a commit
#      with no intent, fail closed as corruption.
#   4. Resolve what is left: only the last batch can still hold intents (its
#      commit records ride on the next fsync). An intent whose effect is on disk
#      (the file carries its seq and digest; a removed file is gone) is sealed
#      with a commit record; any other is rolled back with an abort record and
#      the previous generation stands.
#   5. Remove every temp file under tmp/.
#   6. If a key rotation was interrupted, finish it (rekey.py).
#
# If the WAL is corrupt (not a torn tail), the damage is reported with file and
# offset, the log directory is moved aside as wal.corrupt-N, and the index is
# rebuilt from the document files, which carry their own id, seq and digest. The
# new log continues from the highest seq seen anywhere, so seq never goes back.
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cbor2

from .checkpoint import CKPT_DIR
from .files import DOCS_DIR, TMP_DIR, CorruptDocument
from .index import Entry, Index
from .metadata import RekeyBridge, StoreFormatError, resolve_sealer
from .mutations import LEASE, LEASE_ID, Committed
from .rekey import finish_rekey
from .wal import WalCorruption, WalRecord

if TYPE_CHECKING:
    from .store import Store

LOCK_FILE = "lock"
WAL_DIR = "wal"

__all__ = ["RecoveryReport", "StoreFormatError", "recover"]


@dataclass
class RecoveryReport:
    records_replayed: int = 0
    checkpoint_seq: int = 0
    checkpoint_problems: list[str] = field(default_factory=list)
    sealed: list[int] = field(default_factory=list)
    rolled_back: list[int] = field(default_factory=list)
    temps_removed: int = 0
    torn_tail: dict[str, Any] | None = None
    wal_corruption: dict[str, Any] | None = None
    rebuilt_from_files: bool = False
    unreadable_files: list[dict[str, Any]] = field(default_factory=list)
    documents: int = 0
    seq: int = 0
    duration_ms: float = 0.0
    rekey_finished: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "records_replayed": self.records_replayed,
            "checkpoint_seq": self.checkpoint_seq,
            "checkpoint_problems": self.checkpoint_problems,
            "sealed": len(self.sealed),
            "rolled_back": len(self.rolled_back),
            "temps_removed": self.temps_removed,
            "torn_tail": self.torn_tail,
            "wal_corruption": self.wal_corruption,
            "rebuilt_from_files": self.rebuilt_from_files,
            "unreadable_files": self.unreadable_files,
            "documents": self.documents,
            "seq": self.seq,
            "duration_ms": round(self.duration_ms, 3),
            "rekey_finished": self.rekey_finished,
        }

    def summary(self) -> str:
        parts = [f"{self.documents} documents at seq {self.seq}"]
        if self.checkpoint_seq:
            parts.append(f"checkpoint at seq {self.checkpoint_seq}")
        parts.append(f"{self.records_replayed} WAL records replayed")
        if self.sealed:
            parts.append(f"{len(self.sealed)} intents sealed")
        if self.rolled_back:
            parts.append(f"{len(self.rolled_back)} intents rolled back")
        if self.temps_removed:
            parts.append(f"{self.temps_removed} temp files removed")
        if self.torn_tail:
            parts.append(
                f"torn WAL tail cut at {self.torn_tail['path']}:{self.torn_tail['offset']}"
            )
        if self.wal_corruption:
            c = self.wal_corruption
            parts.append(
                f"WAL corrupt at {c['path']}:{c['offset']} ({c['reason']}), rebuilt from files"
            )
        if self.rekey_finished:
            parts.append(f"finished a key rotation ({self.rekey_finished})")
        return "; ".join(parts) + f" in {self.duration_ms:.0f} ms"


@dataclass
class _Replay:
    index: Index
    pending: dict[int, list[Any]]
    last_seq: int
    history: list[Committed] = field(default_factory=list)


def _replay(records: list[WalRecord], index: Index, base_seq: int) -> _Replay:
    """Apply records after base_seq (the checkpoint's) to index; all of them to the history."""
    pending: dict[int, list[Any]] = {}
    history: list[Committed] = []
    last_seq = 0
    for path, offset, payload in records:
        kind = payload[0]
        if kind == "C":
            # ["C", [seq, ...], committed_at_ms]: one commit record per batch
            seqs, committed_at_ms = payload[1], payload[2]
            for seq in seqs:
                intent = pending.pop(seq, None)
                if intent is None or seq <= last_seq:
                    raise WalCorruption(path, offset, f"commit of unknown seq {seq}", [])
                history.append(_committed(intent, committed_at_ms))
                if seq > base_seq:
                    _apply(index, intent)
                last_seq = seq
            continue
        seq = payload[1] if len(payload) > 1 else None
        if not isinstance(seq, int):
            raise WalCorruption(path, offset, f"record without a seq: {payload!r}", [])
        if kind == "H":
            # a compacted change: intent and commit in one record
            _, _, doc_kind, doc_id, digest, size, committed_at_ms = payload
            if seq <= last_seq:
                raise WalCorruption(path, offset, f"history seq {seq} repeats or goes back", [])
            change = Committed._make((seq, doc_kind, doc_id, digest, committed_at_ms, size))
            history.append(change)
            if seq > base_seq:
                _apply(index, _intent_of(change))
            last_seq = seq
            continue
        if kind in ("I", "R"):
            if seq <= last_seq:
                raise WalCorruption(
                    path,
                    offset,
                    f"intent seq {seq} not above committed seq {last_seq} (duplicate sequence)",
                    [],
                )
            pending[seq] = payload
        elif kind == "A":
            pending.pop(seq, None)
        else:
            raise WalCorruption(path, offset, f"unknown record type {kind!r}", [])
    return _Replay(index, pending, max(last_seq, base_seq), history)


def _committed(intent: list[Any], committed_at_ms: int) -> Committed:
    if intent[0] == "I":
        return Committed._make(
            (intent[1], intent[2], intent[3], intent[4], committed_at_ms, intent[5])
        )
    return Committed._make((intent[1], intent[2], intent[3], None, committed_at_ms, 0))


def _intent_of(change: Committed) -> list[Any]:
    if change.digest is None:
        return ["R", change.seq, change.kind, change.id]
    return ["I", change.seq, change.kind, change.id, change.digest, change.size]


def _apply(index: Index, intent: list[Any]) -> None:
    if intent[0] == "I":
        _, seq, kind, doc_id, digest, size = intent
        index.put(kind, doc_id, Entry._make((seq, digest, size)))
    else:
        _, _, kind, doc_id = intent
        index.remove(kind, doc_id)


def _effect_on_disk(store: Store, intent: list[Any]) -> bool:
    kind, doc_id = intent[2], intent[3]
    try:
        doc = store.files.read(kind, doc_id)
    except CorruptDocument:
        return False
    if intent[0] == "R":
        return doc is None
    return doc is not None and doc.seq == intent[1] and doc.digest == intent[4]


def _prepare_layout(store: Store) -> RekeyBridge | None:
    fs, root = store.fs, store.root
    if not fs.is_dir(root):
        raise StoreFormatError(f"{root}: state directory missing or not a directory")
    lock_fd = fs.lock_exclusive(f"{root}/{LOCK_FILE}")
    if lock_fd is None:
        from .store import StoreLocked

        raise StoreLocked(f"{root}: another sessionstored holds the lock on this state directory")
    store._lock_fd = lock_fd
    created = False
    for name in (WAL_DIR, DOCS_DIR, TMP_DIR, CKPT_DIR):
        path = f"{root}/{name}"
        if fs.exists(path) and not fs.is_dir(path):
            raise StoreFormatError(f"{path}: not a directory (symlinks are refused)")
        if not fs.exists(path):
            fs.mkdir(path)
            created = True
    if created:
        fs.fsync_dir(root)
    sealer, bridge = resolve_sealer(fs, root, store.key)
    store.set_sealer(sealer)
    return bridge


def _rebuild_from_files(store: Store, report: RecoveryReport, floor_seq: int) -> _Replay:
    index = Index()
    last_seq = floor_seq
    for name in sorted(store.files.list_names()):
        try:
            doc = store.files.read_path(name)
        except (CorruptDocument, OSError) as error:
            report.unreadable_files.append({"file": name, "error": str(error)})
            continue
        index.put(doc.kind, doc.id, Entry(doc.seq, doc.digest, len(doc.body)))
        last_seq = max(last_seq, doc.seq)
    report.rebuilt_from_files = True
    return _Replay(index, {}, last_seq)


def _quarantine_wal(store: Store) -> str:
    fs, root = store.fs, store.root
    number = 1
    while fs.exists(f"{root}/{WAL_DIR}.corrupt-{number}"):
        number += 1
    aside = f"{root}/{WAL_DIR}.corrupt-{number}"
    fs.rename(f"{root}/{WAL_DIR}", aside)
    fs.mkdir(f"{root}/{WAL_DIR}")
    fs.fsync_dir(root)
    return aside


def _check_wal_reaches(store: Store, base_seq: int) -> None:
    first = store.wal.first_segment_seq()
    if first is not None and first > base_seq + 1:
        path = f"{store.wal.directory}/{store.wal.list_segments()[0]}"
        covered = f"the checkpoint ends at seq {base_seq}" if base_seq else "there is no checkpoint"
        raise WalCorruption(path, 0, f"WAL starts at seq {first} but {covered}", [])


def recover(store: Store) -> RecoveryReport:
    started = time.monotonic()
    report = RecoveryReport()
    bridge = _prepare_layout(store)
    checkpoint, report.checkpoint_problems = store.checkpoints.load_latest()
    base_seq = checkpoint.seq if checkpoint else 0
    report.checkpoint_seq = base_seq
    rebuilt = False
    try:
        records, repair = store.wal.read_all()
        if repair is not None:
            report.torn_tail = {
                "path": repair.path,
                "offset": repair.offset,
                "dropped_bytes": repair.dropped_bytes,
                "broken_copy": repair.broken_copy,
            }
        _check_wal_reaches(store, base_seq)
        replay = _replay(records, checkpoint.index if checkpoint else Index(), base_seq)
        report.records_replayed = len(records)
        if not records and checkpoint is None and store.files.list_names():
            replay = _rebuild_from_files(store, report, 0)
            rebuilt = True
    except WalCorruption as corruption:
        salvaged_seqs = [
            seq
            for _path, _offset, payload in corruption.salvaged
            for seq in (payload[1] if payload[0] == "C" else payload[1:2])
            if isinstance(seq, int)
        ]
        aside = _quarantine_wal(store)
        report.wal_corruption = {
            "path": corruption.path,
            "offset": corruption.offset,
            "reason": corruption.reason,
            "moved_to": aside,
        }
        replay = _rebuild_from_files(store, report, max([base_seq, *salvaged_seqs]))
        rebuilt = True

    store.wal.open_for_append(replay.last_seq + 1)
    resolution: list[list[Any]] = []
    now_ms = int(time.time() * 1000)
    for seq in sorted(replay.pending):
        intent = replay.pending[seq]
        if _effect_on_disk(store, intent):
            _apply(replay.index, intent)
            replay.history.append(_committed(intent, now_ms))
            report.sealed.append(seq)
            replay.last_seq = seq
        else:
            resolution.append(["A", seq])
            report.rolled_back.append(seq)
    if report.sealed:
        resolution.append(["C", report.sealed, now_ms])
    if resolution:
        store.wal.append(resolution)
        store.wal.sync()
    report.temps_removed = len(store.files.sweep_temps())

    store.index = replay.index
    store.seq = replay.last_seq
    store.checkpoint_seq = base_seq
    if rebuilt:
        # the old log is gone: a checkpoint of the rebuilt index is where the new one starts from
        store.checkpoints.write(store.seq, store.index)
        store.checkpoint_seq = store.seq
    store.history.clear()
    store.history.extend(replay.history)
    store.lease = None
    if store.index.get(LEASE, LEASE_ID) is not None:
        try:
            doc = store.read(LEASE, LEASE_ID, cached=False)
            store.lease = cbor2.loads(doc.body) if doc else None
        except (CorruptDocument, OSError) as error:
            # Starting without it would silently stop fencing stale writers.
            raise StoreFormatError(
                f"the lease document is unreadable ({error}); restore it, or delete it to start "
                "with no lease (writers are then unfenced until the next lease_acquire)"
            ) from None
    if bridge is not None:
        rekey = finish_rekey(store, bridge)
        report.rekey_finished = f"{rekey.bridge}, {rekey.resealed} documents resealed"
        report.unreadable_files.extend({"error": line} for line in rekey.unreadable)
    report.seq = replay.last_seq
    report.documents = sum(replay.index.count(k) for k in replay.index.kinds())
    report.duration_ms = (time.monotonic() - started) * 1000
    return report
