# A segment's bytes as the read-back (read_back.py) sees them: intact records, damaged
# stretches between them (a hole of zeros, a record whose checksum fails, bytes
# that are no record), each with where it starts and where the next intact record
# begins; and the runs of damage that recovery must judge together.
from __future__ import annotations

from dataclasses import dataclass

from .damage import raw_header
from .records import (
    HEADER_BYTES,
    RECORD_MAGIC,
    Header,
    parse_header,
    payload_intact,
    record_length,
)


@dataclass
class Segment:
    number: int
    path: str
    data: bytes
    start: int  # where the read-back begins in it


@dataclass
class Damage:
    segment: int
    path: str
    offset: int
    header: Header | None  # the header, when it is intact and only the payload is not
    end: int  # the end of the bytes known to be this damaged record's


@dataclass
class Record:
    segment: int
    offset: int
    header: Header


def _first_nonzero(data: bytes, start: int) -> int | None:
    """The offset of the first byte after start that is not zero, or None."""
    stripped = len(data) - len(data[start:].lstrip(b"\0"))
    return stripped if stripped < len(data) else None


def last_nonzero_end(data: bytes) -> int:
    return len(data.rstrip(b"\0"))


def items_of(segments: list[Segment]) -> list[Record | Damage]:
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
                    items.append(Damage(segment.number, segment.path, damage_at, None, offset))
                    continue  # a hole of zeros before an intact record
            if header is not None and offset + record_length(header) <= len(data):
                end = offset + record_length(header)
                items.append(Damage(segment.number, segment.path, damage_at, header, end))
                offset = end
                continue
            raw = raw_header(data, offset) if header is None else None
            if raw is not None and payload_intact(data, offset, raw):  # its header's start rotted
                end = offset + record_length(raw)
                items.append(Damage(segment.number, segment.path, damage_at, None, end))
                offset = end
                continue
            end = min(len(data), offset + HEADER_BYTES)
            items.append(Damage(segment.number, segment.path, damage_at, header, end))
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


def damaged_regions(
    items: list[Record | Damage], position: int, by_number: dict[int, Segment]
) -> list[tuple[int, int, int, bool]]:
    """(segment, start, end, last in the log) of each run of damage from position on."""
    regions: list[tuple[int, int, int, bool]] = []
    at = position
    while at < len(items):
        first = items[at]
        if not isinstance(first, Damage):
            at += 1
            continue
        end = first.end
        while at + 1 < len(items) and isinstance(items[at + 1], Damage):
            nxt = items[at + 1]
            assert isinstance(nxt, Damage)
            if nxt.segment != first.segment:
                break
            at += 1
            end = max(end, nxt.end)
        following = items[at + 1] if at + 1 < len(items) else None
        if isinstance(following, Record) and following.segment == first.segment:
            end = following.offset
        else:
            end = max(end, last_nonzero_end(by_number[first.segment].data))
        regions.append((first.segment, first.offset, end, following is None))
        at += 1
    return regions
