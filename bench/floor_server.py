# The floor of the daemon's stack: the smallest trio server with the daemon's
# shape and none of its store. One task per connection on a trio SocketStream
# over the same kind of Unix socket; cbor2 decodes each request (a CBOR
# sequence, framed by the decoder itself); `ping` is answered at once; every
# other op goes to one writer task through a memory channel, which drains what
# is queued (group commit), hands the batch to one long-lived I/O thread that
# pwrites the requests' bytes into a preallocated, zero-filled file and
# fdatasyncs it once, and wakes the connections. No index, no checks, no
# canonical encoding: what the daemon spends beyond this is its own Python.
#
#   python -m bench.floor_server SOCKET DIRECTORY
from __future__ import annotations

import io
import os
import queue
import sys
import threading
from typing import Any

import cbor2
import outcome
import trio

RECEIVE_BYTES = 64 * 1024  # under glibc's mmap threshold: recv(n) allocates n first
QUEUE_DEPTH = 64
FILE_BYTES = 64 * 1024 * 1024  # preallocated at start; the writes wrap around
PAGE_BYTES = 4096


class FloorLog:
    """A preallocated file, zero-filled a page per write as the log's segments are, that
    batches are appended to (wrapping around at its end), each made durable by one
    fdatasync."""

    def __init__(self, directory: str) -> None:
        self.fd = os.open(os.path.join(directory, "floor.log"), os.O_RDWR | os.O_CREAT, 0o600)
        page = bytes(PAGE_BYTES)
        for _ in range(FILE_BYTES // PAGE_BYTES):
            os.write(self.fd, page)
        os.fsync(self.fd)
        self.offset = 0

    def append(self, data: bytes) -> int:
        if self.offset + len(data) > FILE_BYTES:
            self.offset = 0
        os.pwrite(self.fd, data, self.offset)
        self.offset += len(data)
        os.fdatasync(self.fd)
        return self.offset


class IoThread:
    def __init__(self, log: FloorLog) -> None:
        self.log = log
        self.token = trio.lowlevel.current_trio_token()
        self.calls: queue.SimpleQueue[tuple[bytes, trio.lowlevel.Task]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="floor-io", daemon=True).start()

    def _serve(self) -> None:
        while True:
            data, task = self.calls.get()
            result = outcome.capture(self.log.append, data)
            self.token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    async def call(self, data: bytes) -> int:
        self.calls.put((data, trio.lowlevel.current_task()))
        value: int = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        return value


class Job:
    __slots__ = ("data", "done", "seq")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.done = trio.Event()
        self.seq = 0


async def writer(receive: trio.MemoryReceiveChannel[Job], io_thread: IoThread) -> None:
    seq = 0
    async for first in receive:
        jobs = [first]
        while True:
            try:
                jobs.append(receive.receive_nowait())
            except trio.WouldBlock:
                break
        await io_thread.call(b"".join(job.data for job in jobs))
        for job in jobs:
            seq += 1
            job.seq = seq
            job.done.set()


async def connection(stream: trio.SocketStream, send: trio.MemorySendChannel[Job]) -> None:
    buffer = b""
    async with stream:
        while True:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                return
            buffer += data
            while buffer:
                fp = io.BytesIO(buffer)
                try:
                    request: Any = cbor2.CBORDecoder(fp).decode()
                except cbor2.CBORDecodeEOF:
                    break
                end = fp.tell()
                item, buffer = buffer[:end], buffer[end:]
                if request.get("op") == "ping":
                    reply: dict[str, Any] = {"ok": True}
                else:
                    job = Job(item)
                    await send.send(job)
                    await job.done.wait()
                    reply = {"ok": True, "seq": job.seq}
                await stream.send_all(cbor2.dumps(reply))


async def serve(socket_path: str, directory: str) -> None:
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(socket_path)
    sock.listen(512)
    send, receive = trio.open_memory_channel[Job](QUEUE_DEPTH)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer, receive, IoThread(FloorLog(directory)))
        listener = trio.SocketListener(sock)
        print("ready", flush=True)
        await trio.serve_listeners(
            lambda stream: connection(stream, send), [listener], handler_nursery=nursery
        )


if __name__ == "__main__":
    trio.run(serve, sys.argv[1], sys.argv[2])
