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
from .index_checkpoint import IndexCheckpoints
from .state import LogState

RESERVE_NAME = "compaction-reserve"
RESERVE_SLACK_BYTES = 64 * 1024  # segment headers, the directories' own blocks
RESERVE_WRITE_BYTES = 64 * 1024


def reserve_path(state: LogState) -> str:
    return f"{state.root}/{RESERVE_NAME}"


def wanted_bytes(state: LogState, checkpoints: IndexCheckpoints) -> int:
    return state.log.segment_size_now() // 2 + checkpoint_room(checkpoints)


def checkpoint_room(checkpoints: IndexCheckpoints) -> int:
    """What writing the next index checkpoint needs: two copies, as big as the last."""
    return 2 * checkpoints.newest_bytes() + RESERVE_SLACK_BYTES


def held_bytes(state: LogState) -> int:
    path = reserve_path(state)
    return state.fs.file_size(path) if state.fs.exists(path) else 0


def ensure(state: LogState, checkpoints: IndexCheckpoints) -> bool:
    """Make the reserve if it is missing and there is room; False if there is not."""
    fs, path = state.fs, reserve_path(state)
    if fs.exists(path):
        return True
    size = wanted_bytes(state, checkpoints)
    free = fs.free_bytes(state.root)
    if free is not None and free < 2 * size:
        return False  # a nearly full disk: leave the room to the data
    temp = f"{state.log.tmp_dir}/{RESERVE_NAME}.tmp"
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
    fs.fsync_dir(state.root)
    return True


def release(state: LogState) -> int:
    """Give the reserve's blocks back to the file system; the bytes freed."""
    fs, path = state.fs, reserve_path(state)
    if not fs.exists(path):
        return 0
    size = fs.file_size(path)
    fs.unlink(path)
    fs.fsync_dir(state.root)
    return size
