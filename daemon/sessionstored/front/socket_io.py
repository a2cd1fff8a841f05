# A connection's socket as the request loop uses it: the non-blocking call is
# made first, and a wait happens only when it would block: for bytes to read,
# on the daemon's one set of connections (readiness.py); for room to send, on
# trio. trio's
# SocketStream passes a checkpoint (a pass of the scheduler) on every call,
# even one that succeeds at once; a request costs a receive and a send, so
# that is two passes per request of the six a small write took
# (bench/instructions.py counts what it costs with callgrind). Fairness is
# kept: a receive that finds data without waiting still yields once, so a
# client that keeps its connection full cannot hold the loop.
from __future__ import annotations

import socket

import trio

from .readiness import Readiness

# Python's recv(n) allocates n bytes before it knows how many arrive, and a 256
# KiB allocation costs more than the call itself (measured here: 30 us per 4 KiB
# received, against 6 with recv_into). So every connection receives into this one
# buffer, and only what arrived is copied out, before anything else runs on the
# event loop.
RECEIVE_BUFFER_BYTES = 256 * 1024
_buffer = bytearray(RECEIVE_BUFFER_BYTES)
_view = memoryview(_buffer)


class SocketIO:
    def __init__(self, stream: trio.SocketStream, readiness: Readiness) -> None:
        # a second handle on the stream's descriptor, detached (never closed) at the end
        self._fd = stream.socket.fileno()
        self._sock = socket.socket(fileno=self._fd)
        self._sock.setblocking(False)
        self._readiness = readiness
        readiness.register(self._fd)

    async def receive(self, max_bytes: int, *, try_first: bool = True) -> bytes:
        """Bytes from the peer, b"" at its EOF; BrokenResourceError if it reset.
        try_first=False: wait for readiness before the first try, when the peer is
        unlikely to have sent more yet (it waits for a reply): a receive that would only
        fail costs a system call, 5-10 us here."""
        if try_first:
            try:
                data = self._recv(max_bytes)
            except BlockingIOError:
                pass
            except OSError as error:
                raise trio.BrokenResourceError(f"socket connection broken: {error}") from error
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()  # found without waiting: yield
                return data
        while True:
            await self._readiness.wait(self._fd)
            try:
                return self._recv(max_bytes)
            except BlockingIOError:
                continue
            except OSError as error:
                raise trio.BrokenResourceError(f"socket connection broken: {error}") from error

    def _recv(self, max_bytes: int) -> bytes:
        room = min(max_bytes, RECEIVE_BUFFER_BYTES)
        received = self._sock.recv_into(_buffer, room)
        if received == room:  # less would mean the socket was emptied
            self._readiness.more_to_read(self._fd)
        return bytes(_view[:received])

    def try_send(self, data: bytes | memoryview) -> int:
        """Send what the socket takes now, without waiting: the number of bytes sent."""
        try:
            return self._sock.send(data)
        except BlockingIOError:
            return 0
        except OSError as error:
            raise trio.BrokenResourceError(f"socket connection broken: {error}") from error

    async def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            sent = self.try_send(view)
            if not sent:
                await trio.lowlevel.wait_writable(self._sock)
            view = view[sent:]

    def detach(self) -> None:
        """Before the stream closes the descriptor."""
        self._readiness.unregister(self._fd)
        self._sock.detach()
