# The writer's queue: jobs come out in the order they went in, a take waits for the
# first and then takes what is queued within its bounds, a full queue makes putters
# wait until the writer takes some, and a closed queue gives the writer what is
# left, then ends, and refuses new jobs.
from __future__ import annotations

import pytest
import trio
import trio.testing

from sessionstored.writer.job_queue import JobQueue
from sessionstored.writer.jobs import Job, MutationJob

from .storage_helpers import put


def _jobs(count: int) -> list[MutationJob]:
    return [MutationJob(put(f"s{n}", n)) for n in range(count)]


async def test_a_take_returns_every_queued_job_in_order() -> None:
    queue = JobQueue(depth=8)
    jobs = _jobs(5)
    for job in jobs:
        assert queue.put_nowait(job)
    assert await queue.take(max_jobs=100, max_bytes=1 << 30) == jobs
    assert len(queue) == 0


async def test_a_take_is_bounded_by_count_and_by_bytes() -> None:
    queue = JobQueue(depth=8)
    jobs = _jobs(6)
    for job in jobs:
        queue.put_nowait(job)
    assert await queue.take(max_jobs=2, max_bytes=1 << 30) == jobs[:2]
    one_body = jobs[2].size()
    # the job that reaches the bound is the last one taken
    assert await queue.take(max_jobs=100, max_bytes=one_body + 1) == jobs[2:4]
    assert await queue.take(max_jobs=100, max_bytes=1) == jobs[4:5]
    assert await queue.take(max_jobs=100, max_bytes=1 << 30) == jobs[5:]


async def test_a_take_waits_for_the_first_job() -> None:
    queue = JobQueue(depth=8)
    taken: list[list[Job]] = []
    async with trio.open_nursery() as nursery:

        async def writer() -> None:
            taken.append(await queue.take(100, 1 << 30))

        nursery.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()
        assert taken == []
        job = _jobs(1)[0]
        assert queue.put_nowait(job)
    assert taken == [[job]]


async def test_a_full_queue_makes_putters_wait_until_the_writer_takes() -> None:
    queue = JobQueue(depth=2)
    first, second, third = _jobs(3)
    assert queue.put_nowait(first) and queue.put_nowait(second)
    assert not queue.put_nowait(third)
    placed = trio.Event()
    async with trio.open_nursery() as nursery:

        async def putter() -> None:
            await queue.put(third)
            placed.set()

        nursery.start_soon(putter)
        await trio.testing.wait_all_tasks_blocked()
        assert not placed.is_set()
        assert await queue.take(1, 1 << 30) == [first]
        await placed.wait()
    assert await queue.take(10, 1 << 30) == [second, third]


async def test_a_closed_queue_gives_what_is_left_then_ends_and_refuses_puts() -> None:
    queue = JobQueue(depth=4)
    jobs = _jobs(2)
    for job in jobs:
        queue.put_nowait(job)
    queue.close()
    with pytest.raises(trio.ClosedResourceError):
        queue.put_nowait(_jobs(1)[0])
    assert await queue.take(10, 1 << 30) == jobs
    assert await queue.take(10, 1 << 30) == []


async def test_closing_refuses_a_waiting_putter() -> None:
    queue = JobQueue(depth=1)
    queue.put_nowait(_jobs(1)[0])
    refused = trio.Event()
    async with trio.open_nursery() as nursery:

        async def putter() -> None:
            with pytest.raises(trio.ClosedResourceError):
                await queue.put(_jobs(1)[0])
            refused.set()

        nursery.start_soon(putter)
        await trio.testing.wait_all_tasks_blocked()
        queue.close()
    assert refused.is_set()


async def test_closing_ends_a_waiting_take() -> None:
    queue = JobQueue(depth=1)
    taken: list[list[Job]] = []
    async with trio.open_nursery() as nursery:

        async def writer() -> None:
            taken.append(await queue.take(10, 1 << 30))

        nursery.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()
        queue.close()
    assert taken == [[]]


async def test_a_cancelled_take_leaves_the_queue_usable() -> None:
    queue = JobQueue(depth=4)
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def writer() -> None:
            with scope:
                await queue.take(10, 1 << 30)

        nursery.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
    assert scope.cancelled_caught
    job = _jobs(1)[0]
    assert queue.put_nowait(job)  # no parked writer is rescheduled twice
    assert await queue.take(10, 1 << 30) == [job]


async def test_take_all_nowait_empties_the_queue() -> None:
    queue = JobQueue(depth=4)
    jobs = _jobs(3)
    for job in jobs:
        queue.put_nowait(job)
    assert queue.take_all_nowait() == jobs
    assert len(queue) == 0
