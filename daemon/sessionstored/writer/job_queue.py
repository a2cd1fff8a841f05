# The writer's queue: connection tasks put jobs in, the writer takes every job
# queued at once (group commit). At most `depth` jobs wait: a connection that
# finds it full parks until the writer takes some, so a slow disk slows its
# clients instead of growing memory. Closing it lets the writer take what is
# left, then tells it the queue has ended; a put after that is refused.
#
# It does what a trio memory channel did here with less: the writer parks as
# the one taker, jobs sit in one deque, and taking a batch is a loop of
# popleft with no scheduling per job (trio's channel passed each job through
# its own bookkeeping, in interpreted Python, on both sides).
from __future__ import annotations

from collections import deque

import trio

from .jobs import Job


class JobQueue:
    def __init__(self, depth: int) -> None:
        self._jobs: deque[Job] = deque()
        self._depth = depth
        self._taker: trio.lowlevel.Task | None = None  # the writer, parked while it is empty
        self._room = trio.lowlevel.ParkingLot()  # connections waiting for room
        self.closed = False

    def __len__(self) -> int:
        return len(self._jobs)

    def put_nowait(self, job: Job) -> bool:
        """Queue a job; False when the queue is full. ClosedResourceError once closed."""
        if self.closed:
            raise trio.ClosedResourceError("the writer's queue is closed")
        if len(self._jobs) >= self._depth:
            return False
        self._jobs.append(job)
        taker = self._taker
        if taker is not None:
            self._taker = None
            trio.lowlevel.reschedule(taker)
        return True

    async def put(self, job: Job) -> None:
        """Queue a job, waiting for room first when the queue is full."""
        while not self.put_nowait(job):
            await self._room.park()

    async def take(self, max_jobs: int, max_bytes: int) -> list[Job]:
        """The jobs queued, waiting for a first one: at most max_jobs of them, and no more
        once they add up to max_bytes. Empty once the queue is closed and drained."""
        if self._jobs:
            # queued while the writer was busy: let every task that is ready to run add
            # its job first, so that they share this batch (group commit)
            await trio.lowlevel.checkpoint()
        while not self._jobs:
            if self.closed:
                return []
            self._taker = trio.lowlevel.current_task()

            def abort(_raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
                self._taker = None
                return trio.lowlevel.Abort.SUCCEEDED

            await trio.lowlevel.wait_task_rescheduled(abort)
        jobs = self._jobs
        first = jobs.popleft()
        taken = [first]
        size = first.size()
        while jobs and len(taken) < max_jobs and size < max_bytes:
            job = jobs.popleft()
            taken.append(job)
            size += job.size()
        if len(self._room):
            self._room.unpark(count=len(taken))
        return taken

    def take_all_nowait(self) -> list[Job]:
        """Every job queued, without waiting (a failed writer refuses them)."""
        taken = list(self._jobs)
        self._jobs.clear()
        self._room.unpark_all()
        return taken

    def close(self) -> None:
        """No more puts: the writer takes what is left, then sees the queue end."""
        self.closed = True
        taker = self._taker
        if taker is not None:
            self._taker = None
            trio.lowlevel.reschedule(taker)
        self._room.unpark_all()  # their retry finds it closed
