# Where a save's CPU goes, against the floors of the daemon's own stack: the same
# 64 clients sending the same pre-encoded 4 KiB saves to two bare trio servers
# and to sessionstored, in one run, with each server's CPU per request from
# /proc. Both bare servers frame each request with the compiled helper's walk
# (no decode), group-commit what is queued with one pwrite and one fdatasync in
# a thread of their own (woken back through an eventfd, as the daemon's writer
# is) and answer {"ok": true, "seq": n}. They differ only in how they read:
#   task per connection  each connection a trio task waiting on its socket, as
#                        sessionstored's connections are;
#   one task, epoll set  one task waits on an epoll set of every connection (one
#                        fd to trio) and drains every ready socket per wake-up,
#                        as Redis's event loop does.
# What sessionstored spends beyond them is its own Python: checks, the index,
# the log's records, watch history, metrics. Its `ping` at 64 clients, last, is
# what a request costs it before any of that (framing, dispatch, the reply). Then
# each again with one client: a lone save's CPU and its p50 round trip. Where
# the daemon runs compiled (sessionstore/build.py), both rows again with the same
# source interpreted. Each thread's CPU is given with its part in the kernel.
#
#   python -m bench.floor_shapes [--dir DIR] [--seconds S]
from __future__ import annotations

import contextlib
import os
import queue
import select
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import cbor2
import trio

from sessionstore import build
from sessionstore.wire import cbor_bytes

from .cpu import FloorServer, measure
from .floor_server import FloorLog

SHAPES = ("task per connection", "one task, epoll set")
CLIENTS = 64
REQUEST = "save 4 KiB"
PING = "sessionstored, ping"  # the row of its pings
LONE = ", 1 client"  # the suffix of a row with one client instead of CLIENTS
RECEIVE_BYTES = 256 * 1024
MAX_DEPTH = 64
MAX_REQUEST_BYTES = 1 << 30


class _Disk:
    """The floor server's log (floor_server.FloorLog), appended to in a thread; the
    caller waits on an eventfd."""

    def __init__(self, directory: str) -> None:
        self.log = FloorLog(directory)
        self.done = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.calls: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            self.log.append(self.calls.get())
            os.eventfd_write(self.done, 1)

    async def write(self, data: bytes) -> None:
        self.calls.put(data)
        while True:
            await trio.lowlevel.wait_readable(self.done)
            try:
                os.eventfd_read(self.done)
            except BlockingIOError:
                continue
            return


class _Server:
    def __init__(self, directory: str) -> None:
        self.disk = _Disk(directory)
        self.queued: list[tuple[socket.socket, bytes]] = []
        self.wake = trio.Event()
        self.buffer = bytearray(RECEIVE_BYTES)
        self.seq = 0

    def received(self, sock: socket.socket, inbox: bytearray) -> bool:
        """Take what the socket holds into inbox, queue each whole request; False at EOF."""
        try:
            count = sock.recv_into(self.buffer)
        except BlockingIOError:
            return True
        if not count:
            return False
        inbox += memoryview(self.buffer)[:count]
        while inbox:
            status, _, end = cbor_bytes.walk(inbox, 0, MAX_REQUEST_BYTES, MAX_DEPTH, 2**62)
            if status == cbor_bytes.INCOMPLETE:
                break
            if status not in (cbor_bytes.CANONICAL, cbor_bytes.VALID):
                raise SystemExit(f"floor server: not a CBOR request ({status})")
            self.queued.append((sock, bytes(inbox[:end])))
            del inbox[:end]
            self.wake.set()
        return True

    async def commit(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            batch, self.queued = self.queued, []
            await self.disk.write(b"".join(request for _, request in batch))
            for sock, _ in batch:
                self.seq += 1
                with contextlib.suppress(OSError):  # the client went away
                    sock.send(cbor2.dumps({"ok": True, "seq": self.seq}))

    async def per_connection(self, sock: socket.socket) -> None:
        inbox = bytearray()
        with sock:
            while True:
                await trio.lowlevel.wait_readable(sock)
                if not self.received(sock, inbox):
                    return

    async def accept(self, listener: socket.socket, nursery: trio.Nursery) -> None:
        while True:
            await trio.lowlevel.wait_readable(listener)
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                continue
            sock.setblocking(False)
            nursery.start_soon(self.per_connection, sock)

    async def epoll_set(self, listener: socket.socket) -> None:
        ready = select.epoll()
        ready.register(listener.fileno(), select.EPOLLIN)
        connections: dict[int, tuple[socket.socket, bytearray]] = {}
        while True:
            await trio.lowlevel.wait_readable(ready.fileno())
            for fd, _ in ready.poll(0):
                if fd == listener.fileno():
                    try:
                        sock, _ = listener.accept()
                    except BlockingIOError:
                        continue
                    sock.setblocking(False)
                    connections[sock.fileno()] = (sock, bytearray())
                    ready.register(sock.fileno(), select.EPOLLIN)
                    continue
                sock, inbox = connections[fd]
                if not self.received(sock, inbox):
                    ready.unregister(fd)
                    del connections[fd]
                    sock.close()
            await trio.lowlevel.checkpoint()  # the writer and its replies run between passes


async def serve(shape: str, socket_path: str, directory: str) -> None:
    server = _Server(directory)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(512)
    listener.setblocking(False)
    print("ready", flush=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.commit)
        if shape == SHAPES[0]:
            nursery.start_soon(server.accept, listener, nursery)
        else:
            nursery.start_soon(server.epoll_set, listener)


def run(daemon_factory: Any, workdir: Path, seconds: float) -> dict[str, Any]:
    """CPU per 4 KiB save at 64 clients, and at one: each bare shape, then sessionstored."""
    results: dict[str, Any] = {}
    for shape in SHAPES:
        directory = workdir / shape.replace(" ", "-").replace(",", "")
        directory.mkdir()
        server = FloorServer(directory, "bench.floor_shapes", "serve", shape)
        try:
            for row, clients in ((shape, CLIENTS), (f"{shape}{LONE}", 1)):
                results[row] = measure(server.proc.pid, server.socket, REQUEST, clients, seconds)
                print(f"floor shapes: {row}: {results[row]}", flush=True)
        finally:
            server.stop()
    for suffix, env in _builds():
        daemon_dir = workdir / f"sessionstored{suffix.replace(', ', '-')}"
        daemon_dir.mkdir()
        daemon = daemon_factory(daemon_dir, env=env)
        rows = [
            (f"sessionstored{suffix}", REQUEST, CLIENTS),
            (f"{PING}{suffix}", "ping", CLIENTS),
            (f"sessionstored{suffix}{LONE}", REQUEST, 1),
        ]
        try:
            for row, request, clients in rows:
                results[row] = measure(daemon.proc.pid, daemon.socket, request, clients, seconds)
                print(f"floor shapes: {row}: {results[row]}", flush=True)
        finally:
            daemon.stop()
    return results


def _builds() -> list[tuple[str, dict[str, str]]]:
    """The daemon as it runs here, and where that is the compiled build, also the same
    source interpreted (sessionstore/build.py): the rows' suffix and environment."""
    import sessionstored  # noqa: F401 - its import decides its build

    if build.running("sessionstored") != build.COMPILED:
        return [("", {})]
    return [("", {}), (", interpreted", {build.ENVIRONMENT_VARIABLE: build.INTERPRETED})]


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        shape, socket_path, directory = sys.argv[2:5]
        trio.run(serve, shape, socket_path, directory)
        return
    from .plots import write_floor_shapes
    from .standalone import run_alone

    run_alone("python -m bench.floor_shapes", run, 5.0, write_floor_shapes)


if __name__ == "__main__":
    main()
