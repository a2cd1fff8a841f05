# The broadcaster in-process under trio: a watcher that stops reading is told it
# lagged (never silently skipped), and a replay is never cut short.
from __future__ import annotations

from typing import Any

import trio

from sessionstored.storage.store import Store
from sessionstored.watch import Broadcaster

from .storage_helpers import new_fs, open_store, put


def _store() -> Store:
    return open_store(new_fs(), history_changes=50)


async def test_a_watcher_that_stops_reading_gets_lagged() -> None:
    store = _store()
    broadcaster = Broadcaster(store, max_lag_changes=5)
    received: list[dict[str, Any]] = []
    reader_stuck = trio.Event()
    release = trio.Event()

    async def send(event: dict[str, Any]) -> None:
        received.append(event)
        if len(received) == 2:
            reader_stuck.set()
            await release.wait()  # the client stops reading

    async with trio.open_nursery() as nursery:
        nursery.start_soon(broadcaster.stream, 0, send)
        await trio.sleep(0.01)
        for n in range(3):
            store.commit([put(f"x{n}", n)])
            broadcaster.published()
            await trio.sleep(0.01)
        await reader_stuck.wait()
        for n in range(10):
            store.commit([put(f"y{n}", n)])
            broadcaster.published()
        release.set()
    *events, last = received
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), "delivered events are a gap-free prefix"
    assert last == {"event": "lagged", "resume_from": seqs[-1]}, "resume exactly after the last one"
    assert broadcaster.watchers == 0


async def test_replay_of_a_long_backlog_is_not_lagging() -> None:
    store = _store()
    for n in range(30):
        store.commit([put(f"z{n}", n)])
    broadcaster = Broadcaster(store, max_lag_changes=5)
    received: list[dict[str, Any]] = []

    async def send(event: dict[str, Any]) -> None:
        received.append(event)
        if len(received) == 30:
            broadcaster.close()

    await broadcaster.stream(0, send)
    assert [e["seq"] for e in received] == list(range(1, 31))


async def test_falling_out_of_history_is_lagging() -> None:
    store = _store()
    for n in range(120):
        store.commit([put(f"h{n % 10}", n)])
    broadcaster = Broadcaster(store, max_lag_changes=1000)
    assert broadcaster.compacted_before(0) == store.history.oldest_seq()
    received: list[dict[str, Any]] = []

    async def send(event: dict[str, Any]) -> None:
        received.append(event)

    await broadcaster.stream(3, send)
    assert received == [{"event": "lagged", "resume_from": 3}]
