# Theory of operation: recovery
#
# Recovery runs at every open, before anything is served, and is idempotent:
# recovering twice leaves the same store as recovering once.
#
#   1. Lay out and lock: the state directory with log/, ckpt/ and tmp/ (real
#      directories, no symlinks), an exclusive flock on "lock" so that a second
#      daemon on the same directory refuses to start, and FORMAT, which names
#      the key a sealed store needs. A format-1 store (one file per generation)
#      is migrated first (migrate_v1.py). Everything under tmp/ is removed: a
#      temp file is nobody's until its rename.
#   2. Load the newest intact index checkpoint (index_checkpoint.py; each is written
#      twice). It names every segment that holds live records before its
#      position in the log. A compacted segment that no intact checkpoint names
#      was renamed in by a compaction that did not reach its checkpoint; an
#      append segment before the position that none names was compacted away
#      and not yet unlinked. Both are removed.
#   3. Read back the append segments from the checkpoint's position (read_back.py):
#      every batch whose commit record is intact is applied to the index and
#      the watch history; a last batch without one is rolled back; a torn tail
#      is cut (zeroed, with a .broken copy kept); corruption is reported with
#      file and offset, and the documents it hid are `io_error`.
#   4. Append from the end of the last intact batch; read the lease; if a key
#      rotation was interrupted, finish it (rekey.py); make the compaction
#      reserve if it is missing and there is room (reserve.py).
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Unpack

from ..documents import SESSION, Entry
from ..errors import CorruptRecord, StoreFormatError, StoreLocked
from ..mutations import Committed
from ..sealing import Sealer
from . import reserve
from .durable import TMP_DIR
from .fs import FileSystem
from .index import Index
from .index_checkpoint import CKPT_DIR, DamageRow, IndexCheckpointState
from .metadata import LEGACY_FORMAT_VERSION, RekeyBridge, read_metadata, resolve_sealer
from .migrate_v1 import migrate_v1, remove_legacy
from .read_back import ReadBackResult, read_back
from .rekey import finish_rekey
from .segment_items import Segment
from .segments import (
    APPEND,
    COMPACTED,
    LOG_DIR,
    SEGMENT_HEADER_BYTES,
    Log,
    parse_segment_header,
    segment_number,
)
from .store import Recovered, Store, StoreOptions

LOCK_FILE = "lock"
BROKEN_SUFFIX = ".broken"

__all__ = ["RecoveryReport", "StoreFormatError", "open_store", "recover"]


@dataclass
class RecoveryReport:
    records_replayed: int = 0
    batches_replayed: int = 0
    checkpoint_seq: int = 0
    checkpoint_problems: list[str] = field(default_factory=list)
    rolled_back: int = 0
    temps_removed: int = 0
    torn_tail: dict[str, Any] | None = None
    corruption: list[dict[str, Any]] = field(default_factory=list)
    orphan_segments_removed: int = 0
    damaged_documents: int = 0
    untold_damage: int = 0  # damaged records that no surviving byte names the document of
    documents: int = 0
    seq: int = 0
    duration_ms: float = 0.0
    rekey_finished: str | None = None
    migrated: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "records_replayed": self.records_replayed,
            "batches_replayed": self.batches_replayed,
            "checkpoint_seq": self.checkpoint_seq,
            "checkpoint_problems": self.checkpoint_problems,
            "rolled_back": self.rolled_back,
            "temps_removed": self.temps_removed,
            "torn_tail": self.torn_tail,
            "corruption": self.corruption,
            "orphan_segments_removed": self.orphan_segments_removed,
            "damaged_documents": self.damaged_documents,
            "untold_damage": self.untold_damage,
            "documents": self.documents,
            "seq": self.seq,
            "duration_ms": round(self.duration_ms, 3),
            "rekey_finished": self.rekey_finished,
            "migrated": self.migrated,
        }

    def summary(self) -> str:
        parts = [f"{self.documents} documents at seq {self.seq}"]
        if self.migrated:
            parts.append(f"migrated: {self.migrated}")
        if self.checkpoint_seq:
            parts.append(f"checkpoint at seq {self.checkpoint_seq}")
        parts.append(f"{self.batches_replayed} batches replayed from the log")
        if self.rolled_back:
            parts.append(f"{self.rolled_back} uncommitted intents rolled back")
        if self.temps_removed:
            parts.append(f"{self.temps_removed} temp files removed")
        if self.orphan_segments_removed:
            parts.append(f"{self.orphan_segments_removed} unreferenced segments removed")
        if self.torn_tail:
            t = self.torn_tail
            parts.append(
                f"torn log tail cut at {t['path']}:{t['offset']} ({t['dropped_bytes']} bytes)"
            )
        for c in self.corruption:
            parts.append(f"CORRUPTION at {c['path']}:{c['offset']} ({c['reason']})")
        if self.damaged_documents:
            parts.append(f"{self.damaged_documents} documents are io_error (verify lists them)")
        if self.untold_damage:
            parts.append(
                f"{self.untold_damage} damaged records no longer tell which document they "
                "held: those documents may show an older state (restore from a backup)"
            )
        if self.checkpoint_problems:
            parts.append(f"{len(self.checkpoint_problems)} damaged index checkpoints skipped")
        if self.rekey_finished:
            parts.append(f"finished a key rotation ({self.rekey_finished})")
        return "; ".join(parts) + f" in {self.duration_ms:.0f} ms"


def open_store(
    fs: FileSystem, root: str, **options: Unpack[StoreOptions]
) -> tuple[Store, RecoveryReport]:
    """A store recovered and ready to serve; the lock is released if it cannot open."""
    store = Store(fs, root, **options)
    try:
        return store, recover(store)
    except BaseException:
        store.close()
        raise


def _prepare_layout(store: Store, report: RecoveryReport) -> RekeyBridge | None:
    fs, root = store.state.fs, store.state.root
    if not fs.is_dir(root):
        raise StoreFormatError(f"{root}: state directory missing or not a directory")
    lock_fd = fs.lock_exclusive(f"{root}/{LOCK_FILE}")
    if lock_fd is None:
        raise StoreLocked(f"{root}: another sessionstored holds the lock on this state directory")
    store.hold_lock(lock_fd)
    created = False
    for name in (LOG_DIR, TMP_DIR, CKPT_DIR):
        path = f"{root}/{name}"
        if fs.exists(path) and not fs.is_dir(path):
            raise StoreFormatError(f"{path}: not a directory (symlinks are refused)")
        if not fs.exists(path):
            fs.mkdir(path)
            created = True
    if created:
        fs.fsync_dir(root)
    metadata = read_metadata(fs, root)
    sealer, bridge = resolve_sealer(fs, root, store.key, metadata)
    store.set_sealer(sealer)
    if metadata.version == LEGACY_FORMAT_VERSION:
        report.migrated = migrate_v1(store, metadata)
    elif remove_legacy(fs, root):
        report.migrated = "finished removing the format-1 files of an earlier migration"
    return bridge


def _sweep_temps(fs: FileSystem, root: str) -> int:
    directory = f"{root}/{TMP_DIR}"
    names = fs.listdir(directory)
    for name in names:
        fs.unlink(f"{directory}/{name}")
    if names:
        fs.fsync_dir(directory)
    return len(names)


def _segment_roles(store: Store, report: RecoveryReport) -> dict[int, int]:
    fs, directory = store.state.fs, store.state.log.directory
    roles: dict[int, int] = {}
    for name in fs.listdir(directory):
        number = segment_number(name)
        if number is None:
            continue
        path = f"{directory}/{name}"
        fd = fs.open_read(path)
        try:
            parsed = parse_segment_header(fs.pread(fd, SEGMENT_HEADER_BYTES, 0))
        finally:
            fs.close(fd)
        if parsed is None or parsed[0] != number:
            report.corruption.append(
                {"path": path, "offset": 0, "reason": "damaged segment header"}
            )
            continue
        roles[number] = parsed[1]
    return roles


def _choose_base(
    store: Store, report: RecoveryReport, roles: dict[int, int]
) -> tuple[IndexCheckpointState | None, set[int]]:
    """The newest intact checkpoint, and every segment that some intact checkpoint names."""
    intact, report.checkpoint_problems = store.checkpointing.files.load_all()
    if intact and [s.generation for s in intact[:2]] == [intact[0].generation] * 2:
        # both copies of the newest generation are whole: finish its pruning, so that an
        # interrupted one leaves nothing for the next crash to add to
        store.checkpointing.files.prune(keep_generation=intact[0].generation)
        intact = intact[:2]
    named = {number for state in intact for number in state.segments}
    if intact:
        return intact[0], named
    if report.checkpoint_problems:
        appends = sorted(n for n, role in roles.items() if role == APPEND)
        if COMPACTED in roles.values() or (appends and appends[0] != 1):
            raise StoreFormatError(
                f"{store.state.root}: every index checkpoint is damaged "
                f"({report.checkpoint_problems[0]}) and the log no longer reaches back to the "
                f"first batch; restore {store.checkpointing.files.directory} from a backup"
            )
    return None, named


def _shared_history(base: IndexCheckpointState) -> list[Committed]:
    """The checkpoint's history, its ids and digests the same objects as the index's where
    they are equal: 100,000 changes then cost a third less memory."""
    ids: dict[str, str] = {}
    digests: dict[bytes, bytes] = {}
    for _kind, doc_id, entry in base.index.rows():
        ids.setdefault(doc_id, doc_id)
        digests[entry.digest] = entry.digest
    history = []
    for seq, kind, doc_id, digest, at_ms, size, expired in base.history:
        history.append(
            Committed(
                seq,
                kind,
                ids.get(doc_id, doc_id),
                digests.get(digest, digest) if digest is not None else None,
                at_ms,
                size,
                expired,
            )
        )
    base.history = []
    return history


def _cut_torn_tail(store: Store, torn: dict[str, Any]) -> None:
    """Keep a copy of the torn bytes, then zero them so the next batch starts clean."""
    fs, path, offset, length = store.state.fs, torn["path"], torn["offset"], torn["dropped_bytes"]
    if length == 0:
        return
    fd = fs.open_read_write(path)
    try:
        broken = f"{path}{BROKEN_SUFFIX}"
        number = 1
        while fs.exists(broken):
            number += 1
            broken = f"{path}{BROKEN_SUFFIX}-{number}"
        copy = fs.create_exclusive(broken)
        try:
            fs.write(copy, fs.pread(fd, length, offset))
            fs.fsync(copy)
        finally:
            fs.close(copy)
        fs.fsync_dir(store.state.log.directory)
        torn["broken_copy"] = broken
        fs.pwrite(fd, bytes(length), offset)
        fs.fdatasync(fd)  # the cut is durable before anything is appended after it
    finally:
        fs.close(fd)


def recover(store: Store) -> RecoveryReport:
    started = time.monotonic()
    report = RecoveryReport()
    bridge = _prepare_layout(store, report)
    report.temps_removed = _sweep_temps(store.state.fs, store.state.root)
    roles = _segment_roles(store, report)
    base, named = _choose_base(store, report, roles)
    replayed, retiring = _plan_replay(store, report, roles, base, named)
    position = base.position if base else (0, 0)
    segments = [
        Segment(
            n,
            store.state.log.path(n),
            store.state.fs.read_file(store.state.log.path(n), 1 << 40),
            position[1] if n == position[0] else SEGMENT_HEADER_BYTES,
        )
        for n in replayed
    ]
    index = base.index if base else Index()
    result = read_back(
        segments,
        store.sealer,
        base.batch if base else 0,
        base.seq if base else 0,
        known=lambda: ((kind, doc_id) for kind, doc_id, _ in index.rows()),
    )
    history = _shared_history(base) if base else []
    damaged = {row.id_hash: row for row in base.damaged} if base else {}
    _replay(store.sealer, result, index, history, damaged, store.keep_generations)
    report.records_replayed = result.records
    report.batches_replayed = len(result.batches)
    report.rolled_back = result.rolled_back
    report.corruption.extend(result.corruption)
    if result.torn is not None:
        _cut_torn_tail(store, result.torn)
        report.torn_tail = result.torn
    since = _resume_log(store.state.log, segments, roles, result, base)
    recovered = Recovered(
        index, history, result.last_seq, result.last_batch, damaged, base, since, retiring
    )
    try:
        store.adopt(recovered)
    except CorruptRecord as error:
        # Starting without it would silently stop fencing stale writers.
        raise StoreFormatError(
            f"the lease document is unreadable ({error}); restore it, or delete it to start "
            "with no lease (writers are then unfenced until the next lease_acquire)"
        ) from None
    if bridge is not None:
        rekey = finish_rekey(store, bridge)
        report.rekey_finished = f"{rekey.bridge}, {rekey.describe()} resealed"
    report.damaged_documents = len(store.state.damaged)
    report.untold_damage = sum(1 for row in store.state.damaged.values() if row.id is None)
    report.seq = store.seq
    report.documents = sum(store.state.index.count(k) for k in store.state.index.kinds())
    report.checkpoint_seq = store.checkpointing.seq
    # the room a full disk's compaction starts from, if there is room
    reserve.ensure(store.state, store.checkpointing.files)
    report.duration_ms = (time.monotonic() - started) * 1000
    return report


def _plan_replay(
    store: Store,
    report: RecoveryReport,
    roles: dict[int, int],
    base: IndexCheckpointState | None,
    named: set[int],
) -> tuple[list[int], list[int]]:
    """The append segments to replay from the checkpoint's position, and the segments
    only an older checkpoint names (unlinked after the next one). Segments nothing
    names are removed: a compaction's that no checkpoint adopted."""
    log = store.state.log
    position = base.position if base else (0, 0)
    missing = sorted(n for n in (base.segments if base else ()) if n not in roles)
    if missing:  # a segment is unlinked only after a newer checkpoint no longer names it
        raise StoreFormatError(
            f"{log.path(missing[0])}: the newest index checkpoint names this log segment, "
            f"which is missing ({len(missing)} missing): the state directory is incomplete "
            "(copied while the daemon ran?); restore it from a backup"
        )
    if position[0] and roles.get(position[0]) != APPEND:
        raise StoreFormatError(
            f"{log.path(position[0])}: the log segment the index checkpoint continues from is "
            "missing or damaged"
        )
    replayed = sorted(n for n, role in roles.items() if role == APPEND and n >= position[0])
    orphans = sorted(n for n in roles if n not in named and n not in replayed)
    log.remove(orphans)
    report.orphan_segments_removed = len(orphans)
    newest = set(base.segments) if base else set()
    retiring = sorted(n for n in roles if n in named and n not in newest and n not in replayed)
    return replayed, retiring


def _replay(
    sealer: Sealer,
    result: ReadBackResult,
    index: Index,
    history: list[Committed],
    damaged: dict[int, DamageRow],
    keep_generations: int,
) -> None:
    """The committed batches the read-back found, into the index (with the earlier
    generations of sessions it keeps), the watch history and the damage table (a
    rewritten document is no longer damaged)."""
    for batch in result.batches:
        for intent in batch.intents:
            kind, doc_id, seq, digest, size, segment, offset, length, expires, expired = intent
            old = index.get(kind, doc_id) if kind == SESSION else None
            if digest is None:
                index.remove(kind, doc_id)
            else:
                at_ms = batch.committed_at_ms if kind == SESSION else 0
                entry = Entry(seq, digest, size, segment, offset, length, expires, at_ms)
                index.put(kind, doc_id, entry)
            if kind == SESSION:
                index.retain(doc_id, old, digest is None, keep_generations)
            if damaged:
                for id_hash in sealer.id_hashes(kind, doc_id):
                    damaged.pop(id_hash, None)
            history.append(
                Committed(seq, kind, doc_id, digest, batch.committed_at_ms, size, expired)
            )
        for row in batch.damaged:
            damaged[row.id_hash] = row


def _resume_log(
    log: Log,
    segments: list[Segment],
    roles: dict[int, int],
    result: ReadBackResult,
    base: IndexCheckpointState | None,
) -> int:
    """Tell the log which segments it holds and where the next batch goes; returns the
    bytes written since the checkpoint. An empty append segment before the last one
    holds nothing (a rotation whose batch failed, or an interrupted rekey's): it goes,
    so repeated crashes leave no junk."""
    position = base.position if base else (0, 0)
    empty = [
        s.number for s in segments[:-1] if s.number not in result.ends and s.number != position[0]
    ]
    log.remove(empty)
    segments = [s for s in segments if s.number not in empty]
    for n in empty:
        del roles[n]
    used = {n: size for n, size in (base.segments.items() if base else ()) if n in roles}
    for s in segments:
        used[s.number] = max(result.ends.get(s.number, 0), s.start) - SEGMENT_HEADER_BYTES
    log.resume(used, max([*roles, (base.next_segment - 1) if base else 0]) + 1)
    if result.end is not None:
        log.open_active(*result.end)
    return sum(max(result.ends.get(s.number, 0), s.start) - s.start for s in segments)
