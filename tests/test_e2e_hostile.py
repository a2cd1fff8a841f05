# Every op with every argument replaced by every kind of bad value, over CBOR
# and over JSON lines, against a real daemon: each request gets a reply with a
# contract error code (never `internal`), and the daemon stays up.
from __future__ import annotations

import json
import math
import socket
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionstore.errors import SessionStoreError
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import NEED_DATA, Connection, Mode

from .conftest import DaemonProcess

GOOD_ARGUMENTS: dict[str, dict[str, Any]] = {
    "hello": {},
    "ping": {},
    "save": {
        "snapshot": {"schema_version": 1, "session": {"id": "h"}},
        "expect": None,
        "lease": None,
    },
    "load": {"session_id": "h"},
    "head": {"session_id": "h"},
    "exists": {"session_id": "h"},
    "list": {"prefix": "h", "after": "a", "limit": 5},
    "delete": {"session_id": "h", "expect": None},
    "update": {"session_id": "h", "component": "artifacts", "value": [], "expect": None},
    "fork": {"session_id": "h", "new_session_id": "h2", "workspace": "/w"},
    "checkpoint_put": {"kind": "loop", "key": "k", "value": {"run_id": "k"}},
    "checkpoint_get": {"kind": "loop", "key": "k"},
    "checkpoint_delete": {"kind": "loop", "key": "k"},
    "lease_acquire": {"holder": "h"},
    "lease_get": {},
    "lease_release": {"holder": "h", "epoch": 1},
    "stats": {},
    "verify": {},
}
SLOTS = [(op, name) for op, args in GOOD_ARGUMENTS.items() for name in [*args, "rid", "op"]]

LONE_SURROGATE = "\ud800"  # valid in a JSON escape, not encodable as UTF-8
INVALID_UTF8_TEXT = b"\x63\xed\xa0\x80"  # a CBOR text item holding the UTF-8 of U+D800


class RawItem:
    def __init__(self, data: bytes) -> None:
        self.data = data


def _nested(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63, 2**64, 2**64 + 7, -(2**64), -(2**64) - 7, 10**40]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.binary(max_size=40),
    st.text(max_size=40),
    st.sampled_from(["", "\x00", "a\x00b", "x" * 5000, LONE_SURROGATE, "a" + LONE_SURROGATE]),
)
BAD_VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=4),
    st.dictionaries(st.text(max_size=8), SCALARS, max_size=4),
    st.dictionaries(st.integers(), SCALARS, min_size=1, max_size=3),
    st.integers(0, 70).map(lambda depth: _nested(depth, 0)),
    st.sampled_from([RawItem(INVALID_UTF8_TEXT), RawItem(b"\xc1\x00"), RawItem(b"\xf7")]),
)


def _cbor_frame(request: dict[Any, Any]) -> bytes | None:
    def raw(encoder: Any, value: Any) -> None:
        encoder.write(value.data)

    try:
        return cbor2.dumps(request, default=raw)
    except UnicodeEncodeError:  # a lone surrogate: RawItem(INVALID_UTF8_TEXT) covers it
        return None


def _json_line(request: dict[str, Any]) -> bytes | None:
    def plain(value: Any) -> Any:
        if isinstance(value, RawItem):
            raise TypeError("no JSON form")
        if isinstance(value, bytes):
            return {"$bytes": "!!not base64"}
        raise TypeError(type(value).__name__)

    def keys_as_text(value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): keys_as_text(v) for k, v in value.items()}
        if isinstance(value, list):
            return [keys_as_text(v) for v in value]
        return value

    try:
        return (json.dumps(keys_as_text(request), default=plain) + "\n").encode()
    except (TypeError, ValueError):
        return None


def _exchange(running: DaemonProcess, mode: Mode, payload: bytes) -> dict[str, Any]:
    conn = Connection(max_message_bytes=1 << 30, mode=mode)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(running.socket_path)
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        while (message := conn.next_message()) is NEED_DATA:
            data = sock.recv(1 << 20)
            if data:
                conn.receive_data(data)
            else:
                conn.receive_eof()
    assert isinstance(message, dict), f"no reply to {payload[:200]!r}"
    return message


def _internal_errors(running: DaemonProcess) -> int:
    with running.client() as client:
        return int(client.stats()["internal_errors"])


@pytest.mark.parametrize("mode", [Mode.CBOR, Mode.JSON])
def test_every_argument_of_every_op_survives_every_bad_value(
    running: DaemonProcess, mode: Mode
) -> None:
    @settings(
        max_examples=300,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(slot=st.sampled_from(SLOTS), bad=BAD_VALUES)
    def check(slot: tuple[str, str], bad: Any) -> None:
        op, name = slot
        request: dict[str, Any] = {"op": op, **GOOD_ARGUMENTS[op], "rid": 7}
        request[name] = bad
        payload = _cbor_frame(request) if mode is Mode.CBOR else _json_line(request)
        if payload is None:
            return
        reply = _exchange(running, mode, payload)
        assert isinstance(reply.get("ok"), bool), reply
        if not reply["ok"]:
            code = reply["error"]["code"]
            assert code in set(ErrorCode) and code != ErrorCode.INTERNAL, (request, reply)

    check()
    with running.client() as client:
        client.ping()
    assert _internal_errors(running) == 0, running.log()


def test_a_lone_surrogate_in_json_is_bad_request_in_every_text_field(
    running: DaemonProcess,
) -> None:
    for op, name in SLOTS:
        request = {"op": op, **GOOD_ARGUMENTS[op], name: "x" + LONE_SURROGATE}
        reply = _exchange(running, Mode.JSON, (json.dumps(request) + "\n").encode())
        assert not reply["ok"] and reply["error"]["code"] == "bad_request", (request, reply)
    nested = {"schema_version": 1, "session": {"id": "s", "note": LONE_SURROGATE}}
    reply = _exchange(
        running, Mode.JSON, (json.dumps({"op": "save", "snapshot": nested}) + "\n").encode()
    )
    assert reply["error"]["code"] == "bad_request"
    assert _internal_errors(running) == 0


def test_non_finite_numbers_are_refused_where_an_integer_is_wanted(
    running: DaemonProcess,
) -> None:
    for value in (math.inf, -math.inf, math.nan, 1.5):
        for op, name in (("list", "limit"), ("lease_release", "epoch")):
            request = {"op": op, **GOOD_ARGUMENTS[op], name: value}
            reply = _exchange(running, Mode.CBOR, cbor2.dumps(request))
            assert reply["error"]["code"] == "bad_request", (request, reply)


def test_json_integers_outside_cbor_range_are_refused(running: DaemonProcess) -> None:
    for value in (2**64, -(2**64) - 1, 10**40):
        snap = {"schema_version": 1, "session": {"id": "big", "n": value}}
        line = (json.dumps({"op": "save", "snapshot": snap}) + "\n").encode()
        assert _exchange(running, Mode.JSON, line)["error"]["code"] == "bad_request"
    edge = {"schema_version": 1, "session": {"id": "edge", "n": [2**64 - 1, -(2**64)]}}
    line = (json.dumps({"op": "save", "snapshot": edge}) + "\n").encode()
    assert _exchange(running, Mode.JSON, line)["ok"]
    with running.client() as client:
        assert client.load("edge") == edge


@pytest.mark.parametrize("prefix", [False, 0, [], {}, b""], ids=repr)
def test_a_prefix_that_is_not_text_is_refused_not_read_as_empty(
    running: DaemonProcess, prefix: Any
) -> None:
    with running.client() as client:
        client.save({"schema_version": 1, "session": {"id": "s"}})
        client.checkpoint_put("kv", "k", {"vectors": []})
        for op, args in (
            ("list", {}),
            ("checkpoint_scan", {"kind": "kv"}),
            ("checkpoint_rank", {"kind": "kv", "query": [1.0]}),
        ):
            with pytest.raises(SessionStoreError) as refused:
                client.call(op, prefix=prefix, **args)
            assert refused.value.code == ErrorCode.BAD_REQUEST, op
            client.call(op, prefix=None, **args)  # null is the empty prefix
