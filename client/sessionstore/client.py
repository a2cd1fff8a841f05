# The blocking client: one Unix socket, stdlib only, the shared sans-IO
# protocol for framing. Every wire error becomes its typed exception.
from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import ConnectionLost, NoDaemon, SessionStoreError, Timeout
from .op_methods import OpMethods
from .paths import checked_socket, client_socket
from .replies import (
    DEFAULT_TIMEOUT_S,
    MAX_RESPONSE_BYTES,
    RECEIVE_BYTES,
    RESUMABLE,
    WatchResume,
    answers_after_broken_send,
    backup_ended,
    closes_connection,
    result_of,
    take_response,
)
from .reply_types import WatchEvent
from .requests import UNSET, make
from .wire.protocol import Connection, Mode, Refusal


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

    @contextmanager
    def timeout_of(self, seconds: float | None) -> Iterator[Client]:
        """The calls made in the with block wait at most `seconds` for their reply (None:
        without a limit); Timeout past it. The client's own timeout again after."""
        before = self.timeout
        self._set_timeout(seconds)
        try:
            yield self
        finally:
            self._set_timeout(before)

    def _set_timeout(self, seconds: float | None) -> None:
        self.timeout = seconds
        if self._sock is not None:
            self._sock.settimeout(seconds)

    # -- raw requests --------------------------------------------------------

    def _send_raw(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.connect()
        try:
            return self._exchange(requests)
        except BaseException:
            # An exchange left part way (a lost connection, or an exception raised in
            # this thread by a signal handler) leaves its replies on the way, and they
            # would answer the next request: the connection goes with it.
            self.close()
            raise

    @contextmanager
    def _socket_errors(self) -> Iterator[None]:
        """The socket's failures as the client's: Timeout, or ConnectionLost."""
        try:
            yield
        except TimeoutError as error:  # the socket's timeout
            raise Timeout(f"no reply within {self.timeout} s") from error
        except (OSError, Refusal) as error:
            raise ConnectionLost(f"connection to {self.socket_path} lost: {error}") from error

    def _exchange(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        assert self._sock is not None
        with self._socket_errors():
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
            replies: list[dict[str, Any]] = []
            while len(replies) < len(requests):
                replies.append(self._read_message())
                if closes_connection(replies[-1:]):  # nothing more comes on it
                    self.close()
                    return replies + [replies[-1]] * (len(requests) - len(replies))
            return replies

    def _replies_left(self, count: int) -> list[dict[str, Any]]:
        """What the daemon answered before it closed (at most count replies)."""
        replies: list[dict[str, Any]] = []
        try:
            while len(replies) < count:
                replies.append(self._read_message())
        except (OSError, Refusal, ConnectionLost):
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

    def iter_ids(self, prefix: str = "", *, page: int = 1000) -> Iterator[str]:
        after: str | None = None
        while True:
            result = self.list(prefix, after=after, limit=page)
            yield from result["ids"]
            after = result["next"]
            if after is None:
                return

    def backup(self) -> Iterator[dict[str, Any]]:
        """The `backup` op's stream, on a connection of its own: its header (seq,
        documents, backup_id, sealed_with_key_id, source), then {"payloads": [...]}
        messages, then {"end": true, ...}. An error reply raises its exception."""
        streamer = Client(self.socket_path, timeout=self.timeout)
        try:
            [header] = streamer._send_raw([make("backup").request])
            result_of(make("backup"), header)
            yield header
            with streamer._socket_errors():
                while True:
                    message = streamer._read_message()
                    ended = backup_ended(message)
                    yield message
                    if ended:
                        return
        finally:
            streamer.close()

    def watch(self, since: int | None = None, *, reconnect: bool = True) -> Iterator[WatchEvent]:
        """Events in seq order, none skipped. Resumes with `since` after a lost connection
        or a `lagged` notice; raises Compacted when the history it needs is gone."""
        resume = WatchResume(since)
        while True:
            watcher = Client(self.socket_path, timeout=None)
            try:
                resume.started(watcher._send_raw([resume.request()])[0])
                while resume.deliver(event := watcher._read_message()):
                    yield event
            except RESUMABLE:
                if not reconnect:
                    raise
                time.sleep(resume.lost())
            finally:
                watcher.close()


__all__ = ["UNSET", "Client", "SessionStoreError"]
