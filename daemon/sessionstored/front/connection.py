# One connection's life, as a task the Server (server.py) starts for it.
#
# The task reads requests and starts them. It starts every complete request that
# has arrived (a mutation's job goes to the writer at once, so pipelined saves share
# a batch), then reads again. Replies leave
# through the connection's outbox (outbox.py) in request order, each as soon
# as it and every reply before it are ready: a write's is sent by the writer
# as it finishes the job, without waking this task. A read is evaluated when
# it is reached, once every earlier write of the connection has finished (so
# it sees them) and before any later request is started (so it sees none
# after it). At most MAX_PIPELINED_REQUESTS replies wait in the outbox. A
# `watch` turns the rest of the connection into its event stream, which ends
# when the client closes. Measured (bench/instructions.py): one task instead of
# a reader, a responder and a channel between them, the socket used without
# trio's checkpoints (socket_io.py) and the outbox took a small write from
# 788,000 instructions to 528,000. On stop, every connection's read side is
# shut down: it answers what it has received, as at EOF, and closes.
#
# Before any of that: the peer's credentials decide its access (access.py), and
# past --max-connections a newcomer is turned away with `overloaded`. A refused
# peer's first request is answered with the error, in its own mode, and the
# connection closed. Idle connections cost a task and a buffer; a request
# that has started arriving must be complete within --request-timeout-seconds.
from __future__ import annotations

import contextlib
import enum
import logging
import time
from typing import Any

import trio

from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import (
    END_OF_STREAM,
    MORE_WORK,
    NEED_DATA,
    Connection,
    Deferred,
    Mode,
    RawCBOR,
    Refusal,
    Request,
    encode,
    error_response,
    parse_request,
    refusal_response,
)

from ..access import Access, peer_of
from ..config import Config
from ..ops import ARGUMENTS, DOCUMENTS, PREPARERS, OpContext, dispatch
from ..ops.prepare import prepare_large
from ..ops.steps import Exclusive, Read, ReadInThread, Step, Stream, Write
from ..workers.offload import (
    MAX_REQUEST_ITEMS,
    OFFLOAD_ABOVE_BYTES,
    OFFLOAD_CANONICAL_ABOVE_BYTES,
    WorkerLost,
)
from ..writer.jobs import Job
from ..writer.writer import Writer
from .metrics import NOT_A_REQUEST, Metrics
from .outbox import Outbox
from .readiness import Readiness
from .socket_io import SocketIO
from .watch_sink import SocketSink

log = logging.getLogger("sessionstored.server")

RECEIVE_BYTES = 256 * 1024
# bytes of a large item walked per event-loop step: ~15 ms at worst (dense small maps)
WALK_BUDGET_BYTES = 32 * 1024
MAX_PIPELINED_REQUESTS = 128
PEER_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


class ConnectionLoop:
    """Serves each connection in a task of its own (the Server, server.py, starts one per
    connection it accepts, with serve()), and counts what became of them."""

    def __init__(self, config: Config, ops: OpContext, writer: Writer, metrics: Metrics) -> None:
        self.config = config
        self.ops = ops
        self.writer = writer
        self.metrics = metrics
        self.connections = 0
        self.connections_total = 0
        self.refused_overloaded = 0
        self.refused_unauthorized = 0
        self.timed_out_requests = 0
        self.streams: set[trio.SocketStream] = set()
        self.readiness = Readiness()  # its task, run(), runs while connections are served

    def _count_answer(self, step: Step, response: dict[str, Any]) -> None:
        error = response.get("error")
        code = error.get("code", "internal") if isinstance(error, dict) else "ok"
        op = step.request.op if step.request is not None else NOT_A_REQUEST
        self.metrics.request(op, str(code), time.perf_counter() - step.started)

    async def serve(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self.connections_total += 1
        conn = Connection(
            max_message_bytes=self.config.max_request_bytes,
            received="request",
            order_maps=True,
            defer_above_bytes=OFFLOAD_ABOVE_BYTES,
            walk_budget_bytes=WALK_BUDGET_BYTES,
            max_items=MAX_REQUEST_ITEMS,
            documents=DOCUMENTS,
            defer_canonical_above_bytes=OFFLOAD_CANONICAL_ABOVE_BYTES,
        )
        peer = peer_of(stream.socket)  # type: ignore[arg-type]
        access = self.config.access.decide(peer) if peer is not None else Access.NONE
        if self.connections > self.config.max_connections:
            self.refused_overloaded += 1
            await self._refuse(
                stream, conn, ErrorCode.OVERLOADED, "too many connections; try again"
            )
            return
        if access is Access.NONE:
            self.refused_unauthorized += 1
            who = f"uid={peer.uid} gid={peer.gid} pid={peer.pid}" if peer else "unknown peer"
            log.warning("refused connection from %s: not allowed", who)
            await self._refuse(
                stream, conn, ErrorCode.UNAUTHORIZED, f"{who} may not use this daemon"
            )
            return
        self.streams.add(stream)
        sock = SocketIO(stream, self.readiness)
        try:
            await self._serve(stream, sock, conn, access)
        except BaseExceptionGroup as group:  # a watch's tasks report in a group
            self._ended_in(group)
        except PEER_GONE:
            pass
        except Exception as error:  # our bug: it may cost this connection, never the daemon
            self.ops.internal_error(None, error, "serving a connection")
        finally:
            sock.detach()
            self.streams.discard(stream)
            await self._closed(stream)

    def _ended_in(self, group: BaseExceptionGroup[BaseException]) -> None:
        """What ended a connection, reported in a group: the peer going away is no news,
        our bug is reported, and anything else (a cancellation) goes on up."""
        _gone, rest = group.split(PEER_GONE)
        ours, other = rest.split(Exception) if rest is not None else (None, None)
        if ours is not None:
            self.ops.internal_error(None, ours, "serving a connection")
        if other is not None:
            raise other

    async def _closed(self, stream: trio.SocketStream) -> None:
        self.connections -= 1
        with contextlib.suppress(*PEER_GONE):
            await stream.aclose()

    async def _refuse(
        self, stream: trio.SocketStream, conn: Connection, code: ErrorCode, message: str
    ) -> None:
        """Answer the peer's first request with the error, in its own mode, and close."""
        try:
            with trio.move_on_after(self.config.request_timeout_s):
                request = None
                while True:
                    try:
                        item = conn.next_message()
                    except Refusal:
                        break
                    if item is END_OF_STREAM:
                        break
                    if item is MORE_WORK:  # a large first item, still being walked
                        await trio.sleep(0)
                        continue
                    if item is not NEED_DATA:
                        with contextlib.suppress(Refusal):
                            request = parse_request(item)
                        break
                    data = await stream.receive_some(RECEIVE_BYTES)
                    if data:
                        conn.receive_data(data)
                    else:
                        conn.receive_eof()
                await stream.send_all(conn.encode(error_response(request, code, message)))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await self._closed(stream)

    async def _serve(
        self, stream: trio.SocketStream, sock: SocketIO, conn: Connection, access: Access
    ) -> None:
        """Read requests and start each; every reply goes out through the outbox as soon
        as it and the replies before it are ready. Every complete request that has
        arrived is started before the connection waits again, so pipelined writes share a
        batch."""
        async with trio.open_nursery() as nursery:
            outbox = Outbox(sock, conn.encode, self.ops.internal_error, nursery, self._count_answer)
            try:
                await self._requests(stream, sock, conn, access, outbox)
            finally:
                outbox.closed = True  # before the socket is: a later job sends nothing

    async def _requests(
        self,
        stream: trio.SocketStream,
        sock: SocketIO,
        conn: Connection,
        access: Access,
        outbox: Outbox,
    ) -> None:
        partial_since: float | None = None
        while True:
            handled = 0  # requests this round: just one, and the client waits for its reply
            while (request := await self._take_request(conn, outbox)) is not _Turn.READ_MORE:
                if request is _Turn.CLOSE:
                    return
                if request is _Turn.NEXT:
                    continue
                handled += 1
                if not await self._start(dispatch(self.ops, request, access), stream, conn, outbox):
                    return
            if not conn.buffered:
                partial_since = None
            elif partial_since is None:
                partial_since = trio.current_time()
            if not await self._receive(sock, conn, outbox, partial_since, try_first=handled != 1):
                return

    async def _take_request(self, conn: Connection, outbox: Outbox) -> Request | _Turn:
        """The next whole request the connection holds; a refusal is answered here."""
        if conn.idle:  # the common case after a request: skip the framing layers
            return _Turn.READ_MORE
        try:
            message = conn.next_message()
        except Refusal as refusal:
            return await self._answer_refusal(conn, outbox, refusal)
        if message is NEED_DATA:
            return _Turn.READ_MORE
        if message is MORE_WORK:  # a large item is being walked: let others run
            await trio.sleep(0)
            return _Turn.NEXT
        if message is END_OF_STREAM:
            await outbox.wait_sent()
            return _Turn.CLOSE
        if isinstance(message, Deferred):
            prepared = await self._prepare_large(message)
            if isinstance(prepared, Refusal):
                return await self._answer_refusal(conn, outbox, prepared)
            return prepared
        try:
            return parse_request(message, canonical_hint=conn.last_hint)
        except Refusal as refusal:
            return await self._answer_refusal(conn, outbox, refusal)

    async def _answer_refusal(self, conn: Connection, outbox: Outbox, refusal: Refusal) -> _Turn:
        self.metrics.request(NOT_A_REQUEST, str(refusal.code), 0.0)  # no op: it never became one
        outbox.add_reply(_refusal(conn, refusal))
        if refusal.fatal:  # a framing error: nothing after it can be read
            await outbox.wait_sent()
            return _Turn.CLOSE
        return _Turn.NEXT

    async def _start(
        self, step: Step, stream: trio.SocketStream, conn: Connection, outbox: Outbox
    ) -> bool:
        """Start the step, in the connection's order; False once the connection is a
        watch's stream, and done taking requests."""
        started = time.perf_counter()
        if isinstance(step, ReadInThread):  # the step it builds is the one answered
            step = await trio.to_thread.run_sync(step.build)
        step.started = started
        if isinstance(step, (Write, Exclusive)):
            outbox.add_job(step)
            if not self.writer.submit(step.job):
                await self._enqueue(step.job)
        elif isinstance(step, Read):
            # it sees every earlier write of this connection, and none after it:
            # those are started only once it has been evaluated
            await outbox.wait_jobs_done()
            outbox.add_reply(await self._answer(conn, step))
        elif isinstance(step, Stream):
            await outbox.wait_sent()
            await self._stream(stream, conn, step)
            return False
        else:
            outbox.add_reply(await self._answer(conn, step))
        if len(outbox) >= MAX_PIPELINED_REQUESTS:
            await outbox.wait_sent()
        return True

    async def _receive(
        self,
        sock: SocketIO,
        conn: Connection,
        outbox: Outbox,
        partial_since: float | None,
        *,
        try_first: bool,
    ) -> bool:
        """More bytes into the connection; False when a started request took too long
        to complete (slowloris): its refusal is sent and the connection closes."""
        if partial_since is None:
            data: bytes | None = await sock.receive(RECEIVE_BYTES, try_first=try_first)
        else:
            data = None
            with trio.move_on_at(partial_since + self.config.request_timeout_s):
                data = await sock.receive(RECEIVE_BYTES)
            if data is None:
                self.timed_out_requests += 1
                text = f"request not complete after {self.config.request_timeout_s:g} s"
                outbox.add_reply(_refusal(conn, Refusal(ErrorCode.BAD_REQUEST, text)))
                await outbox.wait_sent()
                return False
        if data:
            conn.receive_data(data)
        else:
            conn.receive_eof()
        return True

    async def _enqueue(self, job: Job) -> None:
        """The writer's queue was full: wait for room (a slow disk slows its clients)."""
        try:
            await self.writer.enqueue(job)
        except trio.Cancelled:
            job.fail(ErrorCode.SHUTTING_DOWN, "the daemon is stopping")
            raise

    async def _resolve(self, step: Step) -> dict[str, Any]:
        try:
            return await step.resolve()
        except Exception as error:  # our bug, not the client's: report it, keep serving
            return self.ops.internal_error(step.request, error, "answering")

    async def _answer(self, conn: Connection, step: Step) -> bytes:
        """A read's (or a refusal's) reply, encoded."""
        response = await self._resolve(step)
        self._count_answer(step, response)
        try:
            return await self._encode(conn, response)
        except Exception as error:  # a reply we cannot encode is our bug too
            return conn.encode(self.ops.internal_error(step.request, error, "encoding"))

    async def _stream(self, stream: trio.SocketStream, conn: Connection, step: Stream) -> None:
        """A watch: the connection is its event stream until either side ends it."""
        async with trio.open_nursery() as nursery:

            async def until_closed() -> None:
                await self._wait_for_close(stream)  # a watching connection takes no requests
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_closed)
            await step.run(SocketSink(stream, conn.encode))
            nursery.cancel_scope.cancel()

    async def _prepare_large(self, item: Deferred) -> Request | Refusal:
        """Decode a large item and do its op's heavy part in a worker process: only this
        connection waits for it."""
        try:
            return await self.ops.offload.run(
                prepare_large,
                item.data,
                item.mode,
                max_request_bytes=self.config.max_request_bytes,
                max_snapshot_bytes=self.config.max_snapshot_bytes,
                small_argument_bytes=OFFLOAD_ABOVE_BYTES,
                arguments=ARGUMENTS,
                documents=DOCUMENTS,
                preparers=PREPARERS,
            )
        except WorkerLost as error:
            log.warning("a worker died decoding a %d-byte request: %s", len(item.data), error)
            message = "the request needs more memory to decode than allowed"
            return Refusal(ErrorCode.TOO_LARGE, message)

    async def _encode(self, conn: Connection, response: dict[str, Any]) -> bytes:
        """A reply's bytes; a large one in JSON is encoded in a worker (CBOR splices bytes)."""
        if conn.mode is Mode.JSON and raw_bytes(response) > OFFLOAD_ABOVE_BYTES:
            return await self.ops.offload.run(encode, response, Mode.JSON)
        return conn.encode(response)

    @staticmethod
    async def _wait_for_close(stream: trio.SocketStream) -> None:
        while await stream.receive_some(RECEIVE_BYTES):
            pass  # a watching connection takes no further requests


def _refusal(conn: Connection, refusal: Refusal) -> bytes:
    closing = {"closing": True} if refusal.fatal else {}  # the client drops the connection
    reply = refusal_response(None, refusal, **closing)
    return conn.encode(reply)


class _Turn(enum.Enum):
    """What a connection does next when _take_request has no request for it."""

    READ_MORE = "read more bytes"
    NEXT = "take the next message"
    CLOSE = "close the connection"


def raw_bytes(value: Any) -> int:
    """The stored bytes a reply carries, wherever they are in it (a load's snapshot, every
    value of a checkpoint_scan): what its JSON encoding costs grows with them."""
    if isinstance(value, RawCBOR):
        return len(value.data)
    if isinstance(value, dict):
        return sum(raw_bytes(item) for item in value.values())
    if isinstance(value, list):
        return sum(raw_bytes(item) for item in value)
    return 0
