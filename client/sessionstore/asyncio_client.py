# The asyncio client, for the frameworks that run on asyncio (LangGraph, the
# OpenAI Agents SDK): asyncio streams, no thread per call, the op methods of all
# three clients (op_methods.py) and the async logic shared with the trio client
# (async_core.py); one request in flight per client.
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from .async_core import AsyncCore
from .errors import ConnectionLost, NoDaemon, Timeout
from .paths import checked_socket
from .replies import (
    DEFAULT_TIMEOUT_S,
    RECEIVE_BYTES,
    answers_after_broken_send,
    closes_connection,
)
from .wire.protocol import Refusal


class AsyncClient(AsyncCore):
    def __init__(
        self, socket_path: str | None = None, *, timeout: float | None = DEFAULT_TIMEOUT_S
    ) -> None:
        super().__init__(socket_path, timeout=timeout)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def connect(self) -> None:
        if self._writer is not None:
            return
        path = checked_socket(self._socket)
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(
                path, limit=RECEIVE_BYTES
            )
        except OSError as error:
            raise NoDaemon(self.socket_path, error) from error
        self._new_connection()

    async def aclose(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _receive_some(self) -> bytes:
        assert self._reader is not None
        try:
            return await self._reader.read(RECEIVE_BYTES)
        except (OSError, Refusal) as error:
            raise ConnectionLost(str(error)) from error

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _exchange(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        assert self._writer is not None
        # Replies are read while the requests are still being sent: a daemon that refuses
        # one it cannot take answers and closes, and asyncio drops what it had not read
        # yet once a write fails.
        self._writer.write(b"".join(self._conn.encode(req) for req in requests))
        sending = asyncio.ensure_future(self._writer.drain())
        replies: list[dict[str, Any]] = []
        try:
            while len(replies) < len(requests):
                replies.append(await self._read_message())
                if closes_connection(replies[-1:]):  # nothing more comes on it
                    replies += [replies[-1]] * (len(requests) - len(replies))
        except (OSError, Refusal, ConnectionLost):
            answered = answers_after_broken_send(replies, len(requests))
            if answered is None:
                raise
            replies = answered
        except BaseException:
            sending.cancel()  # abandoned: the connection is closed, never drained
            raise
        with contextlib.suppress(OSError):
            await sending
        return replies

    async def _send_raw(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        async with self._lock:
            await self.connect()
            try:
                replies = await asyncio.wait_for(self._exchange(requests), self.timeout)
            except TimeoutError as error:
                self._abandon()
                raise Timeout(f"no reply within {self.timeout} s") from error
            except (OSError, Refusal, ConnectionLost) as error:
                await self.aclose()
                raise ConnectionLost(f"connection to {self.socket_path} lost: {error}") from error
            except BaseException:
                # Cancelled part way: the replies still on their way would answer the
                # next request, so the connection goes with this one.
                self._abandon()
                raise
            if closes_connection(replies):
                await self.aclose()
            return replies

    def _abandon(self) -> None:
        """Close at once, without waiting: the task may be cancelled while it waits."""
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.transport.abort()


class ClientPerLoop:
    """One AsyncClient for each event loop that uses an adapter: a client's streams
    belong to the loop that opened them (asyncio.run in a loop makes a loop each time).
    An adapter handed a client of the caller's uses that one, and leaves closing it to
    the caller."""

    def __init__(
        self, socket_path: str | None, timeout: float | None, given: AsyncClient | None = None
    ) -> None:
        self.socket_path = socket_path if given is None else given.socket_path
        self.timeout = timeout if given is None else given.timeout
        self._given = given
        self._clients: dict[asyncio.AbstractEventLoop, AsyncClient] = {}

    def current(self) -> AsyncClient:
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            for closed in [other for other in self._clients if other.is_closed()]:
                del self._clients[closed]
            client = AsyncClient(self.socket_path, timeout=self.timeout)
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Close the running loop's client (not one the caller handed in)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()
