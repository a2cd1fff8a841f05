# Reading the log back: the records after an index checkpoint, grouped into
# batches, and the verdict on anything damaged. recovery.py applies the result.
#
# Torn tail or corruption, decided by write order: a batch is written only
# after the previous batch's sync returned, so only the last batch can be torn
# by a crash, and the pages of its write may land in any order (some of its
# records intact, a hole of zeros or garbage among them). So at damaged bytes:
#   - if every intact record after them belongs to that same last batch, or
#     there is none, it is a torn tail: the batch was never acknowledged; it is
#     rolled back, and its bytes are kept as a .broken copy, then zeroed;
#   - if any intact record of a later batch follows, the damage is corruption:
#     it is reported with file and offset, never cut off; the documents the
#     damaged record held (damage.py says how they are told) are then
#     `io_error` (neither the lost generation nor the one before it is
#     served); the read-back goes on after the damage;
#   - damage among intact records of the last batch is a torn tail only if it
#     looks like one: a torn write leaves zeros where its pages did not land
#     (damage.py); rot in the last batch, which was acknowledged, is corruption
#     like any other. Damage after the last intact commit with nothing intact
#     after it is always a torn tail: no acknowledged batch lies there.
# A batch whose intents are followed by a record of a later batch, with no
# intact commit record between, was committed (the later batch was written
# only after its sync): its commit record rotted, and its documents are
# `io_error`, never rolled back to their older generations.
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import CorruptRecord
from ..sealing import Sealer
from .damage import all_regions_look_torn, rows_for_damaged_header
from .index_checkpoint import DamageRow
from .records import (
    COMMIT,
    DATA,
    DIGEST_BYTES,
    HEADER_BYTES,
    ID_LENGTH,
    KIND_NAMES,
    Header,
    decode_commit,
    decode_meta,
    record_length,
)
from .segment_items import Damage, Record, Segment, damaged_regions, items_of, last_nonzero_end
from .segments import SEGMENT_HEADER_BYTES


class Intent(NamedTuple):
    """A Data (digest, size) or Removal (None, 0) record of a batch, and where it is."""

    kind: str
    id: str
    seq: int
    digest: bytes | None
    size: int
    segment: int
    offset: int
    length: int
    expires_at_ms: int = 0
    expired: bool = False  # a removal by the expiry sweep


@dataclass
class CommittedBatch:
    batch: int
    first_seq: int
    last_seq: int
    committed_at_ms: int
    intents: list[Intent]
    damaged: list[DamageRow]


@dataclass
class ReadBackResult:
    batches: list[CommittedBatch] = field(default_factory=list)
    end: tuple[int, int] | None = None  # (segment, offset) where the next batch goes
    rolled_back: int = 0  # intents of a last batch without its commit record
    torn: dict[str, Any] | None = None  # segment, path, offset, bytes of the torn tail
    corruption: list[dict[str, Any]] = field(default_factory=list)
    last_batch: int = 0
    last_seq: int = 0
    ends: dict[int, int] = field(default_factory=dict)  # segment -> end of its last record
    records: int = 0


class _Names:
    """Which document an id hash names, as far as the index and the batches read so far
    know: built only when a damaged header asks."""

    def __init__(self, sealer: Sealer, known: Callable[[], Iterable[tuple[str, str]]]) -> None:
        self._sealer = sealer
        self._known = known
        self._seen: list[tuple[str, str]] = []
        self._by_hash: dict[int, str] | None = None
        self._added = 0

    def saw(self, kind: str, doc_id: str) -> None:
        self._seen.append((kind, doc_id))

    def __call__(self, id_hash: int) -> str | None:
        if self._by_hash is None:
            self._by_hash = {}
            for kind, doc_id in self._known():
                for h in self._sealer.id_hashes(kind, doc_id):
                    self._by_hash[h] = doc_id
        for kind, doc_id in self._seen[self._added :]:
            for h in self._sealer.id_hashes(kind, doc_id):
                self._by_hash[h] = doc_id
        self._added = len(self._seen)
        return self._by_hash.get(id_hash)


@dataclass
class _Pending:
    """The batch being read: its intents, and its damaged records."""

    batch: int | None = None
    start: tuple[int, int] | None = None
    intents: list[Intent] = field(default_factory=list)
    damaged: list[DamageRow] = field(default_factory=list)
    top_seq: int = 0  # the highest seq an intact header of it names

    def begin(self, batch: int, segment: int, offset: int) -> None:
        if self.batch is None:
            self.batch, self.start = batch, (segment, offset)


def read_back(
    segments: list[Segment],
    sealer: Sealer,
    last_batch: int,
    last_seq: int,
    known: Callable[[], Iterable[tuple[str, str]]] = lambda: (),
) -> ReadBackResult:
    """known: the (kind, id) of every document before the first segment (the index)."""
    return _Reader(segments, sealer, last_batch, last_seq, known).run()


LATER_BATCHES_FOLLOW = "damaged record followed by intact records of later batches"
ROT_IN_LAST_BATCH = (
    "damaged record in the last committed batch (bit rot: a torn write leaves zeros)"
)


class _Reader:
    """One pass over the items of the log: each intent joins the batch being read, each
    commit record closes it, and each damaged stretch is either the torn tail (the log
    ends there) or corruption (recorded, and the read-back goes on past it)."""

    def __init__(
        self,
        segments: list[Segment],
        sealer: Sealer,
        last_batch: int,
        last_seq: int,
        known: Callable[[], Iterable[tuple[str, str]]],
    ) -> None:
        self.segments = segments
        self.sealer = sealer
        self.result = ReadBackResult(last_batch=last_batch, last_seq=last_seq)
        self.by_number = {s.number: s for s in segments}
        self.names = _Names(sealer, known)
        self.items = items_of(segments)
        self.pending = _Pending()
        self.rot_at_end = False  # damage in the last batch that is not a torn write

    def run(self) -> ReadBackResult:
        for item in self.items:
            if isinstance(item, Record):
                self.result.records += 1
                self.result.ends[item.segment] = item.offset + record_length(item.header)
        for position, item in enumerate(self.items):
            if isinstance(item, Damage):
                if self._damage(position, item):
                    return self.result
            elif item.header.type != COMMIT:
                self._intent(item)
            else:
                self._commit(item)
        return self._finish()

    def _later_batch_follows(self, position: int, batch: int) -> bool:
        following = self.items[position + 1 :]
        return any(isinstance(i, Record) and i.header.batch != batch for i in following)

    def _is_torn(self, position: int) -> bool:
        """Whether damage with nothing of a later batch after it is the torn tail of an
        unacknowledged write (etcd's isTornEntry): no record of its own batch is around
        it (bytes after an intact commit with nothing intact after them were never
        acknowledged), or every damaged region holds the zeros a torn write leaves
        (damage.py)."""
        following = self.items[position + 1 :]
        own = self.pending.batch is not None or any(isinstance(i, Record) for i in following)
        regions = damaged_regions(self.items, position, self.by_number)
        return not own or all_regions_look_torn(lambda n: self.by_number[n].data, regions)

    def _damage(self, position: int, item: Damage) -> bool:
        """True when the damage is the torn tail: the log ends at the batch it began."""
        pending = self.pending
        torn_batch = pending.batch if pending.batch is not None else self.result.last_batch + 1
        if not self.rot_at_end and not self._later_batch_follows(position, torn_batch):
            if self._is_torn(position):
                start = pending.start or (item.segment, item.offset)
                _mark_torn(self.result, self.by_number, start, len(pending.intents))
                return True
            self.rot_at_end = True
        reason = ROT_IN_LAST_BATCH if self.rot_at_end else LATER_BATCHES_FOLLOW
        self.result.corruption.append({"path": item.path, "offset": item.offset, "reason": reason})
        data = self.by_number[item.segment].data
        if item.header is not None and item.header.type != COMMIT:
            pending.begin(item.header.batch, item.segment, item.offset)
            pending.top_seq = max(pending.top_seq, item.header.seq)
            doc_id = surviving_id(self.sealer, data, item.offset, item.header)
            if doc_id is None:
                doc_id = self.names(item.header.id_hash)
            pending.damaged.append(
                DamageRow(
                    item.header.id_hash, item.header.seq, item.path, item.offset,
                    "damaged record", doc_id,
                )
            )  # fmt: skip
        elif item.header is None:
            rows = rows_for_damaged_header(self.sealer, item.path, data, item.offset, self.names)
            if rows:
                pending.begin(torn_batch, item.segment, item.offset)
                pending.damaged.extend(rows)
        return False

    def _intent(self, item: Record) -> None:
        header, segment = item.header, self.by_number[item.segment]
        if self.pending.batch is not None and header.batch != self.pending.batch:
            self.pending = _lost_commit(self.result, self.pending, self.sealer, self.by_number)
        pending = self.pending
        pending.begin(header.batch, item.segment, item.offset)
        pending.top_seq = max(pending.top_seq, header.seq)
        try:
            meta = decode_meta(self.sealer, segment.path, segment.data, item.offset, header)
        except CorruptRecord as error:
            self.result.corruption.append(
                {"path": error.path, "offset": error.offset, "reason": error.reason}
            )
            pending.damaged.append(
                DamageRow(header.id_hash, header.seq, error.path, error.offset, error.reason, None)
            )
            return
        self.names.saw(meta.kind, meta.id)
        pending.intents.append(
            Intent(
                meta.kind, meta.id, header.seq, meta.digest, meta.size, item.segment,
                item.offset, record_length(header), meta.expires_at_ms, meta.expired,
            )
        )  # fmt: skip

    def _commit(self, item: Record) -> None:
        result, segment = self.result, self.by_number[item.segment]
        commit = decode_commit(segment.path, segment.data, item.offset, item.header)
        if self.pending.batch is not None and self.pending.batch != commit.batch:
            self.pending = _lost_commit(result, self.pending, self.sealer, self.by_number)
        intents, damaged = self.pending.intents, self.pending.damaged
        where = {"path": segment.path, "offset": item.offset}
        if commit.first_seq <= result.last_seq:
            reason = (
                f"batch {commit.batch} reuses seq {commit.first_seq} "
                f"(committed up to {result.last_seq}): duplicate sequence, not applied"
            )
            result.corruption.append({**where, "reason": reason})
            damaged = damaged + [
                DamageRow(
                    self.sealer.id_hash(i.kind, i.id), i.seq, segment.path, i.offset,
                    "duplicate sequence", i.id,
                )
                for i in intents
            ]  # fmt: skip
            intents = []
        elif len(intents) + len(damaged) != commit.intents:
            reason = (
                f"batch {commit.batch} committed {commit.intents} intents, "
                f"{len(intents)} are readable"
            )
            result.corruption.append({**where, "reason": reason})
        result.batches.append(
            CommittedBatch(
                commit.batch, commit.first_seq, commit.last_seq, commit.committed_at_ms,
                intents, damaged,
            )
        )  # fmt: skip
        result.last_batch = commit.batch
        result.last_seq = max(result.last_seq, commit.last_seq)
        self.pending = _Pending()

    def _finish(self) -> ReadBackResult:
        """The end of the log: a batch left open is a torn tail, unless rot was found in
        the last batch (then its commit record was lost to the rot)."""
        pending, result = self.pending, self.result
        if pending.batch is not None and pending.start is not None:
            if not self.rot_at_end:
                _mark_torn(result, self.by_number, pending.start, len(pending.intents))
                return result
            _lost_commit(result, pending, self.sealer, self.by_number)
        result.end = _end_of(self.segments, self.items, past_damage=self.rot_at_end)
        return result


def _lost_commit(
    result: ReadBackResult, pending: _Pending, sealer: Sealer, by_number: dict[int, Segment]
) -> _Pending:
    """The batch read so far was committed, but its commit record is damaged: its documents
    are io_error. Returns a fresh pending batch."""
    assert pending.batch is not None and pending.start is not None
    rows = list(pending.damaged)
    for kind, doc_id, seq, _digest, _size, number, offset, _length, *_ in pending.intents:
        rows.append(
            DamageRow(
                sealer.id_hash(kind, doc_id),
                seq,
                by_number[number].path,
                offset,
                f"the commit record of batch {pending.batch} is damaged",
                doc_id,
            )
        )
    number, offset = pending.start
    if pending.intents:  # (damaged records alone were reported where they lie)
        result.corruption.append(
            {
                "path": by_number[number].path,
                "offset": offset,
                "reason": f"batch {pending.batch} has no intact commit record, yet it was "
                f"committed: its {len(rows)} documents are io_error",
            }
        )
    seqs = [i.seq for i in pending.intents]
    first = min(seqs, default=pending.top_seq)
    result.batches.append(CommittedBatch(pending.batch, first, pending.top_seq, 0, [], rows))
    result.last_batch = max(result.last_batch, pending.batch)
    result.last_seq = max(result.last_seq, pending.top_seq)
    return _Pending()


def surviving_id(sealer: Sealer, data: bytes, offset: int, header: Header) -> str | None:
    """The id a damaged plaintext record still holds, if its header's hash vouches for it."""
    kind = KIND_NAMES.get(header.kind)
    if sealer.encrypted or kind is None:
        return None
    start = offset + HEADER_BYTES + (DIGEST_BYTES if header.type == DATA else 0)
    if start + 2 > len(data):
        return None
    (length,) = ID_LENGTH.unpack_from(data, start)
    try:
        doc_id = data[start + 2 : start + 2 + length].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return doc_id if sealer.id_hash(kind, doc_id) == header.id_hash else None


def _mark_torn(
    result: ReadBackResult, by_number: dict[int, Segment], start: tuple[int, int], rolled_back: int
) -> None:
    number, offset = start
    data = by_number[number].data
    end = max(offset, last_nonzero_end(data))
    result.rolled_back += rolled_back
    result.torn = {
        "segment": number,
        "path": by_number[number].path,
        "offset": offset,
        "dropped_bytes": end - offset,
    }
    result.end = (number, offset)


def _end_of(
    segments: list[Segment], items: list[Record | Damage], *, past_damage: bool
) -> tuple[int, int] | None:
    """Where the next batch goes: after the last intact record, or after every damaged
    byte when rot was found at the end (it stays, for `verify` and for the next start)."""
    if not segments:
        return None
    last = segments[-1]
    ends = [
        i.offset + record_length(i.header)
        for i in items
        if isinstance(i, Record) and i.segment == last.number
    ]
    if past_damage:
        ends.append(last_nonzero_end(last.data))
        ends.extend(i.end for i in items if isinstance(i, Damage) and i.segment == last.number)
    return (last.number, max(ends, default=max(last.start, SEGMENT_HEADER_BYTES)))
