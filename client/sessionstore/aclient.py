# The async client for trio: the same ops as the blocking Client (both build
# their requests in requests.py), one request in flight per client, and a
# watch() iterator that resumes with `since` after a lost connection.
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import trio

from . import requests as r
from .client import MAX_RESPONSE_BYTES, RECEIVE_BYTES, WATCH_RETRY_S, _result, take_response
from .errors import ConnectionLost
from .paths import client_socket_path
from .protocol import Connection, Mode, ProtocolError
from .requests import UNSET, Call


class AsyncClient:
    def __init__(self, socket_path: str | None = None) -> None:
        self.socket_path = client_socket_path(socket_path)
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
        async with self._lock:
            await self.connect()
            assert self._stream is not None
            try:
                await self._stream.send_all(b"".join(self._conn.encode(req) for req in requests))
                return [await self._read_message() for _ in requests]
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

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        result: dict[str, Any] = await self.run(r.make(op, **args))
        return result

    # -- ops (see requests.py) -----------------------------------------------

    async def hello(self) -> Any:
        return await self.run(r.hello())

    async def ping(self) -> None:
        await self.run(r.ping())

    async def save(
        self, snapshot: dict[str, Any], *, expect: Any = UNSET, lease: Any = UNSET
    ) -> Any:
        return await self.run(r.save(snapshot, expect, lease))

    async def load(self, session_id: str) -> Any:
        return await self.run(r.load(session_id))

    async def load_with_meta(self, session_id: str) -> Any:
        return await self.run(r.load_with_meta(session_id))

    async def head(self, session_id: str) -> Any:
        return await self.run(r.head(session_id))

    async def exists(self, session_id: str) -> bool:
        return bool(await self.run(r.exists(session_id)))

    async def list(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> Any:
        return await self.run(r.list_ids(prefix, after, limit))

    async def delete(self, session_id: str, *, expect: Any = UNSET, lease: Any = UNSET) -> Any:
        return await self.run(r.delete(session_id, expect, lease))

    async def update(
        self,
        session_id: str,
        component: str,
        value: Any,
        *,
        expect: Any = UNSET,
        lease: Any = UNSET,
    ) -> Any:
        return await self.run(r.update(session_id, component, value, expect, lease))

    async def fork(
        self, session_id: str, new_session_id: str, workspace: Any, *, lease: Any = UNSET
    ) -> Any:
        return await self.run(r.fork(session_id, new_session_id, workspace, lease))

    async def checkpoint_put(
        self, kind: str, key: str, value: dict[str, Any], *, lease: Any = UNSET
    ) -> Any:
        return await self.run(r.checkpoint_put(kind, key, value, lease))

    async def checkpoint_get(self, kind: str, key: str) -> Any:
        return await self.run(r.checkpoint_get(kind, key))

    async def checkpoint_delete(self, kind: str, key: str, *, lease: Any = UNSET) -> bool:
        return bool(await self.run(r.checkpoint_delete(kind, key, lease)))

    async def lease_acquire(self, holder: str) -> Any:
        return await self.run(r.lease_acquire(holder))

    async def lease_get(self) -> Any:
        return await self.run(r.lease_get())

    async def lease_release(self, holder: str, epoch: int) -> bool:
        return bool(await self.run(r.lease_release(holder, epoch)))

    async def stats(self) -> Any:
        return await self.run(r.stats())

    async def verify(self) -> Any:
        return await self.run(r.verify())

    async def compact(self) -> Any:
        return await self.run(r.compact())

    async def watch(self, since: int | None = None) -> AsyncIterator[dict[str, Any]]:
        """Events in seq order, none skipped, across reconnects; Compacted when history is gone."""
        cursor = since
        failures = 0
        while True:
            watcher = AsyncClient(self.socket_path)
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
                await trio.sleep(WATCH_RETRY_S[min(failures, len(WATCH_RETRY_S) - 1)])
                failures += 1
            finally:
                with trio.CancelScope(shield=True):
                    await watcher.aclose()
