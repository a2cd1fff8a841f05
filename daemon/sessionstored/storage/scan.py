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
#     it is reported with file and offset, never cut off; a record whose
#     header survived names the document and seq it held, and that document
#     is then `io_error` (neither its lost generation nor the one before it is
#     served); the scan goes on after the damage.
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .checkpoint import DamageRow
from .errors import CorruptRecord
from .log import SEGMENT_HEADER_BYTES
from .records import (
    COMMIT,
    DATA,
    DIGEST_BYTES,
    HEADER_BYTES,
    ID_LENGTH,
    KIND_NAMES,
    RECORD_MAGIC,
    Header,
    decode_commit,
    decode_meta,
    parse_header,
    payload_intact,
    record_length,
)
from .sealing import Sealer

# (kind, id, seq, digest or None, size, segment, offset, length)
Intent = tuple[str, str, int, bytes | None, int, int, int, int]


@dataclass
class Segment:
    number: int
    path: str
    data: bytes
    start: int  # where the scan begins in it


@dataclass
class Damage:
    segment: int
    path: str
    offset: int
    header: Header | None  # the header, when it is intact and only the payload is not


@dataclass
class Record:
    segment: int
    offset: int
    header: Header


@dataclass
class CommittedBatch:
    batch: int
    first_seq: int
    last_seq: int
    committed_at_ms: int
    intents: list[Intent]
    damaged: list[DamageRow]


@dataclass
class ScanResult:
    batches: list[CommittedBatch] = field(default_factory=list)
    end: tuple[int, int] | None = None  # (segment, offset) where the next batch goes
    rolled_back: int = 0  # intents of a last batch without its commit record
    torn: dict[str, Any] | None = None  # segment, path, offset, bytes of the torn tail
    corruption: list[dict[str, Any]] = field(default_factory=list)
    last_batch: int = 0
    last_seq: int = 0
    ends: dict[int, int] = field(default_factory=dict)  # segment -> end of its last record
    records: int = 0


def _first_nonzero(data: bytes, start: int) -> int | None:
    """The offset of the first byte after start that is not zero, or None."""
    stripped = len(data) - len(data[start:].lstrip(b"\0"))
    return stripped if stripped < len(data) else None


def _last_nonzero_end(data: bytes) -> int:
    return len(data.rstrip(b"\0"))


def _items(segments: list[Segment]) -> list[Record | Damage]:
    """Intact records and damaged spots, in log order."""
    items: list[Record | Damage] = []
    for segment in segments:
        data, offset = segment.data, segment.start
        while offset + HEADER_BYTES <= len(data) or (
            offset < len(data) and _first_nonzero(data, offset) is not None
        ):
            header = parse_header(data, offset)
            if header is not None and payload_intact(data, offset, header):
                items.append(Record(segment.number, offset, header))
                offset += record_length(header)
                continue
            damage_at = offset
            if data[offset : offset + HEADER_BYTES].count(0) == min(
                HEADER_BYTES, len(data) - offset
            ):
                following = _first_nonzero(data, offset)
                if following is None:
                    break  # the end of this segment's records: zeros to the end
                offset = following
                header = parse_header(data, offset)
                if header is not None and payload_intact(data, offset, header):
                    items.append(Damage(segment.number, segment.path, damage_at, None))
                    continue  # a hole of zeros before an intact record
            items.append(Damage(segment.number, segment.path, damage_at, header))
            if header is not None and offset + record_length(header) <= len(data):
                offset += record_length(header)
                continue
            resync = _next_intact(data, offset + 1)
            if resync is None:
                break
            offset = resync
    return items


def _next_intact(data: bytes, start: int) -> int | None:
    probe = data.find(RECORD_MAGIC, start)
    while probe >= 0:
        header = parse_header(data, probe)
        if header is not None and payload_intact(data, probe, header):
            return probe
        probe = data.find(RECORD_MAGIC, probe + 1)
    return None


def scan(segments: list[Segment], sealer: Sealer, last_batch: int, last_seq: int) -> ScanResult:
    result = ScanResult(last_batch=last_batch, last_seq=last_seq)
    by_number = {s.number: s for s in segments}
    items = _items(segments)
    for i in items:
        if isinstance(i, Record):
            result.records += 1
            result.ends[i.segment] = i.offset + record_length(i.header)
    pending: list[Intent] = []
    pending_damage: list[DamageRow] = []
    pending_batch: int | None = None
    pending_start: tuple[int, int] | None = None
    position = 0
    while position < len(items):
        item = items[position]
        if isinstance(item, Damage):
            torn_batch = pending_batch if pending_batch is not None else result.last_batch + 1
            later = [
                i
                for i in items[position + 1 :]
                if isinstance(i, Record) and i.header.batch != torn_batch
            ]
            if not later:
                start = pending_start or (item.segment, item.offset)
                _mark_torn(result, by_number, start, len(pending))
                return result
            result.corruption.append(
                {
                    "path": item.path,
                    "offset": item.offset,
                    "reason": "damaged record followed by intact records of later batches",
                }
            )
            if item.header is not None and item.header.type != COMMIT:
                if pending_batch is None:
                    pending_batch, pending_start = item.header.batch, (item.segment, item.offset)
                segment = by_number[item.segment]
                doc_id = surviving_id(sealer, segment.data, item.offset, item.header)
                pending_damage.append(
                    (
                        item.header.id_hash,
                        item.header.seq,
                        item.path,
                        item.offset,
                        "damaged record",
                        doc_id,
                    )
                )
            position += 1
            continue
        header = item.header
        segment = by_number[item.segment]
        if header.type != COMMIT:
            if pending_batch is not None and header.batch != pending_batch:
                result.rolled_back += len(pending)  # a batch without a commit record
                pending, pending_damage = [], []
                pending_batch = None
            if pending_batch is None:
                pending_batch, pending_start = header.batch, (item.segment, item.offset)
            try:
                kind, doc_id, digest, size = decode_meta(
                    sealer, segment.path, segment.data, item.offset, header
                )
            except CorruptRecord as error:
                result.corruption.append(
                    {"path": error.path, "offset": error.offset, "reason": error.reason}
                )
                pending_damage.append(
                    (header.id_hash, header.seq, error.path, error.offset, error.reason, None)
                )
            else:
                pending.append(
                    (
                        kind,
                        doc_id,
                        header.seq,
                        digest,
                        size,
                        item.segment,
                        item.offset,
                        record_length(header),
                    )
                )
            position += 1
            continue
        commit = decode_commit(segment.path, segment.data, item.offset, header)
        intents = pending if pending_batch == commit.batch else []
        damaged = pending_damage if pending_batch == commit.batch else []
        if pending_batch is not None and pending_batch != commit.batch:
            result.rolled_back += len(pending)
        if commit.first_seq <= result.last_seq:
            result.corruption.append(
                {
                    "path": segment.path,
                    "offset": item.offset,
                    "reason": f"batch {commit.batch} reuses seq {commit.first_seq} "
                    f"(committed up to {result.last_seq}): duplicate sequence, not applied",
                }
            )
            damaged = damaged + [
                (sealer.id_hash(i[0], i[1]), i[2], segment.path, i[6], "duplicate sequence", i[1])
                for i in intents
            ]
            intents = []
        elif len(intents) + len(damaged) != commit.intents:
            result.corruption.append(
                {
                    "path": segment.path,
                    "offset": item.offset,
                    "reason": f"batch {commit.batch} committed {commit.intents} intents, "
                    f"{len(intents)} are readable",
                }
            )
        result.batches.append(
            CommittedBatch(
                commit.batch,
                commit.first_seq,
                commit.last_seq,
                commit.committed_at_ms,
                intents,
                damaged,
            )
        )
        result.last_batch = commit.batch
        result.last_seq = max(result.last_seq, commit.last_seq)
        pending, pending_damage, pending_batch, pending_start = [], [], None, None
        position += 1
    if pending_batch is not None and pending_start is not None:
        _mark_torn(result, by_number, pending_start, len(pending))
        return result
    result.end = _end_of(segments, items)
    return result


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
    result: ScanResult, by_number: dict[int, Segment], start: tuple[int, int], rolled_back: int
) -> None:
    number, offset = start
    data = by_number[number].data
    end = max(offset, _last_nonzero_end(data))
    result.rolled_back += rolled_back
    result.torn = {
        "segment": number,
        "path": by_number[number].path,
        "offset": offset,
        "dropped_bytes": end - offset,
    }
    result.end = (number, offset)


def _end_of(segments: list[Segment], items: list[Record | Damage]) -> tuple[int, int] | None:
    if not segments:
        return None
    last = segments[-1]
    ends = [
        i.offset + record_length(i.header)
        for i in items
        if isinstance(i, Record) and i.segment == last.number
    ]
    return (last.number, max(ends, default=max(last.start, SEGMENT_HEADER_BYTES)))
