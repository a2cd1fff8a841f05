# What the trio and asyncio clients share above their transports: reading one
# response, running a Call, paging through ids, and a watch() that resumes with
# `since` after a lost connection or a `lagged` notice. A transport supplies
# connecting, sending, receiving bytes, sleeping and closing.
from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any, Self

from .async_op_methods import AsyncOpMethods
from .errors import ConnectionLost
from .paths import client_socket
from .replies import (
    DEFAULT_TIMEOUT_S,
    MAX_RESPONSE_BYTES,
    RESUMABLE,
    WatchResume,
    backup_ended,
    closes_connection,
    result_of,
    take_response,
)
from .reply_types import WatchEvent
from .requests import make
from .wire.protocol import Connection, Mode, Refusal


class AsyncCore(AsyncOpMethods):
    def __init__(
        self, socket_path: str | None = None, *, timeout: float | None = DEFAULT_TIMEOUT_S
    ) -> None:
        self._socket = client_socket(socket_path)
        self.socket_path = self._socket.path
        self.timeout = timeout
        self._conn = Connection(max_message_bytes=MAX_RESPONSE_BYTES, mode=Mode.CBOR)

    # -- the transport's part ------------------------------------------------------

    @contextmanager
    def timeout_of(self, seconds: float | None) -> Iterator[Self]:
        """The calls made in the with block wait at most `seconds` for their reply (None:
        without a limit); Timeout past it. The client's own timeout again after. Tasks
        that share the client share the block's timeout while it lasts."""
        before, self.timeout = self.timeout, seconds
        try:
            yield self
        finally:
            self.timeout = before

    async def connect(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def _receive_some(self) -> bytes:
        """Bytes from the daemon (b"" at its end); ConnectionLost when the socket fails."""
        raise NotImplementedError

    async def _sleep(self, seconds: float) -> None:
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------

    def _new_connection(self) -> None:
        self._conn = Connection(max_message_bytes=MAX_RESPONSE_BYTES, mode=Mode.CBOR)

    async def _read_message(self) -> dict[str, Any]:
        try:
            while (message := take_response(self._conn)) is None:
                data = await self._receive_some()
                if data:
                    self._conn.receive_data(data)
                else:
                    self._conn.receive_eof()
        except Refusal as error:  # a reply we cannot frame: this connection is done
            raise ConnectionLost(f"bad response from the daemon: {error}") from error
        return message

    async def _replies(self, count: int) -> list[dict[str, Any]]:
        """count replies; after one that closes the connection, it stands for the rest
        (nothing more comes), and the connection is dropped."""
        replies: list[dict[str, Any]] = []
        while len(replies) < count:
            replies.append(await self._read_message())
            if closes_connection(replies[-1:]):
                await self.aclose()
                return replies + [replies[-1]] * (count - len(replies))
        return replies

    async def iter_ids(self, prefix: str = "", *, page: int = 1000) -> AsyncIterator[str]:
        after: str | None = None
        while True:
            result = await self.list(prefix, after=after, limit=page)
            for session_id in result["ids"]:
                yield session_id
            after = result["next"]
            if after is None:
                return

    async def watch(
        self, since: int | None = None, *, reconnect: bool = True
    ) -> AsyncIterator[WatchEvent]:
        """Events in seq order, none skipped, across reconnects; Compacted when history is gone."""
        resume = WatchResume(since)
        while True:
            watcher = type(self)(self.socket_path, timeout=None)
            try:
                [reply] = await watcher._send_raw([resume.request()])
                resume.started(reply)
                while resume.deliver(event := await watcher._read_message()):
                    yield event
            except RESUMABLE:
                if not reconnect:
                    raise
                await self._sleep(resume.lost())
            finally:
                await watcher._close_shielded()

    async def backup(self) -> AsyncIterator[dict[str, Any]]:
        """The `backup` op's stream, as Client.backup: its header, then payload
        messages, then the end."""
        streamer = type(self)(self.socket_path, timeout=self.timeout)
        try:
            [header] = await streamer._send_raw([make("backup").request])
            result_of(make("backup"), header)
            yield header
            while True:
                message = await streamer._read_message()
                ended = backup_ended(message)
                yield message
                if ended:
                    return
        finally:
            await streamer._close_shielded()

    async def _close_shielded(self) -> None:
        await self.aclose()
