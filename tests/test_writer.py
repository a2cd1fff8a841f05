# The writer task in-process under trio (pytest-trio), over the simulated
# filesystem: concurrent submitters are group-committed, each gets its own
# outcome in commit order, and a fatal storage error fails everyone queued.
from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from sessionstored.storage.mutations import Outcome
from sessionstored.writer import writer as writer_module
from sessionstored.writer.jobs import MutationJob
from sessionstored.writer.writer import Writer
from sessionstored.writer.writer_thread import WriterThread

from .storage_helpers import assert_clean, body_for, new_fs, open_store, put


async def _submit(writer: Writer, job: MutationJob, results: list[Outcome]) -> None:
    await writer.enqueue(job)
    await job.wait()
    assert job.outcome is not None
    results.append(job.outcome)


async def test_concurrent_saves_are_group_committed() -> None:
    fs = new_fs()
    store = open_store(fs)
    writer = Writer(store, on_fatal=lambda reason: None)
    results: list[Outcome] = []
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as clients:
            for n in range(64):
                clients.start_soon(_submit, writer, MutationJob(put(f"c{n}", n)), results)
            await trio.testing.wait_all_tasks_blocked()  # all 64 queued (QUEUE_DEPTH)
            nursery.start_soon(writer.run)
        writer.close()
    assert len(results) == 64 and all(o.ok for o in results)
    assert sorted(o.seq for o in results) == list(range(1, 65))
    assert writer.batches == 1, "saves queued together are committed as one batch"
    assert store.reads.read("s", "c7").body == body_for("c7", 7)


async def test_same_id_twice_in_one_drain_commits_in_order() -> None:
    store = open_store(new_fs())
    writer = Writer(store, on_fatal=lambda reason: None)
    jobs = [MutationJob(put("same", n)) for n in range(5)]
    async with trio.open_nursery() as nursery:
        for job in jobs:
            await writer.enqueue(job)  # all queued before the writer runs
        nursery.start_soon(writer.run)
        for job in jobs:
            await job.wait()
        writer.close()
    assert [j.outcome.seq for j in jobs if j.outcome] == [1, 2, 3, 4, 5]
    assert store.reads.read("s", "same").body == body_for("same", 4)


@pytest.mark.parametrize("per_batch", [1, 2], ids=["lone, waited on the loop", "through trio"])
async def test_a_batchs_replies_go_out_once_the_next_batch_is_in_the_thread(
    per_batch: int,
) -> None:
    """The first batch's reply is sent after the second batch is handed to the writer's
    thread, so that its fan-out overlaps that commit: when the first job is finished,
    the second commit has begun (and it waits for that reply: it is not held back
    until the second commit returns either)."""
    first, second = MutationJob(put("first", 1)), MutationJob(put("second", 1))
    first_company = [MutationJob(put(f"first-{n}", 1)) for n in range(1, per_batch)]
    second_company = [MutationJob(put(f"second-{n}", 1)) for n in range(1, per_batch)]
    second_began, first_answered = threading.Event(), threading.Event()
    began_before_the_answer: list[bool] = []

    def answered(job: Any) -> None:  # on the event loop, in the writer's task
        began_before_the_answer.append(second_began.wait(timeout=30))
        first_answered.set()

    first.on_done = answered

    class Watched:  # the store, its commits looked at first
        def __init__(self, store: Any) -> None:
            self.store = store

        def __getattr__(self, name: str) -> Any:
            return getattr(self.store, name)

        def commit_durably(self, mutations: Any) -> Any:
            if mutations[0] == first.mutation:
                for job in (second, *second_company):  # queued while the first commits
                    assert writer.submit(job)
            elif mutations[0] == second.mutation:
                second_began.set()
                assert first_answered.wait(timeout=30)
            return self.store.commit_durably(mutations)

    writer = Writer(Watched(open_store(new_fs())), on_fatal=lambda reason: None)
    async with trio.open_nursery() as nursery:
        for job in (first, *first_company):
            await writer.enqueue(job)
        nursery.start_soon(writer.run)
        await second.wait()
        writer.close()
    assert began_before_the_answer == [True]
    assert writer.batches == 2
    assert first.outcome is not None and first.outcome.ok
    assert second.outcome is not None and second.outcome.seq == first.outcome.seq + per_batch


async def test_fatal_error_fails_the_batch_and_everything_after() -> None:
    fs = new_fs()
    store = open_store(fs)
    fatal: list[str] = []
    writer = Writer(store, on_fatal=fatal.append)
    store.commit([put("before", 0)])
    fs.fail_fsync_paths.add(store.state.log.path(store.state.log.active))
    results: list[Outcome] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await _submit(writer, MutationJob(put("a", 1)), results)
        await _submit(writer, MutationJob(put("b", 1)), results)
        writer.close()
    assert [o.code for o in results] == ["io_error", "io_error"]
    assert fatal and "fdatasync" in fatal[0]


async def test_the_writer_compacts_checkpoints_and_prepares_spares_by_itself() -> None:
    fs = new_fs()
    store = open_store(fs, segment_bytes=32 * 1024, checkpoint_every=50)
    writer = Writer(store, on_fatal=lambda reason: None)
    results: list[Outcome] = []

    async def write_round(round_: int) -> None:
        async with trio.open_nursery() as clients:
            for n in range(8):
                job = MutationJob(put(f"s{n}", [round_, "w" * 1500]))
                clients.start_soon(_submit, writer, job, results)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        rounds = 40
        for round_ in range(rounds):
            await write_round(round_)
        # a compaction copies in the background while batches go on: how far it got by
        # the last round depends on the machine, so the writes go on until none is due
        while store.compactor.due():
            assert rounds < 400, "the writer's compactions never caught up"
            await write_round(rounds)
            rounds += 1
        writer.close()
    assert all(o.ok for o in results) and len(results) == 8 * rounds
    assert writer.compactions > 0 and writer.checkpoints > 0
    for n in range(8):
        want = body_for(f"s{n}", [rounds - 1, "w" * 1500])
        assert store.reads.read("s", f"s{n}").body == want
    assert_clean(store)
    live = sum(store.state.index.live_bytes.values())  # documents and earlier generations kept
    assert sum(store.state.log.used.values()) <= 2 * live + 2 * store.state.log.segment_bytes


async def test_the_watchdog_pings_on_trios_clock(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(tmp_path / "notify"))
    receiver.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    writer = Writer(open_store(new_fs()), on_fatal=lambda reason: None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run, 10.0)  # an idle writer, pinging every 10 s
        await trio.sleep(95)  # virtual seconds: the mock clock jumps when all are idle
        writer.close()
    pings = []
    with contextlib.suppress(BlockingIOError):
        while True:
            pings.append(receiver.recv(100))
    receiver.close()
    assert pings.count(b"WATCHDOG=1") == 10  # at 0, 10, ..., 90


async def test_a_call_handed_to_the_thread_is_delivered_though_its_caller_is_cancelled() -> None:
    started, release = threading.Event(), threading.Event()
    worker = WriterThread("test-worker")
    delivered: list[str] = []

    def durable_write() -> str:
        started.set()
        release.wait()
        return "durable"

    async def cancel_then_release(scope: trio.CancelScope) -> None:
        await trio.to_thread.run_sync(started.wait)  # the call is in the thread
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()  # and its caller saw the cancellation
        release.set()  # the "disk" returns only after the cancellation

    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:
            nursery.start_soon(cancel_then_release, scope)
            delivered.append(await worker.call(durable_write))
            await trio.lowlevel.checkpoint()  # the cancellation is delivered here instead
            delivered.append("not reached")
    worker.close()
    assert scope.cancelled_caught
    assert delivered == ["durable"]


async def test_a_call_waited_for_on_the_loop_returns_at_once_or_falls_back_to_trio() -> None:
    worker = WriterThread("test-worker")
    assert await worker.call_waiting(lambda: 42, 30.0) == (42, True)

    def fails() -> None:
        raise ValueError("from the thread")

    with pytest.raises(ValueError, match="from the thread"):
        await worker.call_waiting(fails, 30.0)
    release = threading.Event()

    async def release_from_the_loop() -> None:
        await trio.sleep(0.05)
        release.set()  # runs only if the loop is not held by the waiting call

    async with trio.open_nursery() as nursery:
        nursery.start_soon(release_from_the_loop)
        value = await worker.call_waiting(lambda: release.wait(60) and "done", 0.01)
    worker.close()
    assert value == ("done", False)


class _HeldCommits:
    """A log store whose commits wait for `release` while `hold` is set."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.hold = False
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def commit_durably(self, mutations: Any) -> Any:
        if self.hold:
            self.release.wait(60)
        return self.store.commit_durably(mutations)


async def test_a_slow_commit_of_a_lone_save_does_not_hold_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lone save's commit is waited for on the loop while it is short (how often:
    bench/cpu.py's batches_waited_on_loop_share); one that is slow hands over to trio,
    and the loop goes on meanwhile: the commit is released from the loop itself."""
    monkeypatch.setattr(writer_module, "WAIT_ON_LOOP_MAX_S", 30.0)
    store = _HeldCommits(open_store(new_fs()))
    writer = Writer(store, on_fatal=lambda reason: None)  # type: ignore[arg-type]
    results: list[Outcome] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        for n in range(3):
            await _submit(writer, MutationJob(put(f"lone{n}", n)), results)
        monkeypatch.setattr(writer_module, "WAIT_ON_LOOP_MAX_S", 0.01)
        store.hold = True

        async def release_from_the_loop() -> None:
            await trio.sleep(0.05)
            store.release.set()  # only if the loop went on while the commit was held

        nursery.start_soon(release_from_the_loop)
        await _submit(writer, MutationJob(put("slow", 0)), results)
        store.hold = False
        await _submit(writer, MutationJob(put("after", 0)), results)  # through trio
        monkeypatch.setattr(writer_module, "WAIT_ON_LOOP_MAX_S", 30.0)
        await _submit(writer, MutationJob(put("fast again", 0)), results)
        writer.close()
    assert [o.seq for o in results] == [1, 2, 3, 4, 5, 6]
