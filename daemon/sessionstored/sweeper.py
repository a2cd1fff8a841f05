# The expiry sweep: removes the generations whose expiry has passed, as
# committed mutations (Expire), so that each removal has its seq and watchers
# see it, with "expired": true. Reads hide an expired generation the moment it
# expires; the sweep only reclaims it. It wakes at the next expiry the engine
# knows of (at most every SWEEP_IDLE_S, to learn of new ones), takes at most
# SWEEP_BATCH due generations, and hands them to the writer as ordinary jobs:
# they queue behind and among clients' writes, in batches the writer bounds,
# so a million expiring at once costs the clients a share of the writer, never
# a stall. An Expire that failed (a full disk) is scheduled again. On
# PostgreSQL one daemon at a time sweeps (the one holding the sweeper's lock);
# the others serve, and take over when its connection ends.
from __future__ import annotations

import logging
import time

import trio

from .jobs import MutationJob
from .storage.engine import Engine
from .writer import Writer

log = logging.getLogger("sessionstored.sweeper")

SWEEP_BATCH = 1000  # due generations handed to the writer per round
SWEEP_IDLE_S = 1.0  # the longest sleep: new expiries are looked for at least this often
SWEEP_RETRY_S = 1.0  # after a round in which some removal failed


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Sweeper:
    def __init__(self, store: Engine, writer: Writer) -> None:
        self.store = store
        self.writer = writer
        self.expired = 0  # generations the sweep removed since the daemon started

    async def run(self) -> None:
        while True:
            if self.store.blocking_reads:  # a query (PostgreSQL): off the event loop
                due = await trio.to_thread.run_sync(
                    self.store.due_expirations, now_ms(), SWEEP_BATCH
                )
            else:
                due = self.store.due_expirations(now_ms(), SWEEP_BATCH)
            if not due:
                await trio.sleep(self._idle_s())
                continue
            jobs = [(expire, MutationJob(expire)) for expire in due]
            for _, job in jobs:
                await self.writer.enqueue(job)
            failed = False
            for expire, job in jobs:
                await job.done.wait()
                outcome = job.outcome
                if outcome is not None and outcome.ok:
                    self.expired += int(outcome.changed)
                else:
                    failed = True
                    self.store.retry_expiration(expire)
            if failed:
                await trio.sleep(SWEEP_RETRY_S)

    def _idle_s(self) -> float:
        upcoming = self.store.next_expiry_ms()
        if upcoming is None:
            return SWEEP_IDLE_S
        return min(SWEEP_IDLE_S, max(0.0, (upcoming - now_ms()) / 1000))
