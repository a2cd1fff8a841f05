# A request abandoned by cancellation never answers another. Each async client, and
# the blocking one interrupted by an exception from a signal handler, gives up a load of
# a large session at many points of its life (after some turns of the event loop, after
# a deadline, in a pipeline); the next request on the same client must get its own
# reply. LangGraph's store is driven the way LangGraph's own store tests cancel it.
from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from sessionstore import AsyncClient, Client, ConnectionLost, TrioClient, requests
from sessionstore.langgraph import SessionStoreStore

from .conftest import DaemonProcess, snapshot

LARGE_SNAPSHOT_BYTES = 3 * 1024 * 1024  # a reply that takes many reads to arrive
LOOP_TURNS = range(0, 12)  # event-loop turns before cancelling, 0 = at once
DEADLINES_S = [0.0002 * n for n in range(1, 16)]


def large() -> dict[str, Any]:
    return snapshot("a", blob="x" * LARGE_SNAPSHOT_BYTES)


def small() -> dict[str, Any]:
    return snapshot("c", note="the small one")


@pytest.fixture
def saved(running: DaemonProcess) -> DaemonProcess:
    with running.client() as client:
        client.save(large())
        client.save(small())
    return running


def test_asyncio_client_after_cancelled_requests(saved: DaemonProcess) -> None:
    async def scenario() -> None:
        async with AsyncClient(saved.socket_path) as client:
            for turns in LOOP_TURNS:
                task = asyncio.ensure_future(client.load("a"))
                for _ in range(turns):
                    await asyncio.sleep(0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                assert await client.load("c") == small(), f"after {turns} turns"
            for deadline in DEADLINES_S:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(client.load("a"), deadline)
                assert await client.load("c") == small(), f"after {deadline} s"
            for deadline in DEADLINES_S:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        client.pipeline([requests.load("a"), requests.load("a")]),
                        deadline,
                    )
                [c, a] = await client.pipeline([requests.load("c"), requests.load("a")])
                assert (c, a) == (small(), large()), f"pipelined, after {deadline} s"

    asyncio.run(scenario())


def test_trio_client_after_cancelled_requests(saved: DaemonProcess) -> None:
    async def scenario() -> None:
        async with TrioClient(saved.socket_path) as client:
            for turns in LOOP_TURNS:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(client.load, "a")
                    for _ in range(turns):
                        await trio.lowlevel.checkpoint()
                    nursery.cancel_scope.cancel()
                assert await client.load("c") == small(), f"after {turns} turns"
            for deadline in DEADLINES_S:
                with trio.move_on_after(deadline):
                    await client.load("a")
                assert await client.load("c") == small(), f"after {deadline} s"
            for deadline in DEADLINES_S:
                with trio.move_on_after(deadline):
                    await client.pipeline([requests.load("a"), requests.load("a")])
                [c, a] = await client.pipeline([requests.load("c"), requests.load("a")])
                assert (c, a) == (small(), large()), f"pipelined, after {deadline} s"

    trio.run(scenario)


class Interrupted(Exception):
    pass


@contextlib.contextmanager
def interrupted_after(seconds: float) -> Iterator[None]:
    """Raise Interrupted in this thread after seconds, as a signal handler that times a
    call out does (signal.setitimer)."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_blocking_client_after_an_interrupted_request(saved: DaemonProcess) -> None:
    with Client(saved.socket_path) as client:
        for deadline in DEADLINES_S:
            # a handler's exception raised inside cbor2's decoder reaches the client as a
            # reply it cannot decode: ConnectionLost, the connection closed all the same
            with contextlib.suppress(Interrupted, ConnectionLost), interrupted_after(deadline):
                client.load("a")
            assert client.load("c") == small(), f"after {deadline} s"


def test_langgraph_store_after_a_cancelled_get(saved: DaemonProcess) -> None:
    """As LangGraph's own test of a batched store's cancellation: a get cancelled after
    a turn of the loop must not break the store for the next get."""

    async def scenario() -> None:
        store = SessionStoreStore(saved.socket_path)
        try:
            await store.aput(("a",), "b", {"blob": "y" * LARGE_SNAPSHOT_BYTES})
            await store.aput(("c",), "d", {"small": True})
            for turns in LOOP_TURNS:
                task = asyncio.ensure_future(store.aget(("a",), "b"))
                for _ in range(turns):
                    await asyncio.sleep(0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                item = await store.aget(("c",), "d")
                assert item is not None
                assert (item.namespace, item.key, item.value) == (("c",), "d", {"small": True})
        finally:
            await store.aclose()

    asyncio.run(scenario())
