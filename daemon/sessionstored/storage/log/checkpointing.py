# When the log engine writes an index checkpoint, and what follows one
# (engine.IndexCheckpointing; index_checkpoint.py writes and reads the files):
# one is due every so many changes or log bytes since the last, so that
# recovery replays at most that much. A checkpoint is also the moment the
# segments compaction retired are unlinked: until it is written, the newest
# checkpoint may still name them.
from __future__ import annotations

import errno
from collections.abc import Sequence

from ..errors import DiskFull, FatalStorageError, InjectedFault
from .fs import ENOSPC_ERRNOS
from .index_checkpoint import IndexCheckpoints, IndexCheckpointState
from .state import LogState


class Checkpointing:
    def __init__(
        self,
        state: LogState,
        files: IndexCheckpoints,
        *,
        every_changes: int,
        every_bytes: int,
        history_changes: int,
    ) -> None:
        self.state = state
        self.files = files
        self.every_changes = every_changes
        self.every_bytes = every_bytes
        self.history_changes = history_changes  # the watch history a checkpoint carries
        self.seq = 0  # of the newest checkpoint
        self.generation = 0
        self.bytes_since = 0  # log bytes written since it
        self.retiring: list[int] = []  # segments to unlink once no checkpoint names them

    def adopt(
        self, newest: IndexCheckpointState | None, bytes_since: int, retiring: Sequence[int]
    ) -> None:
        """What recovery found: the newest checkpoint, the log written after it, and the
        segments only an older checkpoint names."""
        self.seq = newest.seq if newest else 0
        self.generation = newest.generation if newest else 0
        self.bytes_since = bytes_since
        self.retiring = list(retiring)

    def due(self) -> bool:
        return (
            self.state.seq - self.seq >= self.every_changes or self.bytes_since >= self.every_bytes
        )

    def state_now(self) -> IndexCheckpointState:
        state, log = self.state, self.state.log
        return IndexCheckpointState(
            generation=self.generation + 1,
            seq=state.seq,
            batch=state.batch,
            position=(log.active, log.offset),
            next_segment=log.next_number,
            segments=dict(log.used),
            index=state.index,
            history=state.history.after(0, self.history_changes),
            damaged=list(state.damaged.values()),
        )

    def write(self) -> str:
        """Write an index checkpoint, then remove segments that no checkpoint names.
        DiskFull (the store goes on) or InjectedFault (before-rename) change nothing;
        any other error is FatalStorageError."""
        self.state.refuse_if_failed()
        checkpoint = self.state_now()
        try:
            path = self.files.write(checkpoint, self.state.failpoint)
        except InjectedFault as fault:
            if fault.point == "before-rename":
                raise
            self.state.failed = True
            raise FatalStorageError(f"index checkpoint: {fault}") from fault
        except OSError as error:
            if error.errno in ENOSPC_ERRNOS:
                raise DiskFull(errno.ENOSPC, "no space for an index checkpoint") from None
            self.state.failed = True
            raise FatalStorageError(f"index checkpoint failed: {error}") from error
        self.generation = checkpoint.generation
        self.seq = checkpoint.seq
        self.bytes_since = 0
        if self.retiring:
            retired, self.retiring = self.retiring, []
            self.state.log.forget(retired)
            try:
                self.state.log.remove(retired)
            except OSError as error:
                self.state.failed = True
                raise FatalStorageError(f"removing compacted segments failed: {error}") from error
        return path

    def retire(self, segments: Sequence[int]) -> None:
        """Segments the log no longer holds: unlinked once a checkpoint no longer names
        them (the newest one still may)."""
        self.retiring.extend(segments)
