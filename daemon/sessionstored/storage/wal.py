# Theory of operation
#
# The write-ahead log orders every mutation of the store. It holds identities
# and digests only, never session content: an intent names (seq, kind, id,
# digest, size) of a document about to be replaced or removed, a commit or an
# abort seals or drops that intent by seq. The document itself lives in its own
# file (files.py), written temp -> fsync -> rename -> fsync(dir) between the
# intent and the commit.
#
# Framing: a segment starts with SEGMENT_HEADER; each record is
#     RECORD_MAGIC (4 bytes) | xxh3_64(length + payload) (u64 LE)
#     | payload length (u32 LE) | payload
# where the payload is one CBOR array (the checksum covers adjacent bytes, so
# boot checks each record without copying it); with a key, the payload is that
# array sealed (sealing.py), so the log names no id and no digest. Segments are named by the first
# seq they may hold (16 hex digits) and rotate at SEGMENT_TARGET_BYTES, always
# at a batch boundary.
#
# Torn tail vs corruption (the etcd rule): a crash in the middle of an append
# leaves a bad record at the end of the last segment with nothing valid after
# it. That tail was never acknowledged (acknowledgement waits for fsync), so it
# is cut off, after a copy of the segment is kept as "<segment>.broken". A bad
# record anywhere else, or one followed by valid records, is corruption: the
# scan reports the file and offset and recovery decides what to do with it.
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import cbor2
import xxhash

from .fs import FileSystem
from .sealing import PLAINTEXT, Sealer, SealError

SEGMENT_HEADER = b"SSWAL\x00\x01\n"
RECORD_MAGIC = b"\xa5WR1"
RECORD_HEAD = struct.Struct("<4sQI")
LENGTH_OFFSET = 12
MAX_RECORD_PAYLOAD_BYTES = 64 * 1024
SEGMENT_TARGET_BYTES = 64 * 1024 * 1024
SEGMENT_SUFFIX = ".wal"
RECORD_ASSOCIATED_DATA = b"sessionstore/wal-record"


# (segment path, offset, payload): plain tuples, since boot makes hundreds of thousands
WalRecord = tuple[str, int, list[Any]]


class WalCorruption(Exception):
    def __init__(self, path: str, offset: int, reason: str, salvaged: list[WalRecord]) -> None:
        super().__init__(f"{path}: offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason
        self.salvaged = salvaged


def encode_record(payload: list[Any], sealer: Sealer = PLAINTEXT) -> bytes:
    body = sealer.seal(cbor2.dumps(payload), RECORD_ASSOCIATED_DATA)
    length = struct.pack("<I", len(body))
    return RECORD_MAGIC + struct.pack("<Q", xxhash.xxh3_64_intdigest(length + body)) + length + body


def _record_at(
    data: bytes | memoryview, offset: int, sealer: Sealer
) -> tuple[list[Any], int] | None:
    """The record at offset and the offset after it, or None when it is not valid."""
    start = offset + RECORD_HEAD.size
    if start > len(data):
        return None
    magic, checksum, length = RECORD_HEAD.unpack_from(data, offset)
    end = start + length
    if magic != RECORD_MAGIC or length > MAX_RECORD_PAYLOAD_BYTES or end > len(data):
        return None
    if xxhash.xxh3_64_intdigest(data[offset + LENGTH_OFFSET : end]) != checksum:
        return None
    try:
        body = data[start:end]
        if sealer.encrypted:
            body = sealer.open(bytes(body), RECORD_ASSOCIATED_DATA)
        payload = cbor2.loads(body)
    except (cbor2.CBORDecodeError, ValueError, SealError):
        return None
    if not isinstance(payload, list) or not payload:
        return None
    return payload, end


def _valid_record_after(data: bytes, offset: int, sealer: Sealer) -> int | None:
    probe = data.find(RECORD_MAGIC, offset + 1)
    while probe >= 0:
        if _record_at(data, probe, sealer) is not None:
            return probe
        probe = data.find(RECORD_MAGIC, probe + 1)
    return None


@dataclass
class SegmentScan:
    records: list[tuple[int, list[Any]]]
    valid_bytes: int
    bad_offset: int | None
    valid_after_bad: int | None


def scan_segment(data: bytes, sealer: Sealer = PLAINTEXT) -> SegmentScan:
    if not data.startswith(SEGMENT_HEADER):
        after = _valid_record_after(data, -1, sealer) if data else None
        return SegmentScan([], 0, 0, after)
    records: list[tuple[int, list[Any]]] = []
    offset = len(SEGMENT_HEADER)
    view = memoryview(data)
    while offset < len(data):
        found = _record_at(view, offset, sealer)
        if found is None:
            return SegmentScan(records, offset, offset, _valid_record_after(data, offset, sealer))
        payload, end = found
        records.append((offset, payload))
        offset = end
    return SegmentScan(records, offset, None, None)


def segment_name(first_seq: int) -> str:
    return f"{first_seq:016x}{SEGMENT_SUFFIX}"


@dataclass
class TailRepair:
    path: str
    offset: int
    dropped_bytes: int
    broken_copy: str


class WriteAheadLog:
    def __init__(self, fs: FileSystem, directory: str, sealer: Sealer) -> None:
        self.fs = fs
        self.directory = directory
        self.sealer = sealer
        self._fd: int | None = None
        self._segment_path = ""
        self._segment_bytes = 0
        self._dirty = False
        self.segments: list[str] = []

    def _path(self, name: str) -> str:
        return f"{self.directory}/{name}"

    def list_segments(self) -> list[str]:
        return sorted(n for n in self.fs.listdir(self.directory) if n.endswith(SEGMENT_SUFFIX))

    def read_all(self) -> tuple[list[WalRecord], TailRepair | None]:
        """Every record in order; repairs a torn tail, raises WalCorruption otherwise."""
        names = self.list_segments()
        records: list[WalRecord] = []
        repair = None
        for position, name in enumerate(names):
            path = self._path(name)
            data = self.fs.read_file(path, 1 << 40)
            scan = scan_segment(data, self.sealer)
            records.extend([(path, offset, payload) for offset, payload in scan.records])
            if scan.bad_offset is None:
                continue
            is_last = position == len(names) - 1
            if not is_last or scan.valid_after_bad is not None:
                reason = (
                    "bad record followed by valid records"
                    if scan.valid_after_bad is not None
                    else "bad record in a sealed segment"
                )
                raise WalCorruption(
                    path, scan.bad_offset, reason, records + self._salvage(names, position)
                )
            broken = path + ".broken"
            if self.fs.exists(broken):
                self.fs.unlink(broken)
            fd = self.fs.create_exclusive(broken)
            try:
                self.fs.write(fd, data)
                self.fs.fsync(fd)
            finally:
                self.fs.close(fd)
            if scan.bad_offset == 0:
                self.fs.unlink(path)
            else:
                self.fs.truncate(path, scan.bad_offset)
            self.fs.fsync_dir(self.directory)
            repair = TailRepair(path, scan.bad_offset, len(data) - scan.bad_offset, broken)
        return records, repair

    def _salvage(self, names: list[str], failed: int) -> list[WalRecord]:
        """Whatever valid records can still be found from the failed segment on."""
        salvaged: list[WalRecord] = []
        for name in names[failed:]:
            path = self._path(name)
            try:
                data = self.fs.read_file(path, 1 << 40)
            except OSError:
                continue
            offset = 0
            while True:
                probe = data.find(RECORD_MAGIC, offset)
                if probe < 0:
                    break
                found = _record_at(data, probe, self.sealer)
                if found is None:
                    offset = probe + 1
                    continue
                salvaged.append((path, probe, found[0]))
                offset = found[1]
        return salvaged

    def open_for_append(self, next_seq: int) -> None:
        names = self.list_segments()
        if not names:
            self._create_segment(next_seq)
            return
        self._segment_path = self._path(names[-1])
        self._segment_bytes = self.fs.file_size(self._segment_path)
        self._fd = self.fs.open_append(self._segment_path, create=False)
        self.segments = names

    def _create_segment(self, first_seq: int) -> None:
        name = segment_name(first_seq)
        path = self._path(name)
        if self.fs.exists(path):
            self.fs.unlink(path)
        fd = self.fs.create_exclusive(path)
        self.fs.write(fd, SEGMENT_HEADER)
        self.fs.fsync(fd)
        self.fs.fsync_dir(self.directory)
        if self._fd is not None:
            self.fs.close(self._fd)
        self._fd = fd
        self._segment_path = path
        self._segment_bytes = len(SEGMENT_HEADER)
        self.segments = self.list_segments()

    def append(self, payloads: list[list[Any]]) -> None:
        """Write records to the OS; durable only after sync()."""
        assert self._fd is not None, "WAL not open"
        data = b"".join(encode_record(p, self.sealer) for p in payloads)
        try:
            self.fs.write(self._fd, data)
        except OSError:
            # a short write (disk full) must not leave half a record in front of later ones
            self.fs.truncate(self._segment_path, self._segment_bytes)
            raise
        self._segment_bytes += len(data)
        self._dirty = True

    def sync(self) -> None:
        assert self._fd is not None, "WAL not open"
        self.fs.fsync(self._fd)  # durability point: every record appended so far is on disk
        self._dirty = False

    @property
    def dirty(self) -> bool:
        return self._dirty

    def needs_rotation(self) -> bool:
        return self._segment_bytes >= SEGMENT_TARGET_BYTES

    def rotate(self, next_seq: int) -> None:
        """Seal the current segment and start one whose records all have seq >= next_seq."""
        if self._dirty:
            self.sync()
        if self._segment_path.endswith(segment_name(next_seq)):
            return
        self._create_segment(next_seq)

    def rewrite(
        self, history: list[list[Any]], history_first_seq: int, next_seq: int, tmp_dir: str
    ) -> None:
        """Replace every segment by `history` (records below next_seq) and a fresh active one.

        Only after an index checkpoint at next_seq - 1 is durable. Each step leaves a log
        that boots: old segments (all covered by the checkpoint), then none, then the new
        history segment, then the new active segment.
        """
        self.sync()
        temp = None
        if history:
            temp = f"{tmp_dir}/{segment_name(history_first_seq)}.tmp"
            if self.fs.exists(temp):
                self.fs.unlink(temp)
            fd = self.fs.create_exclusive(temp)
            try:
                records = b"".join(encode_record(p, self.sealer) for p in history)
                self.fs.write(fd, SEGMENT_HEADER + records)
                self.fs.fsync(fd)  # the compacted history is whole before the old log goes
            finally:
                self.fs.close(fd)
        if self._fd is not None:
            self.fs.close(self._fd)
            self._fd = None
        for name in self.list_segments():
            self.fs.unlink(self._path(name))
        self.fs.fsync_dir(self.directory)
        if temp is not None:
            self.fs.rename(temp, self._path(segment_name(history_first_seq)))
        self._create_segment(next_seq)  # fsyncs the directory: both names are durable

    def first_segment_seq(self) -> int | None:
        names = self.list_segments()
        return int(names[0].removesuffix(SEGMENT_SUFFIX), 16) if names else None

    @property
    def size_bytes(self) -> int:
        total = 0
        for name in self.segments:
            path = self._path(name)
            total += self._segment_bytes if path == self._segment_path else self.fs.file_size(path)
        return total

    def close(self) -> None:
        if self._fd is not None:
            if self._dirty:
                self.sync()
            self.fs.close(self._fd)
            self._fd = None
