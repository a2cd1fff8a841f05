# Theory of operation: the backup file
#
# A backup is the state of a store at one seq: every document (sessions, loop,
# workflow and kv documents, the lease with its epoch), each as the daemon sent
# it. The file is self-checking:
#
#     "SSBACKUP" | version (1 byte) | header length (4) | header (CBOR map)
#                | xxh3-64 of all of that (8)
#     then per document:  "R" | payload length (4) | payload | xxh3-64 (8)
#     then the trailer:   "T" | length (4) | trailer (CBOR map) | xxh3-64 (8)
#     then "SSBKEND\n"
#
# Each checksum covers its record's own bytes and the checksum before it, so a
# record cannot be moved, dropped or repeated without the chain breaking. The
# header holds the backup's id, its seq, the source engine and, for a sealed
# store, the key id its payloads are sealed with (the client never sees a key:
# a sealed store's payloads, ids included, reach it sealed). The trailer repeats
# the seq and counts the documents and payload bytes. Lengths are little-endian.
#
# A backup is written to a temp file beside its name, fsynced, renamed into
# place and the directory fsynced: a file under the backup's name is whole. A
# half-written temp has no trailer, and read_backup refuses it. read_backup
# checks every byte before it yields a document, and names the offset of the
# first problem it finds.
from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import cbor2
import xxhash

MAGIC = b"SSBACKUP"
END_MAGIC = b"SSBKEND\n"
VERSION = 1
LENGTH = struct.Struct("<I")
CHECK = struct.Struct("<Q")
RECORD, TRAILER = b"R", b"T"
MAX_PAYLOAD_BYTES = 1 << 31
MAX_HEADER_BYTES = 1 << 20
READ_BYTES = 1 << 20


class DamagedBackup(Exception):
    """The file is not a whole backup: names the file and the offset."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


@dataclass(frozen=True)
class Trailer:
    seq: int
    documents: int
    payload_bytes: int


def _check(previous: int, data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(CHECK.pack(previous) + data)


class BackupWriter:
    """Writes one backup: header first, then payloads, then finish() (or abort())."""

    def __init__(self, path: str, header: dict[str, Any]) -> None:
        self.path = path
        directory = os.path.dirname(os.path.abspath(path))
        self._temp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.partial")
        # 0600: a plaintext store's backup holds its sessions' content
        descriptor = os.open(self._temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._file: BinaryIO = os.fdopen(descriptor, "wb")
        self.documents = 0
        self.payload_bytes = 0
        self.seq = header["seq"]
        encoded = cbor2.dumps(header)
        head = MAGIC + bytes([VERSION]) + LENGTH.pack(len(encoded)) + encoded
        self._previous = _check(0, head)
        self._file.write(head + CHECK.pack(self._previous))

    @property
    def temp_path(self) -> str:
        return self._temp

    def _frame(self, kind: bytes, data: bytes) -> None:
        framed = kind + LENGTH.pack(len(data)) + data
        self._previous = _check(self._previous, framed)
        self._file.write(framed + CHECK.pack(self._previous))

    def add(self, payload: bytes) -> None:
        self._frame(RECORD, payload)
        self.documents += 1
        self.payload_bytes += len(payload)

    def finish(self) -> None:
        trailer = {"seq": self.seq, "documents": self.documents, "bytes": self.payload_bytes}
        self._frame(TRAILER, cbor2.dumps(trailer))
        self._file.write(END_MAGIC)
        self._file.flush()
        os.fsync(self._file.fileno())  # every byte is on disk before the name is
        self._file.close()
        os.rename(self._temp, self.path)
        directory = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        try:
            os.fsync(directory)  # the name survives power loss
        finally:
            os.close(directory)

    def abort(self) -> None:
        self._file.close()
        os.unlink(self._temp)


class _Reader:
    def __init__(self, path: str, handle: BinaryIO) -> None:
        self.path, self.handle, self.offset = path, handle, 0

    def take(self, count: int, what: str, start: int) -> bytes:
        """count bytes of the structure that begins at start (what a short read names:
        a damaged length makes the file seem to end early)."""
        data = self.handle.read(count)
        if len(data) != count:
            raise DamagedBackup(self.path, start, f"the file ends inside {what}")
        self.offset += count
        return data


@dataclass
class Backup:
    """A backup checked whole: its header, trailer, and the offsets of its payloads."""

    path: str
    header: dict[str, Any]
    trailer: Trailer
    _payloads: list[tuple[int, int]]  # (offset, length)

    def payloads(self) -> Iterator[tuple[int, bytes]]:
        """(offset in the file, payload) of each document, in the backup's order."""
        with open(self.path, "rb") as handle:
            for offset, length in self._payloads:
                handle.seek(offset)
                yield offset, handle.read(length)


def read_backup(path: str) -> Backup:
    """Every byte checked: DamagedBackup names the first problem's offset."""
    with open(path, "rb") as handle:
        reader = _Reader(path, handle)
        head = reader.take(len(MAGIC) + 1 + LENGTH.size, "the header", 0)
        if head[: len(MAGIC)] != MAGIC:
            raise DamagedBackup(path, 0, "not a sessionstore backup")
        if head[len(MAGIC)] != VERSION:
            raise DamagedBackup(path, len(MAGIC), f"backup format {head[len(MAGIC)]} is unknown")
        (length,) = LENGTH.unpack_from(head, len(MAGIC) + 1)
        if length > MAX_HEADER_BYTES:
            raise DamagedBackup(path, len(MAGIC) + 1, "header length out of range")
        head += reader.take(length, "the header", 0)
        previous = _check(0, head)
        if CHECK.unpack(reader.take(CHECK.size, "the header's checksum", 0))[0] != previous:
            raise DamagedBackup(path, 0, "the header does not match its checksum")
        header = cbor2.loads(head[len(MAGIC) + 1 + LENGTH.size :])
        payloads: list[tuple[int, int]] = []
        payload_bytes = 0
        while True:
            at = reader.offset
            frame = reader.take(1 + LENGTH.size, "a record's frame", at)
            kind, (length,) = frame[:1], LENGTH.unpack_from(frame, 1)
            if kind not in (RECORD, TRAILER) or length > MAX_PAYLOAD_BYTES:
                raise DamagedBackup(path, at, "not a record (damaged, or not a backup)")
            data = reader.take(length, "a record", at)
            previous = _check(previous, frame + data)
            if CHECK.unpack(reader.take(CHECK.size, "a record's checksum", at))[0] != previous:
                raise DamagedBackup(path, at, "the record does not match its checksum")
            if kind == TRAILER:
                break
            payloads.append((at + len(frame), length))
            payload_bytes += length
        fields = cbor2.loads(data)
        trailer = Trailer(fields["seq"], fields["documents"], fields["bytes"])
        if reader.take(len(END_MAGIC), "the end mark", reader.offset) != END_MAGIC:
            raise DamagedBackup(path, reader.offset - len(END_MAGIC), "no end mark")
        if handle.read(1):
            raise DamagedBackup(path, reader.offset, "bytes after the end mark")
    counted = Trailer(header["seq"], len(payloads), payload_bytes)
    if trailer != counted:
        raise DamagedBackup(path, at, f"the trailer says {trailer}, the file holds {counted}")
    return Backup(path, header, trailer, payloads)
