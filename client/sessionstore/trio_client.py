# The trio client: the op methods of all three clients (op_methods.py)
# and the async logic shared with the asyncio client (async_core.py), over a trio
# socket stream; one request in flight per client.
from __future__ import annotations

import contextlib
import math
from typing import Any

import trio

from .async_core import AsyncCore
from .errors import ConnectionLost, NoDaemon, Timeout
from .paths import checked_socket
from .replies import DEFAULT_TIMEOUT_S, RECEIVE_BYTES, answers_after_broken_send
from .wire.protocol import Refusal

_LOST = (OSError, Refusal, trio.BrokenResourceError, trio.ClosedResourceError)


class TrioClient(AsyncCore):
    def __init__(
        self, socket_path: str | None = None, *, timeout: float | None = DEFAULT_TIMEOUT_S
    ) -> None:
        super().__init__(socket_path, timeout=timeout)
        self._stream: trio.SocketStream | None = None
        self._lock = trio.Lock()

    async def __aenter__(self) -> TrioClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def connect(self) -> None:
        if self._stream is not None:
            return
        path = checked_socket(self._socket)
        try:
            self._stream = await trio.open_unix_socket(path)
        except OSError as error:
            raise NoDaemon(self.socket_path, error) from error
        self._new_connection()

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()

    async def _close_shielded(self) -> None:
        with trio.CancelScope(shield=True):
            await self.aclose()

    async def _receive_some(self) -> bytes:
        assert self._stream is not None
        try:
            return await self._stream.receive_some(RECEIVE_BYTES)
        except _LOST as error:
            raise ConnectionLost(str(error)) from error

    async def _sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    async def _answers_after_broken_send(self, count: int) -> list[Any] | None:
        """The daemon closed mid-send: its refusal may be waiting unread."""
        replies: list[dict[str, Any]] = []
        with contextlib.suppress(*_LOST, ConnectionLost, Refusal):
            while len(replies) < count:
                replies.append(await self._read_message())
        return answers_after_broken_send(replies, count)

    async def _send_raw(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        async with self._lock:
            await self.connect()
            try:
                with trio.fail_after(self.timeout if self.timeout is not None else math.inf):
                    return await self._exchange(requests)
            except trio.TooSlowError as error:
                await self._close_shielded()
                raise Timeout(f"no reply within {self.timeout} s") from error
            except (*_LOST, ConnectionLost) as error:
                await self._close_shielded()
                raise ConnectionLost(f"connection to {self.socket_path} lost: {error}") from error
            except BaseException:
                # Cancelled part way: the replies still on their way would answer the
                # next request, so the connection goes with this one.
                await self._close_shielded()
                raise

    async def _exchange(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        assert self._stream is not None
        data = b"".join(self._conn.encode(req) for req in requests)
        try:
            await self._stream.send_all(data)
        except _LOST:
            answered = await self._answers_after_broken_send(len(requests))
            if answered is None:
                raise
            await self.aclose()
            return answered
        return await self._replies(len(requests))
