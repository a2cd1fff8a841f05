# The daemon's one epoll set for its connections, over real socket pairs: a parked
# connection is woken by the bytes its peer sends; bytes that arrive while their
# connection is busy make its next wait return at once; nothing is missed between a
# receive that found nothing and the next wait; a cancelled waiter is let go; and
# a socket taken out of the set wakes nothing.
from __future__ import annotations

import socket

import trio
import trio.testing

from sessionstored.front.readiness import Readiness


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


async def test_a_parked_connection_wakes_when_its_peer_sends() -> None:
    readiness = Readiness()
    ours, theirs = _pair()
    readiness.register(ours.fileno())
    woken = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(readiness.run)
        await readiness.wait(ours.fileno())  # the first wait: a receive is tried at once
        assert _drain(ours) == b""

        async def waiter() -> None:
            await readiness.wait(ours.fileno())
            woken.set()

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert not woken.is_set()
        theirs.send(b"request")
        await woken.wait()
        assert _drain(ours) == b"request"
        nursery.cancel_scope.cancel()


async def test_bytes_that_arrive_while_busy_make_the_next_wait_return_at_once() -> None:
    readiness = Readiness()
    ours, theirs = _pair()
    readiness.register(ours.fileno())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(readiness.run)
        await readiness.wait(ours.fileno())
        assert _drain(ours) == b""
        theirs.send(b"while busy")
        await trio.testing.wait_all_tasks_blocked()  # the set's task marks it ready
        with trio.fail_after(5):
            await readiness.wait(ours.fileno())
        assert _drain(ours) == b"while busy"
        nursery.cancel_scope.cancel()


async def test_every_send_after_a_receive_wakes_again() -> None:
    readiness = Readiness()
    ours, theirs = _pair()
    readiness.register(ours.fileno())
    received = b""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(readiness.run)
        for number in range(50):
            theirs.send(b"%d," % number)
            with trio.fail_after(5):
                while True:
                    await readiness.wait(ours.fileno())
                    chunk = _drain(ours)
                    if chunk:
                        break
            received += chunk
        nursery.cancel_scope.cancel()
    assert received == b"".join(b"%d," % n for n in range(50))


async def test_a_cancelled_waiter_is_let_go_and_the_socket_stays_watched() -> None:
    readiness = Readiness()
    ours, theirs = _pair()
    readiness.register(ours.fileno())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(readiness.run)
        await readiness.wait(ours.fileno())
        scope = trio.CancelScope()

        async def cancelled_waiter() -> None:
            with scope:
                await readiness.wait(ours.fileno())

        nursery.start_soon(cancelled_waiter)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert scope.cancelled_caught
        theirs.send(b"after")
        with trio.fail_after(5):
            await readiness.wait(ours.fileno())
        assert _drain(ours) == b"after"
        nursery.cancel_scope.cancel()


async def test_a_socket_out_of_the_set_wakes_nothing_and_can_be_closed() -> None:
    readiness = Readiness()
    ours, _theirs = _pair()
    other, other_peer = _pair()
    readiness.register(ours.fileno())
    readiness.register(other.fileno())
    readiness.unregister(ours.fileno())
    ours.close()
    readiness.unregister(ours.fileno())  # twice, and after the close: no error
    async with trio.open_nursery() as nursery:
        nursery.start_soon(readiness.run)
        await readiness.wait(other.fileno())
        other_peer.send(b"x")
        with trio.fail_after(5):
            await readiness.wait(other.fileno())
        assert _drain(other) == b"x"
        nursery.cancel_scope.cancel()
