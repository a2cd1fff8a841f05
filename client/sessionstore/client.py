# The blocking client: one Unix socket, stdlib only, the shared sans-IO
# protocol for framing. Every wire error becomes its typed exception.
from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Sequence
from typing import Any

from . import requests as r
from .errors import ConnectionLost, NoDaemon, SessionStoreError, error_from_wire
from .op_methods import OpMethods
from .paths import checked_socket, client_socket
from .protocol import END_OF_STREAM, NEED_DATA, Connection, Mode, ProtocolError
from .requests import UNSET, Call

# what one recv asks for: Python allocates that much before it knows how much
# arrives, and above glibc's mmap threshold (128 KiB) that costs more than the call
RECEIVE_BYTES = 64 * 1024
DEFAULT_TIMEOUT_S = 60.0
MAX_RESPONSE_BYTES = 1024 * 1024 * 1024
WATCH_RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


def take_response(conn: Connection) -> dict[str, Any] | None:
    """The next response, or None when more bytes are needed."""
    message = conn.next_message()
    if message is END_OF_STREAM:
        raise ConnectionLost("the daemon closed the connection")
    if message is NEED_DATA:
        return None
    if not isinstance(message, dict):
        raise ConnectionLost(f"malformed response {message!r}")
    return message


def answers_after_broken_send(replies: list[dict[str, Any]], count: int) -> list[Any] | None:
    """The daemon closed while requests were still being sent. It does that after
    refusing one it cannot take (too_large, a framing error), so the replies read after
    the broken send may hold that refusal: then they stand for the `count` requests,
    the refusal for those it cut off. None when none of them is a refusal."""
    refusals = [reply for reply in replies if reply.get("ok") is not True]
    if not refusals:
        return None
    return replies + [refusals[-1]] * (count - len(replies))


def _result(call: Call, reply: dict[str, Any]) -> Any:
    if reply.get("ok") is True:
        return call.result(reply)
    raise error_from_wire(reply.get("error"))


def _results(calls: Sequence[Call], replies: list[dict[str, Any]]) -> list[Any]:
    return [_result(call, reply) for call, reply in zip(calls, replies, strict=True)]


class Client(OpMethods):
    def __init__(
        self, socket_path: str | None = None, *, timeout: float | None = DEFAULT_TIMEOUT_S
    ) -> None:
        self._socket = client_socket(socket_path)
        self.socket_path = self._socket.path
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._conn = Connection(max_message_bytes=MAX_RESPONSE_BYTES, mode=Mode.CBOR)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def connect(self) -> None:
        if self._sock is not None:
            return
        path = checked_socket(self._socket)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(path)
        except OSError as error:
            sock.close()
            raise NoDaemon(path, error) from error
        self._sock = sock
        self._conn = Connection(max_message_bytes=MAX_RESPONSE_BYTES, mode=Mode.CBOR)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- raw requests --------------------------------------------------------

    def send_raw(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Pipeline: send every request, then read as many responses, in order."""
        self.connect()
        assert self._sock is not None
        try:
            try:
                self._sock.sendall(b"".join(self._conn.encode(req) for req in requests))
            except (BrokenPipeError, ConnectionResetError):
                answered = answers_after_broken_send(
                    self._replies_left(len(requests)), len(requests)
                )
                if answered is None:
                    raise
                self.close()
                return answered
            return [self._read_message() for _ in requests]
        except (OSError, ProtocolError) as error:
            self.close()
            raise ConnectionLost(f"connection to {self.socket_path} lost: {error}") from error

    def _replies_left(self, count: int) -> list[dict[str, Any]]:
        """What the daemon answered before it closed (at most count replies)."""
        replies: list[dict[str, Any]] = []
        try:
            while len(replies) < count:
                replies.append(self._read_message())
        except (OSError, ProtocolError, ConnectionLost):
            pass
        return replies

    def _read_message(self) -> dict[str, Any]:
        assert self._sock is not None
        while (message := take_response(self._conn)) is None:
            data = self._sock.recv(RECEIVE_BYTES)
            if data:
                self._conn.receive_data(data)
            else:
                self._conn.receive_eof()
        return message

    def run(self, call: Call) -> Any:
        return _result(call, self.send_raw([call.request])[0])

    def run_all(self, calls: Sequence[Call]) -> list[Any]:
        """Several calls pipelined (one round trip); the first failure is raised."""
        return _results(calls, self.send_raw([call.request for call in calls]))

    def iter_ids(self, prefix: str = "", *, page: int = 1000) -> Iterator[str]:
        after: str | None = None
        while True:
            result = self.list(prefix, after=after, limit=page)
            yield from result["ids"]
            after = result["next"]
            if after is None:
                return

    def watch(
        self, since: int | None = None, *, reconnect: bool = True
    ) -> Iterator[dict[str, Any]]:
        """Events in seq order, none skipped. Resumes with `since` after a lost connection
        or a `lagged` notice; raises Compacted when the history it needs is gone."""
        cursor = since
        failures = 0
        while True:
            watcher = Client(self.socket_path, timeout=None)
            try:
                reply = watcher.send_raw(
                    [r.make("watch", since=UNSET if cursor is None else cursor).request]
                )[0]
                _result(r.make("watch"), reply)
                if cursor is None:
                    cursor = reply["seq"]
                failures = 0
                while True:
                    event = watcher._read_message()
                    if event.get("event") == "lagged":
                        cursor = event["resume_from"]
                        break
                    cursor = event["seq"]
                    yield event
            except (ConnectionLost, OSError, ProtocolError):
                if not reconnect:
                    raise
                time.sleep(WATCH_RETRY_S[min(failures, len(WATCH_RETRY_S) - 1)])
                failures += 1
            finally:
                watcher.close()


__all__ = ["UNSET", "Client", "SessionStoreError"]
