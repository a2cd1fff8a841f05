# The sans-IO protocol module: framing is independent of how bytes arrive, and
# arbitrary bytes only ever yield requests or a bad_request/too_large error.
from __future__ import annotations

import json
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.wire import cbor_framing, protocol
from sessionstore.wire.protocol import (
    END_OF_STREAM,
    NEED_DATA,
    Connection,
    ItemWalker,
    Mode,
    RawCBOR,
    Refusal,
    encode,
    parse_request,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64) + 1, 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)
requests = st.dictionaries(st.text(max_size=8), values, max_size=5).map(
    lambda d: {**d, "op": "save"}
)


def _drain(conn: Connection) -> list[Any]:
    out = []
    while True:
        message = conn.next_message()
        if message is NEED_DATA or message is END_OF_STREAM:
            return out
        out.append(message)


def _feed(chunks: list[bytes], eof: bool = True) -> list[Any]:
    conn = Connection()
    out: list[Any] = []
    for chunk in chunks:
        conn.receive_data(chunk)
        out.extend(_drain(conn))
    if eof:
        conn.receive_eof()
        out.extend(_drain(conn))
    return out


@given(st.lists(requests, min_size=1, max_size=5), st.data())
def test_whole_vs_byte_at_a_time_vs_random_chunks(
    messages: list[dict], data: st.DataObject
) -> None:
    stream = b"".join(cbor2.dumps(m) for m in messages)
    whole = _feed([stream])
    bytewise = _feed([stream[i : i + 1] for i in range(len(stream))])
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert whole == bytewise == _feed(pieces) == messages


@given(st.lists(requests, min_size=1, max_size=4))
def test_json_lines_mode_same_messages(messages: list[dict]) -> None:
    from sessionstore.wire.jsonform import to_json_value

    stream = b"".join(json.dumps(to_json_value(m)).encode() + b"\n" for m in messages)
    conn = Connection()
    conn.receive_data(stream)
    conn.receive_eof()
    got = _drain(conn)
    assert conn.mode is Mode.JSON
    assert len(got) == len(messages)
    bytewise = _feed([stream[i : i + 1] for i in range(len(stream))])
    assert bytewise == got


@settings(max_examples=400)
@given(st.binary(max_size=300))
def test_garbage_only_yields_messages_or_classified_errors(junk: bytes) -> None:
    conn = Connection(max_message_bytes=4096)
    conn.receive_data(junk)
    conn.receive_eof()
    for _ in range(len(junk) + 2):
        try:
            message = conn.next_message()
        except Refusal as error:
            assert error.code in ("bad_request", "too_large")
            if error.fatal:
                return
            continue
        if message is END_OF_STREAM or message is NEED_DATA:
            return
        try:
            parse_request(message)
        except Refusal as error:
            assert error.code == "bad_request" and not error.fatal


def test_trailing_bytes_stay_for_the_next_item() -> None:
    conn = Connection()
    conn.receive_data(cbor2.dumps({"op": "ping"}) + b"\xa1")
    assert conn.next_message() == {"op": "ping"}
    assert conn.next_message() is NEED_DATA
    conn.receive_data(cbor2.dumps("op") + cbor2.dumps("hello"))
    assert conn.next_message() == {"op": "hello"}


def test_eof_inside_an_item_is_bad_request() -> None:
    conn = Connection()
    conn.receive_data(cbor2.dumps({"op": "ping"})[:-1])
    assert conn.next_message() is NEED_DATA
    conn.receive_eof()
    with pytest.raises(Refusal) as error:
        conn.next_message()
    assert error.value.code == "bad_request" and error.value.fatal


def test_declared_length_over_cap_refused_before_buffering() -> None:
    walker = ItemWalker(max_item_bytes=1000)
    header = b"\x5b" + (10**12).to_bytes(8, "big")  # a 1 TB byte string, only the header sent
    with pytest.raises(Refusal) as error:
        walker.walk(header)
    assert error.value.code == "too_large"
    with pytest.raises(Refusal):
        ItemWalker(1000).walk(b"\x9b" + (10**12).to_bytes(8, "big"))  # a 10^12-element array


def test_nesting_cap() -> None:
    deep_ok = b"\x81" * 63 + b"\x01"
    assert ItemWalker(10_000).walk(deep_ok) == len(deep_ok)
    with pytest.raises(Refusal) as error:
        ItemWalker(10_000).walk(b"\x81" * 65 + b"\x01")
    assert error.value.code == "bad_request"
    conn = Connection()
    conn.receive_data(b'{"op":' + b"[" * 100 + b"]" * 100 + b'}\n{"op":"ping"}\n')
    with pytest.raises(Refusal) as json_error:
        conn.next_message()
    assert json_error.value.code == "bad_request" and not json_error.value.fatal
    assert conn.next_message() == {"op": "ping"}


def test_indefinite_lengths_and_bignums_accepted() -> None:
    item = (
        b"\xbf"
        + b"\x62op"
        + b"\x7f\x62pi\x62ng\xff"
        + b"\x61n"
        + b"\xc2\x49"
        + b"\x01" * 9
        + b"\xff"
    )
    conn = Connection()
    conn.receive_data(item)
    assert conn.next_message() == {"op": "ping", "n": int.from_bytes(b"\x01" * 9, "big")}


@pytest.mark.parametrize(
    "item",
    [b"\xc1\x00", b"\xf7", b"\xf8\x20", b"\x1c", b"\xff", b"\x5f\x61a\xff", b"\x9f\x5f\x41a\x5f"],
)
def test_rejected_encodings(item: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Refusal) as error:
        ItemWalker(1000).walk(item)
    assert error.value.code == "bad_request"
    for fast_path_bytes in (protocol.FAST_PATH_MAX_BYTES, 0):
        monkeypatch.setattr(cbor_framing, "FAST_PATH_MAX_BYTES", fast_path_bytes)
        conn = Connection()
        conn.receive_data(item + b"\x00" * 8)
        conn.receive_eof()
        with pytest.raises(Refusal) as through_connection:
            conn.next_message()
        assert through_connection.value.code == "bad_request"


@pytest.mark.parametrize("fast_path_bytes", [0, 64, 1 << 20])
def test_fast_path_and_walker_agree(fast_path_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cbor_framing, "FAST_PATH_MAX_BYTES", fast_path_bytes)
    messages = [{"op": "save", "blob": "x" * 300, "n": [1, [2, [3]]]}, {"op": "ping"}] * 3
    stream = b"".join(cbor2.dumps(m) for m in messages)
    assert _feed([stream]) == messages
    assert _feed([stream[i : i + 7] for i in range(0, len(stream), 7)]) == messages
    duplicate_keys = b"\xa2\x62op\x64ping\x62op\x64ping"
    with pytest.raises(Refusal):
        _feed([duplicate_keys])


def test_json_line_over_cap_is_too_large() -> None:
    conn = Connection(max_message_bytes=1024)
    conn.receive_data(b'{"op":"' + b"x" * 2000)
    with pytest.raises(Refusal) as error:
        conn.next_message()
    assert error.value.code == "too_large" and error.value.fatal


def test_parse_request_rules() -> None:
    assert parse_request({"op": "ping", "rid": 5}).rid == 5
    for bad in ([1], {"op": 1}, {"op": ""}, {1: "x", "op": "ping"}, {"op": "ping", "rid": [1]}):
        with pytest.raises(Refusal) as error:
            parse_request(bad)
        assert error.value.code == "bad_request" and not error.value.fatal


def test_raw_cbor_is_spliced_and_json_mode_decodes_it() -> None:
    body = cbor2.dumps({"b": b"\x00", "a": 1})
    message = {"ok": True, "snapshot": RawCBOR(body)}
    assert cbor2.loads(encode(message, Mode.CBOR)) == {
        "ok": True,
        "snapshot": {"b": b"\x00", "a": 1},
    }
    assert json.loads(encode(message, Mode.JSON)) == {
        "ok": True,
        "snapshot": {"b": {"$bytes": "AA=="}, "a": 1},
    }


def test_a_cbor_null_is_a_message_not_the_end_of_the_stream() -> None:
    conn = Connection()
    conn.receive_data(b"\xf6" + cbor2.dumps({"op": "ping"}))
    assert conn.next_message() is None
    assert conn.next_message() == {"op": "ping"}
    with pytest.raises(Refusal):
        parse_request(None)


@pytest.mark.parametrize("item", [b"\xef", b"\xe0", b"\xf3", b"\x81\xe5", b"\xa1\x61a\xf0"])
def test_simple_values_are_refused_on_the_fast_path_too(item: bytes) -> None:
    conn = Connection(order_maps=True)
    conn.receive_data(item)
    with pytest.raises(Refusal) as error:
        conn.next_message()
    assert error.value.code == "bad_request"


def test_non_ascii_text_is_not_mistaken_for_simple_values() -> None:
    conn = Connection(order_maps=True)
    message = {"op": "save", "text": "会话 ümlaut 🙂", "n": 250}
    conn.receive_data(cbor2.dumps(message))
    assert conn.next_message() == message


def _drain_sliced(conn: Any) -> list[Any]:
    from sessionstore.wire.protocol import MORE_WORK, NEED_DATA

    out = []
    while (message := conn.next_message()) is not NEED_DATA:
        if message is not MORE_WORK:
            out.append(message)
    return out


@given(st.integers(1, 5000))
def test_large_items_come_out_undecoded_and_the_walk_is_sliced(cut: int) -> None:
    from sessionstore.wire.protocol import MORE_WORK, Connection, Deferred, Mode

    large = cbor2.dumps({"op": "save", "snapshot": {"events": [{"a": n} for n in range(2000)]}})
    stream = cbor2.dumps({"op": "ping"}) + large + cbor2.dumps({"op": "ping", "rid": 2})
    whole = Connection(defer_above_bytes=1000, walk_budget_bytes=64)
    whole.receive_data(stream)
    steps = 0
    messages = []
    while (message := whole.next_message()) is not NEED_DATA:
        steps += message is MORE_WORK
        if message is not MORE_WORK:
            messages.append(message)
    assert messages == [{"op": "ping"}, Deferred(large, Mode.CBOR), {"op": "ping", "rid": 2}]
    assert steps >= len(large) // 128, "the walk of the large item yields every ~64 bytes"
    pieces = Connection(defer_above_bytes=1000, walk_budget_bytes=64)
    received = []
    for start in range(0, len(stream), cut):
        pieces.receive_data(stream[start : start + cut])
        received += _drain_sliced(pieces)
    assert received == messages


def test_each_side_names_what_it_received_and_the_state_is_explicit() -> None:
    item = cbor2.dumps({"op": "save", "blob": "x" * 200})
    for received, text in (
        ("response", "response exceeds max_response_bytes=64"),
        ("request", "request exceeds max_request_bytes=64"),
    ):
        conn = Connection(max_message_bytes=64, received=received)  # type: ignore[arg-type]
        assert conn.mode is Mode.UNDECIDED and not conn.failed
        conn.receive_data(item)
        with pytest.raises(Refusal) as error:
            conn.next_message()
        assert error.value.code == "too_large" and error.value.message == text
        assert conn.failed and conn.mode is Mode.CBOR
    json_conn = Connection()
    json_conn.receive_data(b'{"op":"ping"}\n')
    assert json_conn.next_message() == {"op": "ping"} and json_conn.mode is Mode.JSON


def test_a_walked_item_may_hold_only_so_many_data_items() -> None:
    many = cbor2.dumps({"op": "save", "snapshot": [[]] * 5000})
    conn = Connection(defer_above_bytes=100, max_items=4000, received="request")
    conn.receive_data(many)
    with pytest.raises(Refusal) as error:
        while conn.next_message() is not NEED_DATA:
            pass
    assert error.value.code == "too_large" and "4000 CBOR data items" in error.value.message
    fits = Connection(defer_above_bytes=100, max_items=6000, received="request")
    fits.receive_data(many)
    assert fits.next_message() == protocol.Deferred(many, Mode.CBOR)
