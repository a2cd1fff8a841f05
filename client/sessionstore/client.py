# The blocking client: one Unix socket, stdlib only, the shared sans-IO
# protocol for framing. Every wire error becomes its typed exception.
from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

from .errors import ConnectionLost, SessionStoreError, error_from_wire
from .paths import client_socket_path
from .protocol import NEED_DATA, Connection, Mode, ProtocolError

RECEIVE_BYTES = 256 * 1024
DEFAULT_TIMEOUT_S = 60.0
MAX_RESPONSE_BYTES = 1024 * 1024 * 1024


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


class Client:
    def __init__(
        self, socket_path: str | None = None, *, timeout: float | None = DEFAULT_TIMEOUT_S
    ) -> None:
        self.socket_path = client_socket_path(socket_path)
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
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError as error:
            sock.close()
            raise ConnectionLost(f"cannot connect to {self.socket_path}: {error}") from error
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
            self._sock.sendall(b"".join(self._conn.encode(r) for r in requests))
            return [self._read_response() for _ in requests]
        except (OSError, ProtocolError) as error:
            self.close()
            raise ConnectionLost(f"connection to {self.socket_path} lost: {error}") from error

    def _read_response(self) -> dict[str, Any]:
        assert self._sock is not None
        while True:
            message = self._conn.next_message()
            if message is None:
                raise ConnectionLost("the daemon closed the connection")
            if message is not NEED_DATA:
                if not isinstance(message, dict):
                    raise ConnectionLost(f"malformed response {message!r}")
                return message
            data = self._sock.recv(RECEIVE_BYTES)
            if data:
                self._conn.receive_data(data)
            else:
                self._conn.receive_eof()

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        request = {"op": op, **{k: v for k, v in args.items() if v is not UNSET}}
        response = self.send_raw([request])[0]
        if response.get("ok") is True:
            return response
        raise error_from_wire(response.get("error"))

    # -- ops -------------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        return self.call("hello")

    def ping(self) -> None:
        self.call("ping")

    def save(self, snapshot: dict[str, Any], *, expect: Any = UNSET) -> dict[str, Any]:
        """Returns {"digest", "seq"}. expect: a digest, None (create-only) or UNSET."""
        return self.call("save", snapshot=snapshot, expect=expect)

    def load(self, session_id: str) -> dict[str, Any] | None:
        """The snapshot, or None when absent. load_with_meta() also returns digest and seq."""
        snapshot = self.call("load", session_id=session_id)["snapshot"]
        return snapshot if isinstance(snapshot, dict) else None

    def load_with_meta(self, session_id: str) -> dict[str, Any]:
        return self.call("load", session_id=session_id)

    def head(self, session_id: str) -> dict[str, Any]:
        return self.call("head", session_id=session_id)

    def exists(self, session_id: str) -> bool:
        return bool(self.call("exists", session_id=session_id)["exists"])

    def list(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        return self.call(
            "list",
            prefix=prefix,
            after=after if after is not None else UNSET,
            limit=limit if limit is not None else UNSET,
        )

    def iter_ids(self, prefix: str = "", *, page: int = 1000) -> Iterator[str]:
        after: str | None = None
        while True:
            result = self.list(prefix, after=after, limit=page)
            yield from result["ids"]
            after = result["next"]
            if after is None:
                return

    def delete(self, session_id: str, *, expect: Any = UNSET) -> dict[str, Any]:
        return self.call("delete", session_id=session_id, expect=expect)

    def stats(self) -> dict[str, Any]:
        return self.call("stats")

    def verify(self) -> dict[str, Any]:
        return self.call("verify")


__all__ = ["UNSET", "Client", "SessionStoreError"]
