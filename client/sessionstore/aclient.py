# The async client for trio: the same op methods as the blocking and asyncio
# clients (op_methods.py), one request in flight per client, and a watch()
# iterator that resumes with `since` after a lost connection.
from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import trio

from . import requests as r
from .client import (
    DEFAULT_TIMEOUT_S,
    MAX_RESPONSE_BYTES,
    RECEIVE_BYTES,
    WATCH_RETRY_S,
    _result,
    take_response,
)
from .errors import ConnectionLost
from .op_methods import OpMethods
from .paths import client_socket_path
from .protocol import Connection, Mode, ProtocolError
from .requests import UNSET, Call


class AsyncClient(OpMethods):
    def __init__(
        self, socket_path: str | None = None, *, timeout: float | None = DEFAULT_TIMEOUT_S
    ) -> None:
        self.socket_path = client_socket_path(socket_path)
        self.timeout = timeout
        self._stream: trio.SocketStream | None = None
        self._conn = Connection(max_message_bytes=MAX_RESPONSE_BYTES, mode=Mode.CBOR)
        self._lock = trio.Lock()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def connect(self) -> None:
        if self._stream is not None:
            return
        try:
            self._stream = await trio.open_unix_socket(self.socket_path)
        except OSError as error:
            raise ConnectionLost(f"cannot connect to {self.socket_path}: {error}") from error
        self._conn = Connection(max_message_bytes=MAX_RESPONSE_BYTES, mode=Mode.CBOR)

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()

    async def _read_message(self) -> dict[str, Any]:
        assert self._stream is not None
        while (message := take_response(self._conn)) is None:
            data = await self._stream.receive_some(RECEIVE_BYTES)
            if data:
                self._conn.receive_data(data)
            else:
                self._conn.receive_eof()
        return message

    async def send_raw(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Pipeline: send every request, then read as many responses, in order."""
        async with self._lock:
            await self.connect()
            assert self._stream is not None
            try:
                with trio.fail_after(self.timeout if self.timeout is not None else math.inf):
                    data = b"".join(self._conn.encode(req) for req in requests)
                    await self._stream.send_all(data)
                    return [await self._read_message() for _ in requests]
            except trio.TooSlowError as error:
                await self.aclose()
                raise ConnectionLost(f"no reply within {self.timeout} s") from error
            except (
                OSError,
                ProtocolError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
            ) as error:
                await self.aclose()
                raise ConnectionLost(f"connection to {self.socket_path} lost: {error}") from error

    async def run(self, call: Call) -> Any:
        return _result(call, (await self.send_raw([call.request]))[0])

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
    ) -> AsyncIterator[dict[str, Any]]:
        """Events in seq order, none skipped, across reconnects; Compacted when history is gone."""
        cursor = since
        failures = 0
        while True:
            watcher = AsyncClient(self.socket_path, timeout=None)
            try:
                request = r.make("watch", since=UNSET if cursor is None else cursor).request
                [reply] = await watcher.send_raw([request])
                _result(r.make("watch"), reply)
                if cursor is None:
                    cursor = reply["seq"]
                failures = 0
                while True:
                    try:
                        event = await watcher._read_message()
                    except (OSError, ProtocolError, trio.BrokenResourceError) as error:
                        raise ConnectionLost(str(error)) from error
                    if event.get("event") == "lagged":
                        cursor = event["resume_from"]
                        break
                    cursor = event["seq"]
                    yield event
            except ConnectionLost:
                if not reconnect:
                    raise
                await trio.sleep(WATCH_RETRY_S[min(failures, len(WATCH_RETRY_S) - 1)])
                failures += 1
            finally:
                with trio.CancelScope(shield=True):
                    await watcher.aclose()
