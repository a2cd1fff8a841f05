# The connection's outbox over a real socket pair: replies leave in request
# order whoever finishes first, a reply the socket cannot take at once is sent
# by a task of its own while later ones queue behind it, and a closed outbox
# sends nothing more.
from __future__ import annotations

import socket
from typing import Any

import cbor2
import trio

from sessionstore.wire.protocol import Request
from sessionstored.front.outbox import Outbox
from sessionstored.front.readiness import Readiness
from sessionstored.front.socket_io import SocketIO
from sessionstored.ops.steps import Write
from sessionstored.storage.mutations import Outcome
from sessionstored.writer.jobs import MutationJob

from .storage_helpers import put


def _write(number: int) -> Write:
    request = Request("save", {}, rid=number, has_rid=True)
    return Write(request, MutationJob(put(f"s{number}", number)), lambda o: {"rid": number})


def _internal(_request: Any, error: BaseException, _doing: str) -> dict[str, Any]:
    raise AssertionError(f"no internal error expected: {error}")


async def _pair() -> tuple[SocketIO, socket.socket, trio.SocketStream]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    return SocketIO(stream, Readiness()), theirs, stream


def _received(peer: socket.socket) -> list[Any]:
    peer.setblocking(False)
    data = b""
    try:
        while chunk := peer.recv(1 << 20):
            data += chunk
    except BlockingIOError:
        pass
    return list(cbor2.loads(data) for data in _split(data))


def _split(data: bytes) -> list[bytes]:
    items = []
    while data:
        value = cbor2.loads(data)
        size = len(cbor2.dumps(value))
        items.append(data[:size])
        data = data[size:]
    return items


async def test_replies_leave_in_request_order_whoever_finishes_first() -> None:
    sock, peer, stream = await _pair()
    async with trio.open_nursery() as nursery:
        outbox = Outbox(sock, cbor2.dumps, _internal, nursery)
        first, second = _write(1), _write(2)
        outbox.add_job(first)
        outbox.add_job(second)
        outbox.add_reply(cbor2.dumps({"rid": 3}))
        second.job.finish(Outcome(seq=2))  # the later write is done first
        assert _received(peer) == []
        first.job.finish(Outcome(seq=1))
        await outbox.wait_sent()
        assert _received(peer) == [{"rid": 1}, {"rid": 2}, {"rid": 3}]
    sock.detach()
    await stream.aclose()
    peer.close()


async def test_what_the_socket_cannot_take_is_sent_later_and_keeps_its_place() -> None:
    sock, peer, stream = await _pair()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    big = cbor2.dumps({"rid": 1, "blob": b"x" * 2_000_000})
    async with trio.open_nursery() as nursery:
        outbox = Outbox(sock, cbor2.dumps, _internal, nursery)
        outbox.add_reply(big)  # far more than the socket's buffers
        outbox.add_reply(cbor2.dumps({"rid": 2}))
        received = b""

        async def read_all() -> None:
            nonlocal received
            peer.setblocking(False)
            while len(received) < len(big) + 5:
                await trio.lowlevel.wait_readable(peer)
                received += peer.recv(1 << 20)

        nursery.start_soon(read_all)
        await outbox.wait_sent()
    assert _split(received) == [big, cbor2.dumps({"rid": 2})]
    sock.detach()
    await stream.aclose()
    peer.close()


async def test_a_closed_outbox_sends_nothing_when_a_job_finishes_late() -> None:
    sock, peer, stream = await _pair()
    async with trio.open_nursery() as nursery:
        outbox = Outbox(sock, cbor2.dumps, _internal, nursery)
        late = _write(1)
        outbox.add_job(late)
        outbox.closed = True  # the connection went away
        late.job.finish(Outcome(seq=1))
    assert _received(peer) == []
    sock.detach()
    await stream.aclose()
    peer.close()
