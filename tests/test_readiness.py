# The daemon's one epoll set for its connections, over real socket pairs: a parked
# connection is woken by the bytes its peer sends; bytes that arrive while their
# connection is busy make its next wait return at once; nothing is missed between a
# receive that found nothing and the next wait, nor after a receive that filled its
# room (bytes an edge will not report again); a cancelled waiter is let go; and
# a socket taken out of the set can be closed while the set goes on.
from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from sessionstored.front.readiness import Readiness
from sessionstored.front.socket_io import SocketIO


def _pair() -> tuple[socket.socket, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    return ours, theirs


def _drain(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            return data
        data += chunk


@asynccontextmanager
async def _watched(readiness: Readiness, ours: socket.socket) -> AsyncIterator[trio.Nursery]:
    """ours in the set, the set's task running, and its first wait (which returns at
    once, as a connection's first receive is tried at once) done."""
    readiness.register(ours.fileno())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(readiness.run)
        await readiness.wait(ours.fileno())
        assert _drain(ours) == b""
        yield nursery
        nursery.cancel_scope.cancel()


async def _woken_by(
    readiness: Readiness, ours: socket.socket, theirs: socket.socket, data: bytes
) -> None:
    """The peer sends data: a wait on ours returns, and ours reads exactly that."""
    theirs.send(data)
    with trio.fail_after(5):
        await readiness.wait(ours.fileno())
    assert _drain(ours) == data


async def test_a_parked_connection_wakes_when_its_peer_sends() -> None:
    readiness = Readiness()
    ours, theirs = _pair()
    woken = trio.Event()
    async with _watched(readiness, ours) as nursery:

        async def waiter() -> None:
            await readiness.wait(ours.fileno())
            woken.set()

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert not woken.is_set()
        theirs.send(b"request")
        await woken.wait()
        assert _drain(ours) == b"request"


async def test_bytes_that_arrive_while_busy_make_the_next_wait_return_at_once() -> None:
    readiness = Readiness()
    ours, theirs = _pair()
    async with _watched(readiness, ours):
        theirs.send(b"while busy")
        await trio.testing.wait_all_tasks_blocked()  # the set's task marks it ready
        with trio.fail_after(5):
            await readiness.wait(ours.fileno())
        assert _drain(ours) == b"while busy"


async def test_every_send_after_a_receive_wakes_again() -> None:
    readiness = Readiness()
    ours, theirs = _pair()
    async with _watched(readiness, ours):
        for number in range(50):
            await _woken_by(readiness, ours, theirs, b"%d," % number)


async def test_a_cancelled_waiter_is_let_go_and_the_socket_stays_watched() -> None:
    readiness = Readiness()
    ours, theirs = _pair()
    async with _watched(readiness, ours) as nursery:
        scope = trio.CancelScope()

        async def cancelled_waiter() -> None:
            with scope:
                await readiness.wait(ours.fileno())

        nursery.start_soon(cancelled_waiter)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert scope.cancelled_caught
        await _woken_by(readiness, ours, theirs, b"after")


async def test_a_socket_taken_out_of_the_set_can_be_closed_and_the_set_goes_on() -> None:
    readiness = Readiness()
    gone, _peer = _pair()
    ours, theirs = _pair()
    readiness.register(gone.fileno())
    readiness.unregister(gone.fileno())
    gone.close()
    readiness.unregister(gone.fileno())  # twice, and after the close: no error
    async with _watched(readiness, ours):
        await _woken_by(readiness, ours, theirs, b"x")


async def test_bytes_left_behind_by_a_full_receive_are_read_without_a_new_send() -> None:
    # an edge reports bytes as they arrive, never bytes left unread: a receive that
    # fills its room must leave the socket marked ready, or a client that sent two
    # requests at once and waits for both replies would wait forever
    readiness = Readiness()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    sock = SocketIO(stream, readiness)
    sent = bytes(range(256)) * 800  # 200 KiB: three receives fill their room
    async with trio.open_nursery() as nursery:
        nursery.start_soon(readiness.run)
        theirs.sendall(sent)
        room = 64 * 1024
        received = await sock.receive(room, try_first=False)
        with trio.fail_after(5):
            while len(received) < len(sent):
                received += await sock.receive(room, try_first=False)
        assert received == sent
        nursery.cancel_scope.cancel()
    sock.detach()


async def test_the_peers_end_after_its_last_bytes_is_read_without_a_new_edge() -> None:
    # its last bytes and its end of writing can come on one edge: after the receive
    # of those bytes, the next wait must still return, for the receive of the end
    readiness = Readiness()
    ours, theirs = _pair()
    async with _watched(readiness, ours):
        theirs.sendall(b"last request")
        theirs.shutdown(socket.SHUT_WR)
        await trio.testing.wait_all_tasks_blocked()  # one edge, for both
        with trio.fail_after(5):
            await readiness.wait(ours.fileno())
            assert ours.recv(65536) == b"last request"
            await readiness.wait(ours.fileno())
            assert ours.recv(65536) == b""
