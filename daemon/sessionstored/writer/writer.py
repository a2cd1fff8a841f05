# The single writer: the only task that mutates the store. Connection tasks hand
# it jobs through a small queue (job_queue.py: a slow disk makes them wait instead
# of growing memory); it takes the first job and whatever else is already
# queued (group commit: one log write and one fdatasync for all of them), runs
# the batch in its worker thread, publishes it to the index and the watch
# history, then resolves each job. Once a batch is in the thread it completes
# and its outcome is delivered, even to a writer being cancelled (the call
# swallows the cancellation until the writer's next checkpoint: no shielded
# scope per batch, which cost 9% of a small write).
#
# An engine that takes several batches at once (PostgreSQL: batches_in_flight)
# gets them, each in a thread of its own, as long as they touch no document in
# common: a batch that shares one with a batch in flight, or that needs the
# whole store (a lease change, a delete_prefix, an append), waits until those
# land, so one client's pipelined writes still apply in the order sent. The
# log takes one at a time: its order is its commit order.
#
# A lone small batch (one put or remove of at most WAIT_ON_LOOP_MAX_BYTES) on
# the log is still committed in the thread, but the event loop waits for it
# right there, blocked in poll(2) on the thread's eventfd for at most
# WAIT_ON_LOOP_MAX_S, instead of going back to trio's scheduler and being woken
# through it: a lone client's save skips a pass of the loop (measured with
# callgrind, bench/instructions.py: 7% of a 4 KiB save at one client). Redis,
# with appendfsync always, stalls its loop for each fsync; here the stall is
# bounded by WAIT_ON_LOOP_MAX_S.
# A commit that is not back by then is waited for the usual way, so a slow or
# hung disk stalls the other connections by that much once: the next batches
# are waited for through trio until a commit is fast again.
#
# With one batch at a time, a batch's replies are sent once the next call is in
# the thread (the next batch, or an exclusive job), or before the writer waits
# for jobs: the fan-out of one batch's replies overlaps the next one's commit
# instead of delaying it. A reply waits at most for that hand-over.
#
# Exclusive jobs (verify, compact) run in the thread with no batch in flight.
# Between batches the writer also keeps the store in shape:
#   - an index checkpoint when enough changes or log bytes accumulated;
#   - a spare log segment zero-filled in the background before the active one
#     is full, so that a rotation costs a rename;
#   - automatic compaction once dead bytes pass --compact-dead-share: the plan
#     and the switch happen here, between batches; the copying runs in a
#     background thread while batches go on; then a checkpoint, then the old
#     segments go.
# The systemd watchdog is pinged from this loop, between batches and while it
# idles, never from a timer of its own: a writer stuck in a batch (a hung disk)
# stops the pings, and systemd restarts the daemon.
#
# A FatalStorageError (an fsync failed, or an error after the point of no
# return) fails the batch and everything queued with io_error, and asks the
# daemon to exit non-zero so systemd restarts it and recovery runs.
from __future__ import annotations

import collections
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from sessionstore.wire.codes import ErrorCode

from ..notify import notify
from ..storage.engine import CompactionRun, Engine, LogMaintenance
from ..storage.errors import DiskFull, FatalStorageError, InjectedFault
from ..storage.mutations import (
    Batch,
    Put,
    Remove,
    mutation_keys,
    needs_whole_store,
    split_batches,
)
from .collector import Collector
from .job_queue import JobQueue
from .jobs import ExclusiveJob, Job, MutationJob
from .writer_thread import WriterThread, name_os_thread

log = logging.getLogger("sessionstored.writer")
T = TypeVar("T")

QUEUE_DEPTH = 64
MAX_BATCH_JOBS = 512
MAX_BATCH_BYTES = 128 * 1024 * 1024
RECENT_BATCHES = 1024  # the batches `stats` figures its recent_batches from
WAIT_ON_LOOP_MAX_BYTES = 256 * 1024
WAIT_ON_LOOP_MAX_S = 0.002


@dataclass
class _BackgroundCompaction:
    run: CompactionRun
    copying: Future[None]


def quantiles_ms(seconds: list[float]) -> dict[str, float]:
    """The p50 and p99 of durations (sorted in place), in ms: what `stats` reports."""
    seconds.sort()
    last = len(seconds) - 1
    return {
        "p50_ms": round(seconds[last // 2] * 1000, 3),
        "p99_ms": round(seconds[min(last, round(last * 0.99))] * 1000, 3),
    }


class Writer:
    def __init__(self, store: Engine, on_fatal: Callable[[str], None]) -> None:
        self.store = store
        self.on_fatal = on_fatal
        self._queue = JobQueue(QUEUE_DEPTH)
        self._disk_thread: WriterThread | None = None
        self._background = ThreadPoolExecutor(
            1,
            thread_name_prefix="log-background",
            initializer=name_os_thread,
            initargs=("log-background",),
        )
        self._spare: Future[None] | None = None
        self._compaction: _BackgroundCompaction | None = None
        self.failed: str | None = None
        self.batches = 0
        self.committed_jobs = 0
        self.checkpoints = 0
        self.collector = Collector()
        self.compactions = 0
        self._last_ping = float("-inf")
        # (seconds in the engine, with the hand-over, writes, seconds of fdatasync)
        self._recent: collections.deque[tuple[float, float, int, float]] = collections.deque(
            maxlen=RECENT_BATCHES
        )
        self.on_publish: Callable[[], None] | None = None
        # (writes, seconds in the engine, seconds of its fdatasync) after each batch
        self.on_batch: Callable[[int, float, float], None] | None = None
        self._spare_threads: list[WriterThread] = []  # for batches in flight beside the first
        self._flying: list[frozenset[tuple[str, str]] | None] = []  # their documents
        self._busy: set[WriterThread] = set()
        self._landed = trio.lowlevel.ParkingLot()
        self._nursery: trio.Nursery | None = None
        self._last_commit_s = 0.0  # the engine's time for the last batch
        self.waited_on_loop = 0  # batches whose commit the event loop waited for itself
        # the last batch's jobs and outcomes, committed, their replies not yet sent
        self._landed_unsent: list[tuple[list[MutationJob], list[Any]]] = []

    def submit(self, job: Job) -> bool:
        """Hand a job over without waiting; False when the queue is full (then enqueue)."""
        if self.failed is not None:
            self._fail([job], self.failed)
            return True
        try:
            return self._queue.put_nowait(job)
        except trio.ClosedResourceError:
            job.fail(ErrorCode.SHUTTING_DOWN, "the daemon is stopping")
        return True

    async def enqueue(self, job: Job) -> None:
        """Hand a job to the writer, waiting for room; the job is finished once its
        outcome is known."""
        if self.submit(job):
            return
        try:
            await self._queue.put(job)
        except trio.ClosedResourceError:
            job.fail(ErrorCode.SHUTTING_DOWN, "the daemon is stopping")

    def close(self) -> None:
        self._queue.close()

    async def _call(self, fn: Callable[[], T]) -> T:
        assert self._disk_thread is not None
        return await self._in_thread(self._disk_thread, fn)

    async def _in_thread(self, thread: WriterThread, fn: Callable[[], T]) -> T:
        """fn() in the thread; the last batch's replies go out while it runs."""
        thread.hand_over(fn)
        self._send_landed()
        value: T = await thread.result()
        return value

    def _send_landed(self) -> None:
        landed, self._landed_unsent = self._landed_unsent, []
        for jobs, outcomes in landed:
            for job, outcome in zip(jobs, outcomes, strict=True):
                job.finish(outcome)

    async def run(self, watchdog_interval_s: float | None = None) -> None:
        self._disk_thread = WriterThread("writer")
        self._spare_threads = [
            WriterThread(f"writer-{n}") for n in range(1, self.store.batches_in_flight)
        ]
        try:
            async with trio.open_nursery() as self._nursery:
                while True:
                    jobs: list[Job] = []
                    if not len(self._queue):  # nothing to overlap them with
                        self._send_landed()
                    if not watchdog_interval_s:  # no watchdog: wait as long as it takes
                        jobs = await self._queue.take(MAX_BATCH_JOBS, MAX_BATCH_BYTES)
                    else:
                        self._watchdog_ping(watchdog_interval_s)
                        with trio.move_on_after(watchdog_interval_s) as waiting:
                            jobs = await self._queue.take(MAX_BATCH_JOBS, MAX_BATCH_BYTES)
                        if waiting.cancelled_caught:
                            continue
                    if not jobs:  # closed, and every job taken
                        return
                    # every await below is a call to the writer's thread, which delivers
                    # its outcome even when the writer is being cancelled (writer_thread.py)
                    await self._run_jobs(jobs)
                    if self.failed is None:
                        await self._maintain()
        finally:
            self._send_landed()  # committed: their outcomes reach their clients
            for thread in (self._disk_thread, *self._spare_threads):
                thread.close()
            self._background.shutdown(wait=False, cancel_futures=True)

    async def _run_jobs(self, jobs: list[Job]) -> None:
        mutations: list[MutationJob] = []
        for job in jobs:
            if isinstance(job, MutationJob):
                mutations.append(job)
                continue
            for batch in split_batches(mutations, lambda j: j.mutation):
                await self._dispatch(batch)
            mutations = []
            assert isinstance(job, ExclusiveJob)
            await self._land_all()
            await self._run_exclusive(job)
        for batch in split_batches(mutations, lambda j: j.mutation):
            await self._dispatch(batch)

    async def _dispatch(self, jobs: list[MutationJob]) -> None:
        """Commit now (one batch at a time), or start it beside the batches in flight
        once none of them touches its documents and a thread is free."""
        assert self._disk_thread is not None
        if not self._spare_threads:
            await self._commit(jobs, self._disk_thread)
            return
        touched = _documents(jobs)
        while self._blocked(touched):
            await self._landed.park()
        thread = next(t for t in (self._disk_thread, *self._spare_threads) if t not in self._busy)
        self._busy.add(thread)
        self._flying.append(touched)
        assert self._nursery is not None
        self._nursery.start_soon(self._commit_then_land, jobs, thread, touched)

    def _blocked(self, touched: frozenset[tuple[str, str]] | None) -> bool:
        if len(self._flying) > len(self._spare_threads):
            return True  # every thread is committing
        return any(
            other is None or touched is None or not other.isdisjoint(touched)
            for other in self._flying
        )

    async def _commit_then_land(
        self,
        jobs: list[MutationJob],
        thread: WriterThread,
        touched: frozenset[tuple[str, str]] | None,
    ) -> None:
        try:
            await self._commit(jobs, thread)
        finally:
            self._flying.remove(touched)
            self._busy.discard(thread)
            self._landed.unpark_all()

    async def _land_all(self) -> None:
        while self._flying:
            await self._landed.park()

    async def _run_exclusive(self, job: ExclusiveJob) -> None:
        self._send_landed()  # before a compaction's copy is waited for, say
        if self.failed is not None:
            self._fail([job], self.failed)
            return
        await self._settle_compaction(wait=True)
        try:
            result = await self._call(job.run)
        except FatalStorageError as error:
            self._fatal(str(error), [job])
            return
        except Exception as error:  # reported to the one client that asked
            self._close_retired()
            job.finish(error=error)
            return
        self._close_retired()
        job.finish(result)

    def _close_retired(self) -> None:
        if self.store.maintenance is not None:
            self.store.maintenance.segments.close_retired()

    async def _commit(self, jobs: list[MutationJob], thread: WriterThread) -> None:
        if not jobs:
            return
        if self.failed is not None:  # _fatal sent what had landed; nothing lands since
            self._fail(jobs, self.failed)
            return
        mutations = [job.mutation for job in jobs]
        started = time.perf_counter()
        timing: list[float] = []

        def commit() -> Batch:
            began = time.perf_counter()
            result = self.store.commit_durably(mutations)
            timing.append(time.perf_counter() - began)
            return result

        try:
            if self._wait_on_loop(jobs):
                thread.hand_over(commit)
                self._send_landed()
                batch, on_loop = await thread.result_waiting(WAIT_ON_LOOP_MAX_S)
                self.waited_on_loop += on_loop
            elif self._spare_threads:  # batches in flight: each sends its own replies
                batch = await thread.call(commit)
            else:
                batch = await self._in_thread(thread, commit)
        except FatalStorageError as error:
            self._fatal(str(error), jobs)
            return
        self._last_commit_s = timing[0]
        self.store.publish(batch)
        self.batches += 1
        handoff_s = time.perf_counter() - started
        self._recent.append((timing[0], handoff_s, len(jobs), batch.sync_s))
        for outcome in batch.outcomes:
            if outcome.ok and outcome.changed:
                self.committed_jobs += 1
        self._landed_unsent.append((jobs, batch.outcomes))
        if self._spare_threads:
            self._send_landed()
        if batch.committed and self.on_publish is not None:
            self.on_publish()
        if self.on_batch is not None:
            self.on_batch(len(jobs), timing[0], batch.sync_s)

    def _wait_on_loop(self, jobs: list[MutationJob]) -> bool:
        """Wait for the commit on the event loop: a lone small put or remove on the log,
        while commits are fast."""
        return (
            len(jobs) == 1
            and isinstance(jobs[0].mutation, (Put, Remove))
            and self.store.local_commits
            and not self._spare_threads
            and self._last_commit_s < WAIT_ON_LOOP_MAX_S
            and jobs[0].size() <= WAIT_ON_LOOP_MAX_BYTES
        )

    # -- keeping the store in shape, between batches ------------------------------

    async def _maintain(self) -> None:
        upkeep = self.store.maintenance
        if upkeep is None:  # PostgreSQL keeps its own files
            return
        if self._spare is None and upkeep.segments.want_spare():
            self._spare = self._background.submit(upkeep.segments.prepare_spare)
        elif self._spare is not None and self._spare.done():
            error = self._spare.exception()
            self._spare = None
            if error is not None:
                log.warning("could not prepare a spare log segment: %s", error)
        await self._settle_compaction(wait=False)
        if self.failed is None and self._compaction is None and upkeep.compaction.due():
            # the plan reads every index entry: in the writer's thread, not the event loop's
            # (a million entries held every client's reply for 2.6 s, bench/expiry.py)
            run = await self._call(upkeep.compaction.plan)
            if run is not None:
                self._compaction = _BackgroundCompaction(run, self._background.submit(run.copy))
        if self.failed is None and upkeep.checkpoints.due():
            await self._checkpoint(upkeep, "checkpoint")

    async def _settle_compaction(self, *, wait: bool) -> None:
        """Finish a background compaction whose copy is done (or wait for it)."""
        running, upkeep = self._compaction, self.store.maintenance
        if running is None or upkeep is None or not (wait or running.copying.done()):
            return
        if not running.copying.done():
            with trio.CancelScope(shield=True):  # rare: before verify or compact
                await trio.to_thread.run_sync(running.copying.exception)
        self._compaction = None
        error = running.copying.exception()
        work: CompactionRun | None = running.run
        if isinstance(error, DiskFull):
            work = await self._call(  # no copying: what fits
                lambda: upkeep.compaction.plan(dead_only=True)
            )
            log.warning("disk full: compaction drops only wholly dead segments (%s)", error)
        elif isinstance(error, InjectedFault):
            log.warning("automatic compaction did not run: %s", error)
            return
        elif error is not None:
            self._fatal(f"compaction failed: {error}", [])
            return
        if work is None:
            return
        moved = work.switch()
        self.compactions += 1
        log.info(
            "compacted %d segments into segment %d (%d records moved)",
            len(work.victims),
            work.number,
            moved,
        )
        await self._checkpoint(upkeep, "checkpoint after compaction")

    async def _checkpoint(self, upkeep: LogMaintenance, what: str) -> None:
        try:
            path = await self._call(upkeep.checkpoints.write)
        except (DiskFull, InjectedFault) as error:
            log.warning("%s skipped: %s", what, error)
            return
        except FatalStorageError as error:
            self._fatal(str(error), [])
            return
        upkeep.segments.close_retired()
        self.checkpoints += 1
        await self._call(self.collector.settle)
        log.info("%s at seq %d: %s", what, self.store.seq, path)

    def _watchdog_ping(self, interval_s: float | None) -> None:
        if interval_s is None:
            return
        now = trio.current_time()  # trio's clock: the tests can drive it
        if now - self._last_ping >= interval_s:
            notify("WATCHDOG=1")
            self._last_ping = now

    def timing(self) -> dict[str, Any]:
        """The last RECENT_BATCHES batches: their writes, time in the storage engine, with
        the thread's hand-over, and the log's fdatasync (none on PostgreSQL)."""
        if not self._recent:
            return {}
        engine, total, sizes, syncs = zip(*self._recent, strict=True)
        figures = {
            "batches": len(sizes),
            "jobs_per_batch_mean": round(statistics.mean(sizes), 2),
            "engine_ms_p50": round(statistics.median(engine) * 1000, 3),
            "engine_ms_max": round(max(engine) * 1000, 3),
            "with_handoff_ms_p50": round(statistics.median(total) * 1000, 3),
        }
        synced = [s for s in syncs if s]
        if synced:
            figures.update({f"fdatasync_{k}": v for k, v in quantiles_ms(synced).items()})
        return figures

    def stop_fatally(self, reason: str) -> None:
        """Outside a batch (the database follower): as if a batch had failed fatally."""
        if self.failed is None:
            self._fatal(reason, [])

    def _fatal(self, reason: str, jobs: Sequence[Job]) -> None:
        self.failed = f"storage failure, daemon stopping: {reason}"
        self._send_landed()  # committed before the failure: their outcomes stand
        self.store.fail()
        log.critical("%s", self.failed)
        self._fail(jobs, self.failed)
        self.on_fatal(self.failed)
        self._fail(self._queue.take_all_nowait(), self.failed)

    @staticmethod
    def _fail(jobs: Sequence[Job], message: str) -> None:
        for job in jobs:
            job.fail(ErrorCode.IO_ERROR, message)


def _documents(jobs: list[MutationJob]) -> frozenset[tuple[str, str]] | None:
    """The documents a batch touches; None when it needs the whole store."""
    touched: set[tuple[str, str]] = set()
    for job in jobs:
        keys = mutation_keys(job.mutation)
        if keys is None or needs_whole_store(job.mutation):
            return None
        touched |= keys
    return frozenset(touched)
