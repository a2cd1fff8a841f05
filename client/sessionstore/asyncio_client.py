# The asyncio client, for the frameworks that run on asyncio (LangGraph, the
# OpenAI Agents SDK): asyncio streams, no thread per call, the same op methods
# as the blocking and trio clients (op_methods.py), one request in flight per
# client, and a watch() iterator that resumes with `since` after a lost
# connection.
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

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
from .requests import UNSET, Call, make


class AsyncioClient(OpMethods):
    def __init__(
        self, socket_path: str | None = None, *, timeout: float | None = DEFAULT_TIMEOUT_S
    ) -> None:
        self.socket_path = client_socket_path(socket_path)
        self.timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._conn = Connection(max_message_bytes=MAX_RESPONSE_BYTES, mode=Mode.CBOR)
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> AsyncioClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def connect(self) -> None:
        if self._writer is not None:
            return
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(
                self.socket_path, limit=RECEIVE_BYTES
            )
        except OSError as error:
            raise ConnectionLost(f"cannot connect to {self.socket_path}: {error}") from error
        self._conn = Connection(max_message_bytes=MAX_RESPONSE_BYTES, mode=Mode.CBOR)

    async def aclose(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _read_message(self) -> dict[str, Any]:
        assert self._reader is not None
        while (message := take_response(self._conn)) is None:
            data = await self._reader.read(RECEIVE_BYTES)
            if data:
                self._conn.receive_data(data)
            else:
                self._conn.receive_eof()
        return message

    async def _exchange(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        assert self._writer is not None
        self._writer.write(b"".join(self._conn.encode(req) for req in requests))
        await self._writer.drain()
        return [await self._read_message() for _ in requests]

    async def send_raw(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Pipeline: send every request, then read as many responses, in order."""
        async with self._lock:
            await self.connect()
            try:
                return await asyncio.wait_for(self._exchange(requests), self.timeout)
            except TimeoutError as error:
                await self.aclose()
                raise ConnectionLost(f"no reply within {self.timeout} s") from error
            except (OSError, ProtocolError) as error:
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
            watcher = AsyncioClient(self.socket_path, timeout=None)
            try:
                request = make("watch", since=UNSET if cursor is None else cursor).request
                [reply] = await watcher.send_raw([request])
                _result(make("watch"), reply)
                if cursor is None:
                    cursor = reply["seq"]
                failures = 0
                while True:
                    try:
                        event = await watcher._read_message()
                    except (OSError, ProtocolError) as error:
                        raise ConnectionLost(str(error)) from error
                    if event.get("event") == "lagged":
                        cursor = event["resume_from"]
                        break
                    cursor = event["seq"]
                    yield event
            except ConnectionLost:
                if not reconnect:
                    raise
                await asyncio.sleep(WATCH_RETRY_S[min(failures, len(WATCH_RETRY_S) - 1)])
                failures += 1
            finally:
                await watcher.aclose()
