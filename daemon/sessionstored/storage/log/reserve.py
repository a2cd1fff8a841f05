# Room kept back so that compaction can make room on a full disk.
#
# On a full disk, deleting sessions frees nothing by itself: their removals go
# into the space each append segment keeps for them (segments.py), and a segment's
# dead bytes only come back when compaction has copied its live records out,
# which needs room for the copy and for an index checkpoint. So the store keeps
# a file of zeros, RESERVE_NAME in the state directory, holding half a segment
# and two checkpoints' worth of blocks (what ext4's reserved blocks are for
# root). When `compact` finds no room, it releases the file and compacts one
# segment at a time, the most-dead first, each into the room the previous ones
# freed (compaction.py); then the file is made again, as room allows. A segment
# that is at least half dead can always be compacted this way.
from __future__ import annotations

from .fs import ENOSPC_ERRNOS
from .store_parts import StoreParts

RESERVE_NAME = "compaction-reserve"
RESERVE_SLACK_BYTES = 64 * 1024  # segment headers, the directories' own blocks
RESERVE_WRITE_BYTES = 64 * 1024


def reserve_path(store: StoreParts) -> str:
    return f"{store.root}/{RESERVE_NAME}"


def wanted_bytes(store: StoreParts) -> int:
    return store.log.segment_size_now() // 2 + checkpoint_room(store)


def checkpoint_room(store: StoreParts) -> int:
    """What writing the next index checkpoint needs: two copies, as big as the last."""
    return 2 * store.checkpoints.newest_bytes() + RESERVE_SLACK_BYTES


def held_bytes(store: StoreParts) -> int:
    path = reserve_path(store)
    return store.fs.file_size(path) if store.fs.exists(path) else 0


def ensure(store: StoreParts) -> bool:
    """Make the reserve if it is missing and there is room; False if there is not."""
    fs, path = store.fs, reserve_path(store)
    if fs.exists(path):
        return True
    size = wanted_bytes(store)
    free = fs.free_bytes(store.root)
    if free is not None and free < 2 * size:
        return False  # a nearly full disk: leave the room to the data
    temp = f"{store.log.tmp_dir}/{RESERVE_NAME}.tmp"
    if fs.exists(temp):
        fs.unlink(temp)
    fd = fs.create_exclusive(temp)
    try:
        whole, rest = divmod(size, RESERVE_WRITE_BYTES)
        for _ in range(whole):
            fs.write(fd, bytes(RESERVE_WRITE_BYTES))
        fs.write(fd, bytes(rest))
        fs.fsync(fd)  # the blocks are allocated, not a hole
    except OSError as error:
        fs.close(fd)
        fs.unlink(temp)
        if error.errno in ENOSPC_ERRNOS:
            return False
        raise
    fs.close(fd)
    fs.rename(temp, path)
    fs.fsync_dir(store.root)
    return True


def release(store: StoreParts) -> int:
    """Give the reserve's blocks back to the file system; the bytes freed."""
    fs, path = store.fs, reserve_path(store)
    if not fs.exists(path):
        return 0
    size = fs.file_size(path)
    fs.unlink(path)
    fs.fsync_dir(store.root)
    return size
