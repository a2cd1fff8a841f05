# Requests above the offload threshold are decoded, checked and encoded in worker
# processes: they give the same results as small ones, over CBOR and JSON, and
# while one is being worked on, other clients are answered.
from __future__ import annotations

import fcntl
import socket
import struct
import termios
import threading
import time
from pathlib import Path
from typing import Any

import cbor2

from sessionstore import snapshot_digest
from sessionstore.wire import jsonform
from sessionstore.wire.protocol import NEED_DATA, Connection, Mode
from sessionstored.workers.offload import OFFLOAD_ABOVE_BYTES

from .conftest import DaemonProcess


def _events(count: int) -> list[dict[str, Any]]:
    return [{"seq": n, "kind": "tool_call", "detail": "x" * 20} for n in range(count)]


def _large_snapshot(session_id: str, count: int = 20_000) -> dict[str, Any]:
    # keys out of canonical order, a float and a byte string: the slow canonical path
    return {
        "trace_events": _events(count),
        "session": {"id": session_id, "weight": 0.5, "blob": b"\x01" * 10},
        "schema_version": 1,
    }


def test_large_requests_give_the_same_results_as_small_ones(running: DaemonProcess) -> None:
    snap = _large_snapshot("large")
    assert len(cbor2.dumps(snap)) > 4 * OFFLOAD_ABOVE_BYTES
    with running.client() as client:
        saved = client.save(snap)
        assert saved["digest"] == snapshot_digest(snap)
        assert client.load("large") == snap
        events = _events(30_000)
        updated = client.update("large", "trace_events", events)
        assert updated["digest"] == snapshot_digest({**snap, "trace_events": events})
        forked = client.fork("large", "large-fork", "/elsewhere")
        copy = client.load("large-fork")
        assert copy is not None and copy["session"]["config"] == {"workspace": "/elsewhere"}
        assert forked["digest"] == snapshot_digest(copy)
        value = {"run_id": "r", "steps": _events(20_000)}
        client.checkpoint_put("loop", "r", value)
        assert client.checkpoint_get("loop", "r") == value
        bad = {**snap, "run_records": "not an array"}
        try:
            client.save(bad)
        except Exception as error:  # the same code a small request gets
            assert getattr(error, "code", None) == "invalid_snapshot", error
        else:
            raise AssertionError("an invalid large snapshot was accepted")
        assert client.stats()["internal_errors"] == 0


def test_large_json_lines_round_trip(running: DaemonProcess) -> None:
    snap = _large_snapshot("large-json")
    lines = [
        {"op": "save", "rid": 1, "snapshot": snap},
        {"op": "load", "rid": 2, "session_id": "large-json"},
    ]
    conn = Connection(max_message_bytes=1 << 30, mode=Mode.JSON)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)
        sock.connect(running.socket_path)
        sock.sendall(b"".join(jsonform.dumps(r).encode() + b"\n" for r in lines))
        sock.shutdown(socket.SHUT_WR)
        replies = []
        while len(replies) < 2:
            while (message := conn.next_message()) is NEED_DATA:
                conn.receive_data(sock.recv(1 << 20))
            replies.append(message)
    saved, loaded = replies
    assert saved["digest"] == snapshot_digest(snap)
    assert loaded["snapshot"] == snap and loaded["digest"] == saved["digest"]


def _unsent(sock: socket.socket) -> int:
    raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4)
    unread: int = struct.unpack("i", raw)[0]
    return unread


def test_other_clients_are_answered_while_a_large_request_is_worked_on(
    short_tmp: Path,
) -> None:
    # ~600,000 small maps: seconds of cbor2 work holding the GIL, then a refusal (the
    # canonical form is over the limit) that needs no writer, so that answering it
    # inline would beat the pings
    heavy = {
        "schema_version": 1,
        "session": {"id": "heavy"},
        "events": [{"b": 1, "a": 0.5}] * 600_000,
    }
    frame = cbor2.dumps({"op": "save", "snapshot": heavy})
    daemon = DaemonProcess(short_tmp)
    order: list[str] = []
    try:
        daemon.start("--max-snapshot-bytes", str(len(frame) // 2))

        def send_heavy() -> None:
            conn = Connection(max_message_bytes=1 << 30, mode=Mode.CBOR)
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(300)
                sock.connect(daemon.socket_path)
                sock.sendall(frame)
                while _unsent(sock):  # the daemon has read all of it: the work starts
                    time.sleep(0.001)
                order.append("heavy read")
                while (message := conn.next_message()) is NEED_DATA:
                    conn.receive_data(sock.recv(1 << 20))
                order.append(message["error"]["code"] if not message["ok"] else "saved")

        thread = threading.Thread(target=send_heavy)
        thread.start()
        while "heavy read" not in order and thread.is_alive():
            thread.join(0.001)
        with daemon.client() as client:
            for _ in range(20):
                client.ping()
            order.append("pings answered")
        thread.join(300)
        assert order == ["heavy read", "pings answered", "too_large"]
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
