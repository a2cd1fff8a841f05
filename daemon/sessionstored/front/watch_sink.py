# A watch or backup stream's connection, as ops/watch.py's Sink: encoded messages
# out, and how much of what was sent the peer has not read yet.
from __future__ import annotations

import fcntl
import select
import struct
import termios
from collections.abc import Callable
from typing import Any

import trio


class SocketSink:
    """A watcher's connection: encoded messages out, and how much of them is unread."""

    def __init__(
        self, stream: trio.SocketStream, encode: Callable[[dict[str, Any]], bytes]
    ) -> None:
        self.stream = stream
        self.encode = encode
        self.sent_bytes = 0
        self._fd = stream.socket.fileno()

    async def send(self, message: dict[str, Any]) -> None:
        data = self.encode(message)
        await self.stream.send_all(data)
        self.sent_bytes += len(data)

    def unread_bytes(self) -> int:
        """Bytes sent that the peer has not read yet (Linux: SIOCOUTQ, as TIOCOUTQ)."""
        raw = fcntl.ioctl(self._fd, termios.TIOCOUTQ, b"\0" * 4)
        unread: int = struct.unpack("i", raw)[0]
        return unread

    def writable(self) -> bool:
        poller = select.poll()
        poller.register(self._fd, select.POLLOUT)
        return bool(poller.poll(0))

    async def wait_writable(self) -> None:
        await trio.lowlevel.wait_writable(self.stream.socket)
