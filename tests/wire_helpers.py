# Talking to a real daemon in either wire mode, request maps in and reply maps
# out, for tests that must hold over CBOR and over JSON lines alike.
from __future__ import annotations

import socket
from typing import Any

import cbor2

from sessionstore.wire import jsonform
from sessionstore.wire.protocol import NEED_DATA, Connection, Mode


def exchange(path: str, requests: list[dict[str, Any]], mode: Mode) -> list[dict[str, Any]]:
    if mode is Mode.JSON:
        payload = b"".join(jsonform.dumps(r).encode() + b"\n" for r in requests)
    else:
        payload = b"".join(cbor2.dumps(r) for r in requests)
    conn = Connection(max_message_bytes=1 << 30, mode=mode)
    replies: list[dict[str, Any]] = []
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        while len(replies) < len(requests):
            message = conn.next_message()
            if message is NEED_DATA:
                data = sock.recv(1 << 20)
                assert data, f"connection closed after {replies}"
                conn.receive_data(data)
            else:
                assert isinstance(message, dict)
                replies.append(message)
    return replies


def one(path: str, request: dict[str, Any], mode: Mode) -> dict[str, Any]:
    return exchange(path, [request], mode)[0]
