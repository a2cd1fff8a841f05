# Theory of operation: the log
#
# The log is the data. Every new generation of every document is a record in
# it (records.py), and so is every removal; an in-memory index (index.py) says
# where each document's current generation lies.
#
# Segments. The log is a set of segment files in log/, named by a number that
# only grows (16 hex digits, ".seg"). Each starts with a 32-byte header naming
# its number and its role:
#   - append segments take batches in order; the newest is the active one;
#   - compacted segments hold live records copied out of older segments
#     (compaction.py); they are only reached through an index checkpoint.
# An append segment is created at its full size (fsynced before it is named),
# one of two ways, chosen by how many bytes the log's recent commits carried:
#   - zero-filled, while commits are small: appending a batch and fdatasync
#     then change no file metadata. It is zero-filled one 4 KiB page per write:
#     filled in 1 MiB writes, the kernel (6.18, ext4) kept it in 1 MiB folios
#     and every later small append dirtied a whole one, so each fdatasync wrote
#     1 MiB (write amplification 10 in the space benchmark); dropping those
#     pages from the cache instead made every append read its partial last
#     page back first. Measured here, per 4.2 KB append (not page-aligned) +
#     fdatasync: 0.044 ms, 8 KiB written, nothing read, with 4 KiB zero-fill
#     writes; 0.050 ms and 1 MiB written with 1 MiB ones; 0.075 ms and a 4 KiB
#     read with the cache dropped; 0.108 ms on a growing file.
#   - preallocated (fallocate: its blocks allocated, none written, read as
#     zeros), once commits average PREALLOCATE_FROM_COMMIT_BYTES or more: every
#     fdatasync then also records which blocks now hold data (on this disk
#     about 0.04 ms more per commit), but no byte of the log is written twice.
#     Zero-filling costs the kernel about 20 ms of CPU per 16 MiB, one system
#     call per page; preallocated segments gave large commits more saves a
#     second for less CPU, and a lone client's small saves a slower fdatasync
#     (docs/internals/on-disk.md has the figures).
# A spare segment is prepared ahead, off the commit path, so that a rotation
# costs a rename and two syncs.
# Past the end of its data a segment is zeros, which is how its end is found.
#
# A batch, in order (the contract's failpoints in brackets):
#   [before-intent] one write of all its intent records,
#   [after-intent] [before-commit-record] one write of its commit record,
#   one fdatasync of the segment [after-commit-record]: the batch is durable.
# The next batch is written only after that sync returned. A batch that fails
# before its sync is rewound: its bytes are overwritten with zeros and the next
# batch reuses the space, so the log never holds a batch without a commit
# record except at its very end, after a crash.
#
# Space for removals. The last DELETE_RESERVE_BYTES of each append segment
# take only batches without new generations: on a full disk, when no new
# segment can be created, removing sessions still works, and that is how a
# user makes room.
from __future__ import annotations

import contextlib
import errno
import itertools
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import xxhash

from ..errors import DiskFull
from .durable import TMP_DIR, allocate_temp, write_temp
from .fs import ENOSPC_ERRNOS, FileSystem

LOG_DIR = "log"
SEGMENT_SUFFIX = ".seg"
SEGMENT_MAGIC = b"SSLOGSG2"
SEGMENT_HEADER = struct.Struct("<8sB7xQ")
SEGMENT_CHECK = struct.Struct("<Q")
SEGMENT_HEADER_BYTES = SEGMENT_HEADER.size + SEGMENT_CHECK.size  # 32
APPEND = 1
COMPACTED = 2
DEFAULT_SEGMENT_BYTES = 16 * 1024 * 1024
DELETE_RESERVE_BYTES = 256 * 1024
# On a small disk a segment takes at most this share of the free room (the active
# segment, the spare, index checkpoints and compaction's copies share it), and at
# least MIN_SEGMENT_BYTES: an 8 MiB disk gets 2 MiB segments, not one of 16.
FREE_ROOM_SHARE = 4
MIN_SEGMENT_BYTES = 1024 * 1024
ZERO_FILL_WRITE_BYTES = 4096  # one page per write: small folios in the page cache
PREALLOCATE_FROM_COMMIT_BYTES = 48 * 1024  # the running mean of bytes per commit
COMMIT_MEAN_WEIGHT = 1 / 16  # each commit's share of that mean
CANNOT_PREALLOCATE_ERRNOS = (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
SIZE_ROUNDING_BYTES = 1024 * 1024


def segment_name(number: int) -> str:
    return f"{number:016x}{SEGMENT_SUFFIX}"


def segment_number(name: str) -> int | None:
    stem = name.removesuffix(SEGMENT_SUFFIX)
    if name == stem or len(stem) != 16:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


def encode_segment_header(number: int, role: int) -> bytes:
    head = SEGMENT_HEADER.pack(SEGMENT_MAGIC, role, number)
    return head + SEGMENT_CHECK.pack(xxhash.xxh3_64_intdigest(head))


def parse_segment_header(data: bytes) -> tuple[int, int] | None:
    """(number, role) of an intact segment header, else None."""
    if len(data) < SEGMENT_HEADER_BYTES:
        return None
    magic, role, number = SEGMENT_HEADER.unpack_from(data, 0)
    (check,) = SEGMENT_CHECK.unpack_from(data, SEGMENT_HEADER.size)
    if magic != SEGMENT_MAGIC or role not in (APPEND, COMPACTED):
        return None
    if xxhash.xxh3_64_intdigest(data[: SEGMENT_HEADER.size]) != check:
        return None
    return number, role


def _reserve(segment_bytes: int) -> int:
    """The room at the end of a segment kept for removals."""
    return min(DELETE_RESERVE_BYTES, segment_bytes // 8)


def _rounded(size: int) -> int:
    return -(-size // SIZE_ROUNDING_BYTES) * SIZE_ROUNDING_BYTES


@dataclass
class Spare:
    path: str
    size: int


class Log:
    def __init__(
        self,
        fs: FileSystem,
        root: str,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    ) -> None:
        self.fs = fs
        self.root = root
        self.directory = f"{root}/{LOG_DIR}"
        self.tmp_dir = f"{root}/{TMP_DIR}"
        self.segment_bytes = segment_bytes
        self._next_number = 1
        self.active = 0  # number of the active append segment (0: none yet)
        self.offset = 0  # where the next batch goes in the active segment
        self.size = 0  # bytes preallocated in the active segment
        self._used: dict[int, int] = {}  # segment number -> bytes of records in it
        self._fd: int | None = None
        self._read_fds: dict[int, int] = {}
        self._read_open_lock = threading.Lock()
        self._retired_fds: dict[int, int] = {}  # segment number -> handle, unlinked or soon
        self._pins: dict[int, int] = {}  # segment number -> reads in other threads holding it
        self._spare: Spare | None = None
        self._spare_busy = False  # a thread is zero-filling the next spare
        self._spare_changed = threading.Condition()
        self._spare_counter = itertools.count()
        self._unsynced = 0  # bytes written since the last sync
        self.commit_bytes_mean = 0.0  # bytes per commit, a running mean
        self.segments_made = {"zero_filled": 0, "preallocated": 0}

    def path(self, number: int) -> str:
        return f"{self.directory}/{segment_name(number)}"

    # -- reading (the readers' thread) --------------------------------------

    def pread(self, number: int, offset: int, length: int) -> bytes:
        return self.fs.pread(self._handle(number), length, offset)

    def _handle(self, number: int) -> int:
        fd = self._read_fds.get(number)
        if fd is None:
            fd = self._retired_fds.get(number)
        if fd is None:
            with self._read_open_lock:  # the readers and the writer may both miss
                fd = self._read_fds.get(number)
                if fd is None:
                    fd = self.fs.open_read(self.path(number))
                    self._read_fds[number] = fd
        return fd

    def pin(self, number: int) -> None:
        """The readers' thread: a read of this segment is about to leave it for another
        thread. Its handle stays open until unpin(), even if compaction unlinks the file
        meanwhile (FileNotFoundError if it is gone already)."""
        self._handle(number)
        self._pins[number] = self._pins.get(number, 0) + 1

    def unpin(self, number: int) -> None:
        left = self._pins[number] - 1
        if left:
            self._pins[number] = left
        else:
            del self._pins[number]

    def forget(self, numbers: list[int]) -> None:
        """Segments about to be unlinked: their read handles stay open (a read that looked
        up its entry before the switch still finds its bytes) until close_retired()."""
        for number in numbers:
            fd = self._read_fds.pop(number, None)
            if fd is not None:
                self._retired_fds[number] = fd

    def close_retired(self) -> None:
        """The readers' thread, between reads: the handles no read holds any more; a
        pinned one waits for its unpin()."""
        for number in [n for n in self._retired_fds if n not in self._pins]:
            self.fs.close(self._retired_fds.pop(number))

    # -- the active segment ---------------------------------------------------

    def open_active(self, number: int, offset: int) -> None:
        """Recovery found the end of the log: append there from now on."""
        self.active = number
        self.offset = offset
        self.size = self.fs.file_size(self.path(number))
        self._fd = self.fs.open_read_write(self.path(number))
        self._used[number] = offset - SEGMENT_HEADER_BYTES

    def fits(self, nbytes: int, *, only_removals: bool) -> bool:
        if self._fd is None:
            return False
        limit = self.size if only_removals else self.size - _reserve(self.size)
        return self.offset + nbytes <= limit

    def segment_size_now(self) -> int:
        """The size of the next segment: the configured one, less on a small disk."""
        free = self.fs.free_bytes(self.directory)
        if free is None:
            return self.segment_bytes
        share = max(MIN_SEGMENT_BYTES, _rounded(free // FREE_ROOM_SHARE))
        return min(self.segment_bytes, share)

    def rotate(self, nbytes: int) -> None:
        """Start a new append segment that holds at least nbytes; DiskFull on a full disk."""
        size = self.segment_size_now()
        need = SEGMENT_HEADER_BYTES + nbytes + _reserve(size)
        size = size if need <= size else _rounded(need)
        spare = self._take_spare(size)
        if spare is None:
            spare = self._new_file(size)
        number = self._next_number
        fd = self.fs.open_read_write(spare.path)
        try:
            self.fs.pwrite(fd, encode_segment_header(number, APPEND), 0)
            self.fs.fdatasync(fd)  # every named segment has a durable header
        except OSError:
            self.fs.close(fd)
            raise
        self.fs.rename(spare.path, self.path(number))
        self.fs.fsync_dir(self.directory)  # the segment's name survives power loss
        self._next_number = number + 1
        if self._fd is not None:
            self.fs.close(self._fd)
        self._fd = fd
        self.active = number
        self.offset = SEGMENT_HEADER_BYTES
        self.size = spare.size
        self._used[number] = 0

    def _take_spare(self, size: int) -> Spare | None:
        """The prepared spare if it is big enough. One being filled is waited for: on a
        nearly full disk it holds the room a second new segment would need."""
        with self._spare_changed:
            self._spare_changed.wait_for(lambda: not self._spare_busy)
            spare = self._spare
            if spare is None or spare.size < size:
                return None
            self._spare = None
            return spare

    def want_spare(self) -> bool:
        """True when a spare should be prepared now (past half of the active segment)."""
        return self._spare is None and not self._spare_busy and self.offset * 2 >= self.size

    def prepare_spare(self) -> None:
        """Make the next segment ahead of time. Any thread; one at a time."""
        with self._spare_changed:
            if self._spare is not None or self._spare_busy:
                return
            self._spare_busy = True
        try:
            spare = self._new_file(self.segment_size_now())
        except BaseException:
            self._spare_made(None)
            raise
        self._spare_made(spare)

    def _spare_made(self, spare: Spare | None) -> None:
        with self._spare_changed:
            self._spare = spare
            self._spare_busy = False
            self._spare_changed.notify_all()

    def _new_file(self, size: int) -> Spare:
        """A segment file in tmp/, zero-filled or preallocated (see the top)."""
        path = f"{self.tmp_dir}/spare-{next(self._spare_counter)}{SEGMENT_SUFFIX}"
        try:
            if self.commit_bytes_mean >= PREALLOCATE_FROM_COMMIT_BYTES and self._preallocated(
                path, size
            ):
                self.segments_made["preallocated"] += 1
            else:
                whole, rest = divmod(size, ZERO_FILL_WRITE_BYTES)
                pages = [bytes(ZERO_FILL_WRITE_BYTES)] * whole + ([bytes(rest)] if rest else [])
                write_temp(self.fs, path, pages)
                self.segments_made["zero_filled"] += 1
        except OSError as error:
            if error.errno in ENOSPC_ERRNOS:
                raise DiskFull(errno.ENOSPC, "no space for a new log segment") from None
            raise
        return Spare(path, size)

    def _preallocated(self, path: str, size: int) -> bool:
        """False where the file system cannot preallocate: the caller zero-fills."""
        try:
            allocate_temp(self.fs, path, size)
        except OSError as error:
            if error.errno in CANNOT_PREALLOCATE_ERRNOS:
                return False
            raise
        return True

    # -- the commit path (the writer's thread) -------------------------------------

    def write(self, data: bytes) -> None:
        """Write at the end of the active segment; durable only after sync()."""
        assert self._fd is not None, "log not open"
        self.fs.pwrite(self._fd, data, self.offset)
        self.offset += len(data)
        self._used[self.active] += len(data)
        self._unsynced += len(data)

    def rewind(self, offset: int) -> None:
        """Undo writes back to offset: zeros over them (unsynced, like the writes were)."""
        assert self._fd is not None, "log not open"
        if self.offset > offset:
            self.fs.pwrite(self._fd, bytes(self.offset - offset), offset)
            self._used[self.active] -= self.offset - offset
            self._unsynced = max(0, self._unsynced - (self.offset - offset))
            self.offset = offset

    def sync(self) -> None:
        assert self._fd is not None, "log not open"
        self.fs.fdatasync(self._fd)  # durability point: every batch written so far is on disk
        self.commit_bytes_mean += (self._unsynced - self.commit_bytes_mean) * COMMIT_MEAN_WEIGHT
        self._unsynced = 0

    # -- whole segments ---------------------------------------------------------

    @property
    def used(self) -> Mapping[int, int]:
        """Segment number -> bytes of records in it, for every segment in the log."""
        return self._used

    @property
    def next_number(self) -> int:
        return self._next_number

    def resume(self, used: Mapping[int, int], next_number: int) -> None:
        """Recovery's word on which segments make up the log, and the next number."""
        self._used = dict(used)
        self._next_number = next_number

    def take_number(self) -> int:
        """A segment number no other segment has or will have (a compacted one's)."""
        number = self._next_number
        self._next_number += 1
        return number

    def replace(self, victims: Sequence[int], number: int, size: int) -> None:
        """Compaction switched the victims' live records into segment number (0: none
        was live): the victims are no longer part of the log, their files stay until
        the next checkpoint no longer names them."""
        if number:
            self._used[number] = size
        for victim in victims:
            self._used.pop(victim, None)

    def remove(self, numbers: list[int]) -> None:
        """Unlink segments no checkpoint needs (their read handles were forgotten)."""
        for number in numbers:
            with contextlib.suppress(FileNotFoundError):
                self.fs.unlink(self.path(number))
            self._used.pop(number, None)
        if numbers:
            self.fs.fsync_dir(self.directory)

    def close(self) -> None:
        self.forget(list(self._read_fds))
        self.close_retired()
        if self._fd is not None:
            self.fs.close(self._fd)
            self._fd = None
        spare = self._take_spare(0)
        if spare is not None:
            with contextlib.suppress(OSError):
                self.fs.unlink(spare.path)

    @property
    def size_bytes(self) -> int:
        """Bytes of records in the log (what `stats` calls wal_bytes)."""
        return sum(self._used.values())
