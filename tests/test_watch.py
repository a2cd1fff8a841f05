# The broadcaster in-process under trio, writing to a real socket pair: a watcher
# that stops reading is told it lagged (never silently skipped), counting the
# events unread in its socket; one that reads is never cut off; a replay is never
# cut short; a watcher whose socket never takes the `lagged` event is dropped,
# logged and counted.
from __future__ import annotations

import socket
from typing import Any

import trio
import trio.testing

from sessionstore.wire.protocol import NEED_DATA, Connection, Mode, encode
from sessionstored.front.watch_sink import SocketSink
from sessionstored.ops.watch import Broadcaster
from sessionstored.storage.log.store import Store

from .storage_helpers import new_fs, open_store, put


def _store() -> Store:
    return open_store(new_fs(), history_changes=50)


class Pair:
    """The daemon's end as a sink; the watcher's end read on demand."""

    def __init__(self, send_buffer_bytes: int | None = None) -> None:
        ours, theirs = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if send_buffer_bytes is not None:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
            theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, send_buffer_bytes)
        self.stream = trio.SocketStream(ours)
        self.sink = SocketSink(self.stream, lambda m: encode(m, Mode.CBOR))
        self.theirs = theirs
        self.conn = Connection(max_message_bytes=1 << 20, mode=Mode.CBOR)

    async def read_all(self) -> list[dict[str, Any]]:
        """Everything sent until the daemon's end closes."""
        await self.stream.aclose()
        out = []
        while True:
            data = await self.theirs.recv(1 << 16)
            if not data:
                self.conn.receive_eof()
            else:
                self.conn.receive_data(data)
            while (message := self.conn.next_message()) is not NEED_DATA:
                if not isinstance(message, dict):
                    return out
                out.append(message)


def _commit(store: Store, broadcaster: Broadcaster, name: str) -> None:
    store.commit([put(name, 1)])
    broadcaster.published()


async def test_a_watcher_that_stops_reading_gets_lagged_counting_its_unread_events() -> None:
    store = _store()
    broadcaster = Broadcaster(store, max_lag_changes=5)
    pair = Pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broadcaster.stream, 0, pair.sink)
        for n in range(3):
            _commit(store, broadcaster, f"x{n}")
            await trio.testing.wait_all_tasks_blocked()  # sent into the socket
        for n in range(10):  # all of it fits in the socket, none of it is read
            _commit(store, broadcaster, f"y{n}")
            await trio.testing.wait_all_tasks_blocked()
    assert broadcaster.cut_off == 1 and broadcaster.dropped == 0
    *events, last = await pair.read_all()
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), "delivered events are a gap-free prefix"
    assert len(seqs) <= 5 + 1, "the unread events counted as lag"
    assert last == {"event": "lagged", "resume_from": seqs[-1]}, "resume exactly after the last one"
    assert broadcaster.watchers == 0


async def test_a_watcher_that_reads_is_never_cut_off() -> None:
    store = _store()
    broadcaster = Broadcaster(store, max_lag_changes=5)
    pair = Pair()
    received: list[dict[str, Any]] = []

    async def read() -> None:
        while len(received) < 40:
            pair.conn.receive_data(await pair.theirs.recv(1 << 16))
            while (message := pair.conn.next_message()) is not NEED_DATA:
                received.append(message)
        broadcaster.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(broadcaster.stream, 0, pair.sink)
        nursery.start_soon(read)
        for n in range(40):
            _commit(store, broadcaster, f"r{n}")
            await trio.testing.wait_all_tasks_blocked()  # sent, and read
    assert [e["seq"] for e in received] == list(range(1, 41))
    assert broadcaster.cut_off == 0


async def test_replay_of_a_long_backlog_is_not_lagging() -> None:
    store = _store()
    for n in range(30):
        store.commit([put(f"z{n}", n)])
    broadcaster = Broadcaster(store, max_lag_changes=5)
    pair = Pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broadcaster.stream, 0, pair.sink)
        await trio.testing.wait_all_tasks_blocked()  # the backlog is sent
        broadcaster.close()
    assert [e["seq"] for e in await pair.read_all()] == list(range(1, 31))
    assert broadcaster.cut_off == 0


async def test_falling_out_of_history_is_lagging() -> None:
    store = _store()
    for n in range(120):
        store.commit([put(f"h{n % 10}", n)])
    broadcaster = Broadcaster(store, max_lag_changes=1000)
    assert broadcaster.compacted_before(0) == store.history.oldest_seq()
    pair = Pair()
    await broadcaster.stream(3, pair.sink)
    assert await pair.read_all() == [{"event": "lagged", "resume_from": 3}]
    assert broadcaster.cut_off == 1


async def test_a_watcher_whose_socket_never_takes_the_lagged_event_is_dropped() -> None:
    store = _store()
    broadcaster = Broadcaster(store, max_lag_changes=20, send_timeout_s=0.2)
    pair = Pair(send_buffer_bytes=1024)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(broadcaster.stream, 0, pair.sink)
        await trio.testing.wait_all_tasks_blocked()  # the watcher is waiting for changes
        for n in range(200):
            store.commit([put(f"big{n}", "v" * 64)])
            broadcaster.published()
            await trio.testing.wait_all_tasks_blocked()
    assert broadcaster.cut_off == 1 and broadcaster.dropped == 1
    events = await pair.read_all()
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(e.get("event") != "lagged" for e in events)
