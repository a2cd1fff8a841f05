# The expiry sweep: removes the generations whose expiry has passed, as
# committed changes (a Sweep), so that each removal has its seq and watchers
# see it, with "expired": true. Reads hide an expired generation the moment it
# expires; the sweep only reclaims it. It wakes at the next expiry the engine
# knows of (at most every SWEEP_IDLE_S, to learn of new ones), takes at most
# SWEEP_BATCH due generations, and hands them to the writer as one job: it
# queues among clients' writes and commits in one of the writer's batches, so
# a million expiring at once costs the clients a share of the writer, never a
# stall. A generation a round did not remove is scheduled again: its sweep
# failed (a full disk), or the writer's clock, set back since the round read it,
# had it unexpired. On PostgreSQL one daemon at a time sweeps (the one holding
# the sweeper's lock); the others serve, and take over when its connection ends.
from __future__ import annotations

import trio

from ..storage.clock import epoch_ms
from ..storage.engine import Engine
from ..storage.mutations import Expire, Sweep
from .jobs import MutationJob
from .writer import Writer

SWEEP_BATCH = 10_000  # due generations handed to the writer per round
DUE_PER_PASS = 500  # entries taken from the log's schedule per event-loop pass
SWEEP_IDLE_S = 1.0  # the longest sleep: new expiries are looked for at least this often
SWEEP_RETRY_S = 1.0  # after a round in which some removal failed


class Sweeper:
    def __init__(self, store: Engine, writer: Writer) -> None:
        self.store = store
        self.writer = writer
        self.expired = 0  # generations the sweep removed since the daemon started
        self._woken = trio.Event()

    async def run(self) -> None:
        while True:
            if not await self.sweep_round():
                with trio.move_on_after(self._idle_s()):
                    await self._woken.wait()
                self._woken = trio.Event()

    def wake(self) -> None:
        """Look for due generations now (the clock was moved: advance_clock)."""
        self._woken.set()

    async def sweep_round(self) -> bool:
        """The due generations, removed in one writer job; False when none was due."""
        due = await self._due()
        if not due:
            return False
        job = MutationJob(Sweep(tuple(due)))
        await self.writer.enqueue(job)
        await job.wait()
        outcome = job.outcome
        if outcome is None or not outcome.ok:
            self._offer_again(due)
            await trio.sleep(SWEEP_RETRY_S)
            return True
        removed = outcome.results[0]["expired"] if outcome.results else 0
        self.expired += removed
        if removed < len(due):
            # Some were left alone: written since (their new expiry is scheduled), or not
            # expired by the writer's clock, set back since this round read it: those
            # must stay scheduled, or nothing would sweep them until a restart.
            self._offer_again(due)
        return True

    def _offer_again(self, due: list[Expire]) -> None:
        for expire in due:
            self.store.expiry.retry(expire)

    async def _due(self) -> list[Expire]:
        if self.store.blocking_reads:  # a query (PostgreSQL): off the event loop
            return await trio.to_thread.run_sync(self.store.expiry.due, epoch_ms(), SWEEP_BATCH)
        # from the schedule, on the event loop: a pass takes at most DUE_PER_PASS of its
        # entries, stale ones counted, and the loop serves others between passes
        due: list[Expire] = []
        while len(due) < SWEEP_BATCH:
            now = epoch_ms()
            due += self.store.expiry.due(now, DUE_PER_PASS)
            upcoming = self.store.expiry.next_ms()
            if upcoming is None or upcoming > now:
                break
            await trio.sleep(0)
        return due

    def _idle_s(self) -> float:
        upcoming = self.store.expiry.next_ms()
        if upcoming is None:
            return SWEEP_IDLE_S
        return min(SWEEP_IDLE_S, max(0.0, (upcoming - epoch_ms()) / 1000))
