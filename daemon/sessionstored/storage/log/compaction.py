# Compaction: the live records of mostly-dead segments are copied into one new
# compacted segment, and the old segments go.
#
#   1. plan (the writer, between batches): pick the victims (segments other
#      than the active one whose share of dead bytes passed the threshold) and
#      note every index entry that points into them, the earlier generations
#      of sessions kept among them;
#   2. copy (any thread, while batches go on): those records, byte for byte
#      (or resealed, for a key rotation), into tmp/, fsynced; then renamed into
#      log/ and the directory fsynced [before-rename, after-rename];
#   3. switch (the readers' thread, between batches): each entry that still
#      points where it pointed at plan time now points into the new segment; a
#      document rewritten meanwhile keeps its newer record, and a session's
#      record it replaced, kept among its earlier generations since, moves like
#      them (else it would point into a victim once the victims go); an earlier
#      generation dropped meanwhile stays dropped;
#   4. an index checkpoint that names the new segment and not the victims;
#      only then are the victims unlinked (their read handles closed first).
# A crash before the checkpoint leaves the victims named by the checkpoint on
# disk and the new segment named by none: recovery removes it. After it, the
# victims are named by none: recovery removes whatever is left of them.
from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..documents import SESSION, Entry
from ..engine import CompactResult
from ..errors import DiskFull, InjectedFault
from . import reserve
from .checkpointing import Checkpointing
from .durable import install, write_temp
from .fs import ENOSPC_ERRNOS
from .records import encode_data
from .segments import COMPACTED, SEGMENT_HEADER_BYTES, encode_segment_header, segment_name
from .state import LogState
from .store_reads import read_entry

COPY_CHUNK_BYTES = 4 * 1024 * 1024
MAX_LIVE_BYTES_PER_RUN = 256 * 1024 * 1024
MIN_DEAD_SEGMENTS = 2
EARLIER = ""  # a move's kind for an earlier generation of a session (index.earlier)


@dataclass
class Plan:
    victims: list[int]
    moves: list[tuple[str, str, Entry]]  # kind "" for an earlier generation of a session
    number: int = 0  # of the new segment; 0 when nothing is live in the victims
    offsets: list[int] = field(default_factory=list)
    resealed: list[Entry] = field(default_factory=list)
    earlier_moved: int = 0  # of the records switch() repointed, earlier generations


Progress = Callable[[int, int], None]  # (records copied, records to copy)


class Compactor:
    """Compaction of one store's log: when it is due, what to copy, the copy and the
    switch; engine.Compactions for the writer."""

    def __init__(self, state: LogState, checkpointing: Checkpointing, dead_share: float) -> None:
        self.state = state
        self.checkpointing = checkpointing
        self.dead_share = dead_share  # of a segment's bytes, past which it is compacted

    def dead_bytes(self) -> tuple[int, int]:
        """(dead, used) bytes over every segment but the active one."""
        log, index = self.state.log, self.state.index
        used = dead = 0
        for number, size in log.used.items():
            if number == log.active:
                continue
            used += size
            dead += size - index.live_bytes.get(number, 0)
        return dead, used

    def due(self) -> bool:
        """Dead bytes passed the share, and there are at least MIN_DEAD_SEGMENTS of them:
        each compaction costs an index checkpoint, so it should reclaim a few segments at
        once."""
        dead, used = self.dead_bytes()
        floor = MIN_DEAD_SEGMENTS * self.state.log.segment_bytes
        return dead >= floor and dead >= used * self.dead_share

    def plan(self, *, dead_only: bool = False) -> Compaction | None:
        """The writer's next compaction: copy() in a background thread, then switch()."""
        work = self.choose(dead_only=dead_only)
        return None if work is None else Compaction(self, work)

    def choose(
        self,
        *,
        everything: bool = False,
        all_segments: bool = False,
        dead_only: bool = False,
        room: int | None = None,
    ) -> Plan | None:
        """everything: every segment with a dead byte (the `compact` op); all_segments:
        every segment but the active one, dead bytes or not (a key rotation); dead_only:
        only the segments with nothing live (no copying: what a full disk allows); room:
        the segments with a dead byte, the most-dead first, whose live bytes fit in room
        (a full disk's rescue, reserve.py)."""
        log, index = self.state.log, self.state.index
        candidates = []
        for number, size in log.used.items():
            if number == log.active:
                continue
            live = index.live_bytes.get(number, 0)
            if dead_only and live:
                continue
            share = (size - live) / size if size else 1.0
            wanted = all_segments or dead_only or ((everything or room is not None) and size > live)
            if wanted or share >= self.dead_share:
                candidates.append((share, number, live))
        candidates.sort(reverse=True)
        victims: list[int] = []
        moving = 0
        automatic = not (everything or all_segments or dead_only or room is not None)
        dead, used = self.dead_bytes()
        goal = dead - used * self.dead_share / 2  # the emptiest first, until half the share
        reclaimed = 0
        for _, number, live in candidates:
            if (
                automatic
                and victims
                and (reclaimed >= goal or moving + live > MAX_LIVE_BYTES_PER_RUN)
            ):
                break
            if room is not None and moving + live > room:
                continue
            victims.append(number)
            moving += live
            reclaimed += log.used[number] - live
        if not victims:
            return None
        chosen = set(victims)
        moves = [(k, i, e) for k, i, e in index.rows() if e.segment in chosen]
        moves += [(EARLIER, i, e) for i, e in index.earlier_rows() if e.segment in chosen]
        moves.sort(key=lambda move: (move[2].segment, move[2].offset))
        result = Plan(sorted(victims), moves)
        if moves:
            result.number = log.take_number()
        return result

    def copy(self, work: Plan, *, reseal: bool = False, progress: Progress | None = None) -> None:
        """Write the new segment and rename it into log/. DiskFull on a full disk."""
        if not work.moves:
            return
        state = self.state
        fs, log = state.fs, state.log
        temp = f"{log.tmp_dir}/{segment_name(work.number)}.tmp"
        chunks = [encode_segment_header(work.number, COMPACTED)]
        offset = SEGMENT_HEADER_BYTES
        for kind, doc_id, entry in work.moves:
            if reseal:
                doc = read_entry(state, kind or SESSION, doc_id, entry)
                record = encode_data(state.sealer, 0, doc)
                work.resealed.append(entry._replace(length=len(record)))
            else:
                record = log.pread(entry.segment, entry.offset, entry.length)
            chunks.append(record)
            work.offsets.append(offset)
            offset += len(record)
            if progress is not None:
                progress(len(work.offsets), len(work.moves))
        try:
            write_temp(fs, temp, chunks)
        except OSError as error:
            if error.errno in ENOSPC_ERRNOS:
                raise DiskFull(errno.ENOSPC, "no space to compact the log") from None
            raise
        try:
            install(fs, temp, log.path(work.number), state.failpoint)
        except InjectedFault as fault:
            if fault.point == "after-rename":  # renamed in but never named: undo it now
                log.remove([work.number])
            raise

    def switch(self, work: Plan) -> int:
        """Repoint the entries that did not change since the plan; returns how many."""
        index = self.state.index
        moved = 0
        entries = work.resealed or [move[2] for move in work.moves]
        for (kind, doc_id, old), new, offset in zip(work.moves, entries, work.offsets, strict=True):
            moved_to = new._replace(segment=work.number, offset=offset)
            if kind == EARLIER:
                repointed = index.repoint_earlier(doc_id, old, moved_to)
                moved += repointed
                work.earlier_moved += repointed
            elif index.get(kind, doc_id) == old:
                index.put(kind, doc_id, moved_to)
                moved += 1
            elif kind == SESSION and index.repoint_earlier(doc_id, old, moved_to):
                moved += 1  # saved meanwhile: the generation it replaced is an earlier one now
                work.earlier_moved += 1
        self.state.log.replace(work.victims, work.number, sum(e.length for e in entries))
        self.checkpointing.retire(work.victims)
        return moved

    def compact(self, *, everything: bool = True) -> CompactResult:
        """All of it in one call: for the `compact` op's thread, tests and tools."""
        state, log = self.state, self.state.log
        before = log.size_bytes
        active = log.active
        if everything and log.used.get(active, 0) > state.index.live_bytes.get(active, 0):
            with contextlib.suppress(DiskFull):  # a full disk: compact what is sealed already
                log.rotate(0)  # the active segment's dead bytes can go too
        work = self.choose(everything=everything)
        if work is None:
            path = self.checkpointing.write()
            return CompactResult(state.seq, before, log.size_bytes, 0, 0, path)
        try:
            self.copy(work)
        except DiskFull:
            return self._rescue(before)
        moved = self.switch(work)
        path = self.checkpointing.write()
        log.close_retired()
        reserve.ensure(state, self.checkpointing.files)
        return CompactResult(state.seq, before, log.size_bytes, len(work.victims), moved, path)

    def _rescue(self, before: int) -> CompactResult:
        """Compaction on a full disk: first the wholly dead segments, which need no copy
        (their removal is the room a user made by deleting); then, with the reserve
        released, a few segments at a time into the room freed so far."""
        state, log, files = self.state, self.state.log, self.checkpointing.files
        replaced = moved = 0
        path = ""
        work = self.choose(dead_only=True)
        if work is not None:
            moved += self.switch(work)
            path = self.checkpointing.write()
            log.close_retired()
            replaced += len(work.victims)
        reserve.release(state)
        try:
            while True:
                free = state.fs.free_bytes(state.root)
                room = log.segment_bytes if free is None else free
                room -= reserve.checkpoint_room(files)
                work = self.choose(room=room) if room > 0 else None
                if work is None:
                    break
                try:
                    self.copy(work)
                except DiskFull:
                    break
                moved += self.switch(work)
                path = self.checkpointing.write()
                log.close_retired()
                replaced += len(work.victims)
        finally:
            reserve.ensure(state, files)
        if not replaced:
            raise DiskFull(
                errno.ENOSPC, "no space to compact the log, even with the reserve released"
            )
        return CompactResult(state.seq, before, log.size_bytes, replaced, moved, path)


@dataclass
class Compaction:
    """One planned compaction, as the writer runs it (engine.CompactionRun)."""

    compactor: Compactor
    work: Plan

    @property
    def victims(self) -> Sequence[int]:
        return self.work.victims

    @property
    def number(self) -> int:
        return self.work.number

    def copy(self) -> None:
        self.compactor.copy(self.work)

    def switch(self) -> int:
        return self.compactor.switch(self.work)
