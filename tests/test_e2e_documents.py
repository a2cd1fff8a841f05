# The keyed-document ops the framework adapters stand on (kind `kv`,
# checkpoint_scan, txn), over the wire in CBOR and in JSON, on a real daemon.
from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cbor2
import pytest

from sessionstore.errors import ConnectionLost, Fenced
from sessionstore.wire.canonical import snapshot_digest
from sessionstore.wire.protocol import NEED_DATA, Connection, Mode

from .conftest import DaemonProcess
from .racing import race
from .wire_helpers import exchange, one

MODES = [Mode.CBOR, Mode.JSON]


def put(key: str, value: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"op": "put", "kind": "kv", "key": key, "value": value, **extra}


def keys_of(reply: dict[str, Any]) -> list[str]:
    assert reply["ok"], reply
    return [item["key"] for item in reply["items"]]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_scan_reads_ranges_in_key_order_both_ways(running: DaemonProcess, mode: Mode) -> None:
    path = running.socket_path
    ops = [put(f"t/{n:02d}", {"n": n}) for n in range(12)] + [put("u/00", {"n": 99})]
    assert one(path, {"op": "txn", "ops": ops}, mode)["ok"]
    scan = {"op": "checkpoint_scan", "kind": "kv", "prefix": "t/"}
    everything = one(path, scan, mode)
    assert keys_of(everything) == [f"t/{n:02d}" for n in range(12)]
    assert [item["value"] for item in everything["items"]] == [{"n": n} for n in range(12)]
    assert everything["next"] is None
    first, second = exchange(
        path,
        [{**scan, "limit": 5}, {**scan, "limit": 5, "after": "t/04"}],
        mode,
    )
    assert keys_of(first) == [f"t/{n:02d}" for n in range(5)] and first["next"] == "t/04"
    assert keys_of(second) == [f"t/{n:02d}" for n in range(5, 10)]
    newest = one(path, {**scan, "reverse": True, "limit": 3}, mode)
    assert keys_of(newest) == ["t/11", "t/10", "t/09"] and newest["next"] == "t/09"
    older = one(path, {**scan, "reverse": True, "before": "t/09", "limit": 2}, mode)
    assert keys_of(older) == ["t/08", "t/07"]
    bare = one(path, {**scan, "values": False, "limit": 1}, mode)
    assert set(bare["items"][0]) == {"key", "seq", "digest"}
    assert keys_of(one(path, {**scan, "prefix": "v/"}, mode)) == []


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_a_txn_whose_requirement_fails_writes_nothing(running: DaemonProcess, mode: Mode) -> None:
    path = running.socket_path
    created = one(path, {"op": "txn", "ops": [put("a", {"v": 1})]}, mode)
    assert created["ok"] and created["results"] == [{"written": True}]
    digest = one(path, {"op": "checkpoint_scan", "kind": "kv", "prefix": "a"}, mode)["items"][0][
        "digest"
    ]
    refused = one(
        path,
        {
            "op": "txn",
            "require": [
                {"kind": "kv", "key": "a", "digest": digest},
                {"kind": "kv", "key": "missing", "exists": True},
            ],
            "ops": [put("a", {"v": 2}), put("b", {"v": 2})],
        },
        mode,
    )
    assert not refused["ok"] and refused["error"]["code"] == "conflict"
    assert refused["error"]["failed"] == 1 and refused["error"]["current"] is None
    assert "missing" in refused["error"]["message"]
    values = one(path, {"op": "checkpoint_scan", "kind": "kv"}, mode)["items"]
    assert [(i["key"], i["value"]) for i in values] == [("a", {"v": 1})]
    accepted = one(
        path,
        {
            "op": "txn",
            "require": [
                {"kind": "kv", "key": "a", "digest": digest},
                {"kind": "kv", "key": "b", "exists": False},
                {"kind": "session", "key": "no-such-session", "exists": False},
            ],
            "ops": [
                put("a", {"v": 2}),
                put("b", {"v": 2}),
                {"op": "delete", "kind": "kv", "key": "zz"},
            ],
        },
        mode,
    )
    assert accepted["ok"], accepted
    assert accepted["results"] == [{"written": True}, {"written": True}, {"deleted": False}]
    stale = one(
        path,
        {
            "op": "txn",
            "require": [{"kind": "kv", "key": "a", "digest": digest}],
            "ops": [put("a", {})],
        },
        mode,
    )
    assert stale["error"]["code"] == "conflict" and stale["error"]["current"] != digest


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_if_absent_keeps_the_first_value_and_delete_prefix_removes_a_range(
    running: DaemonProcess, mode: Mode
) -> None:
    path = running.socket_path
    first = one(path, {"op": "txn", "ops": [put("w/1", {"v": "first"}, if_absent=True)]}, mode)
    again = one(path, {"op": "txn", "ops": [put("w/1", {"v": "second"}, if_absent=True)]}, mode)
    assert first["results"] == [{"written": True}]
    assert again["ok"] and again["results"] == [{"written": False}]
    assert again["seq"] == first["seq"]  # nothing committed: seq stays
    got = one(path, {"op": "checkpoint_get", "kind": "kv", "key": "w/1"}, mode)
    assert got["value"] == {"v": "first"}
    one(
        path, {"op": "txn", "ops": [put(f"w/{n}", {}) for n in range(2, 6)] + [put("wx", {})]}, mode
    )
    removed = one(
        path, {"op": "txn", "ops": [{"op": "delete_prefix", "kind": "kv", "prefix": "w/"}]}, mode
    )
    assert removed["results"] == [{"deleted": 5}]
    assert keys_of(one(path, {"op": "checkpoint_scan", "kind": "kv", "prefix": "w"}, mode)) == [
        "wx"
    ]


def test_a_put_that_keeps_fields_takes_them_from_the_stored_map(running: DaemonProcess) -> None:
    path = running.socket_path
    keep = {"keep": ["created_at", "owner"]}
    first = one(
        path, {"op": "txn", "ops": [put("i/1", {"created_at": 1, "v": "a"}, **keep)]}, Mode.CBOR
    )
    assert first["results"] == [{"written": True}]  # nothing stored: the map as sent
    got = one(path, {"op": "checkpoint_get", "kind": "kv", "key": "i/1"}, Mode.CBOR)
    assert got["value"] == {"created_at": 1, "v": "a"}
    second = one(
        path, {"op": "txn", "ops": [put("i/1", {"created_at": 2, "v": "b"}, **keep)]}, Mode.CBOR
    )
    got = one(path, {"op": "checkpoint_get", "kind": "kv", "key": "i/1"}, Mode.CBOR)
    # created_at is the stored one; "owner", which it lacks, is not made up
    assert got["value"] == {"created_at": 1, "v": "b"}
    scanned = one(path, {"op": "checkpoint_scan", "kind": "kv", "prefix": "i/"}, Mode.CBOR)
    (item,) = scanned["items"]  # the digest is the merged map's
    assert item["digest"] == snapshot_digest({"created_at": 1, "v": "b"})
    assert item["seq"] == second["seq"] > first["seq"]
    plain = one(path, {"op": "txn", "ops": [put("i/1", {"created_at": 3, "v": "c"})]}, Mode.CBOR)
    assert plain["ok"]
    got = one(path, {"op": "checkpoint_get", "kind": "kv", "key": "i/1"}, Mode.CBOR)
    assert got["value"] == {"created_at": 3, "v": "c"}  # without keep, a put replaces all
    assert one(path, {"op": "hello"}, Mode.CBOR)["capabilities"]["txn_keep"] is True


def test_racing_puts_that_keep_a_field_all_keep_the_first_one(running: DaemonProcess) -> None:
    """Each put is decided on the stored map in commit order: whichever commits first
    sets created_at, and every later one, from any client, keeps it."""
    path = running.socket_path
    ops = [
        {"op": "txn", "ops": [put("race", {"created_at": n, "n": n}, keep=["created_at"])]}
        for n in range(40)
    ]
    with ThreadPoolExecutor(8) as clients:  # 8 connections, 5 pipelined puts each
        replies = [
            reply
            for replies_of_one in clients.map(
                lambda n: exchange(path, ops[n : n + 5], Mode.CBOR), range(0, 40, 5)
            )
            for reply in replies_of_one
        ]
    assert all(reply["ok"] for reply in replies)
    first = min(range(40), key=lambda n: replies[n]["seq"])
    last = max(range(40), key=lambda n: replies[n]["seq"])
    got = one(path, {"op": "checkpoint_get", "kind": "kv", "key": "race"}, Mode.CBOR)
    assert got["value"] == {"created_at": first, "n": last}


@pytest.mark.parametrize(
    "keep", [["created_at"] * 17, "created_at", [""], [1]], ids=["17", "text", "empty", "int"]
)
def test_a_bad_keep_is_a_bad_request(running: DaemonProcess, keep: Any) -> None:
    reply = one(
        running.socket_path, {"op": "txn", "ops": [put("k", {"a": 1}, keep=keep)]}, Mode.CBOR
    )
    assert reply["ok"] is False and reply["error"]["code"] == "bad_request"
    assert "ops[0].keep" in reply["error"]["message"]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_appends_take_keys_in_commit_order(running: DaemonProcess, mode: Mode) -> None:
    path = running.socket_path
    append = {"op": "append", "kind": "kv", "prefix": "log/"}
    replies = exchange(
        path,
        [
            {
                "op": "txn",
                "ops": [{**append, "value": {"n": 2 * i}}, {**append, "value": {"n": 2 * i + 1}}],
            }
            for i in range(5)
        ],
        mode,
    )
    appended = [result["key"] for reply in replies for result in reply["results"]]
    assert appended == sorted(appended) and len(set(appended)) == 10
    assert all(key.startswith("log/") and len(key) == len("log/") + 20 for key in appended)
    scan = one(path, {"op": "checkpoint_scan", "kind": "kv", "prefix": "log/"}, mode)
    assert [item["value"]["n"] for item in scan["items"]] == list(range(10))
    assert [item["seq"] for item in scan["items"]] == [int(key[4:]) for key in appended]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize(
    ("request_args", "needle"),
    [
        ({}, "ops must be an array"),
        ({"ops": []}, "ops must be an array"),
        ({"ops": [{"op": "upsert", "kind": "kv", "key": "k"}]}, "ops[0].op"),
        ({"ops": [{"op": "put", "kind": "session", "key": "k", "value": {}}]}, "ops[0].kind"),
        ({"ops": [{"op": "put", "kind": "kv", "key": "k"}]}, "ops[0].value is missing"),
        ({"ops": [{"op": "put", "kind": "kv", "key": "", "value": {}}]}, "ops[0].key"),
        ({"ops": [{"op": "put", "kind": "kv", "key": "k", "value": 3}]}, "value must be a map"),
        ({"ops": [put("k", {}), {"op": "delete", "kind": "kv", "key": "k"}]}, "twice"),
        ({"ops": [{"op": "append", "kind": "loop", "prefix": "p", "value": {}}]}, "append is for"),
        ({"ops": [put("k", {})], "require": [{"kind": "kv", "key": "k"}]}, "exactly one of"),
        ({"ops": [put("k", {})], "require": [{"kind": "kv", "key": "k", "digest": "x"}]}, "digest"),
        ({"ops": [put("k", {})], "require": "k"}, "require must be an array"),
    ],
)
def test_bad_txns_are_bad_request_and_change_nothing(
    running: DaemonProcess, mode: Mode, request_args: dict[str, Any], needle: str
) -> None:
    reply = one(running.socket_path, {"op": "txn", **request_args}, mode)
    assert reply["error"]["code"] == "bad_request", reply
    assert needle in reply["error"]["message"]
    scan = one(running.socket_path, {"op": "checkpoint_scan", "kind": "kv"}, mode)
    assert scan["items"] == []


@pytest.mark.parametrize(
    "request_args",
    [
        {"kind": "nope"},
        {"kind": "kv", "limit": 0},
        {"kind": "kv", "limit": 1001},
        {"kind": "kv", "reverse": "yes"},
        {"kind": "kv", "after": ""},
        {"kind": "kv", "prefix": 7},
    ],
)
def test_bad_scans_are_bad_request(running: DaemonProcess, request_args: dict[str, Any]) -> None:
    reply = one(running.socket_path, {"op": "checkpoint_scan", **request_args}, Mode.CBOR)
    assert reply["error"]["code"] == "bad_request", reply


def test_a_txn_is_fenced_and_watched_like_any_write(running: DaemonProcess) -> None:
    with running.client() as client:
        lease = client.lease_acquire("worker-a")
        with pytest.raises(Fenced):
            client.txn([put("k", {})])
        done = client.txn([put("k", {}), put("l", {})], lease=lease)
        client.lease_release("worker-a", lease["epoch"])
        events = []
        for event in client.watch(since=done["seq"] - 2):
            events.append(event)
            if len(events) == 2:
                break
    assert [(e["event"], e["kind"], e["key"], e["seq"]) for e in events] == [
        ("checkpoint", "kv", "k", done["seq"] - 1),
        ("checkpoint", "kv", "l", done["seq"]),
    ]


@pytest.mark.log_only  # the log's failpoints
def test_a_txn_cut_by_a_crash_before_its_commit_record_is_gone_whole(
    daemon: DaemonProcess,
) -> None:
    daemon.start(env={"SESSIONSTORED_FAILPOINTS": "after-intent=crash@2"})
    with daemon.client() as client:
        client.txn([put("kept", {})])
        with pytest.raises(ConnectionLost):
            client.txn([put(f"cut/{n}", {"n": n}) for n in range(50)])
    daemon.wait_exit()
    daemon.start()
    with daemon.client() as client:
        keys = [item["key"] for item in client.checkpoint_scan("kv")["items"]]
    assert keys == ["kept"]


def _raw_json(path: str, request: dict[str, Any]) -> dict[str, Any]:
    """One request as plain JSON text (integers of any size), one reply."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(json.dumps(request).encode() + b"\n")
        reply = sock.makefile("rb").readline()
    answer: dict[str, Any] = json.loads(reply)
    return answer


def test_bignums_are_refused_over_cbor_and_over_json(running: DaemonProcess) -> None:
    big = 2**70  # a CBOR bignum (tag 2); -big is tag 3
    snapshot = {"schema_version": 1, "session": {"id": "big"}, "artifacts": [{"n": big}]}
    put = {"op": "put", "kind": "kv", "key": "k", "value": {"n": -big}}
    requests = [
        {"op": "save", "snapshot": snapshot},
        {"op": "txn", "ops": [put]},
        {"op": "checkpoint_put", "kind": "kv", "key": "k", "value": {"n": big}},
        {"op": "update", "session_id": "big", "component": "session", "value": {"id": big}},
    ]
    for request in requests:
        assert one(running.socket_path, request, Mode.CBOR)["error"]["code"] == "bad_request"
        assert _raw_json(running.socket_path, request)["error"]["code"] == "bad_request"
    with running.client() as client:
        assert not client.exists("big")
        assert client.checkpoint_get("kv", "k") is None
        client.save({"schema_version": 1, "session": {"id": "big"}, "n": 2**64 - 1})
        assert client.load("big")["n"] == 2**64 - 1  # the largest integer CBOR has untagged


@pytest.mark.parametrize("canonical", [False, True], ids=["cbor", "canonical-cbor"])
def test_a_large_txn_is_read_off_the_loop_in_order_with_its_refusals(
    running: DaemonProcess, canonical: bool
) -> None:
    """A txn of thousands of ops is read in a thread (steps.ReadInThread); the connection's
    requests still run in order, and a bad op is still bad_request."""
    many = [put(f"big/{n:05}", {"n": n}) for n in range(3000)]
    bad = [*many[:1500], {"op": "put", "kind": "kv", "key": 7, "value": {}}, *many[1501:]]
    requests = [
        {"op": "txn", "ops": many},
        {"op": "checkpoint_scan", "kind": "kv", "prefix": "big/", "values": False, "limit": 1000},
        {"op": "txn", "ops": bad},
        {"op": "ping"},
    ]
    payload = b"".join(cbor2.dumps(r, canonical=canonical) for r in requests)
    conn = Connection(max_message_bytes=1 << 30, mode=Mode.CBOR)
    replies: list[Any] = []
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)
        sock.connect(running.socket_path)
        sock.sendall(payload)
        while len(replies) < len(requests):
            message = conn.next_message()
            if message is NEED_DATA:
                conn.receive_data(sock.recv(1 << 20))
            else:
                replies.append(message)
    stored, scanned, refused, pong = replies
    assert stored["ok"] and len(stored["results"]) == 3000
    assert len(keys_of(scanned)) == 1000 and scanned["next"] is not None
    assert refused["error"]["code"] == "bad_request" and "ops[1500]" in refused["error"]["message"]
    assert pong["ok"]


def test_a_scan_racing_removals_and_rewrites_pairs_each_key_with_its_own_value(
    running: DaemonProcess,
) -> None:
    """Each item of a scan with values is one document as it was: its seq, digest and
    value belong together, and a key removed under the scan is left out, never an
    error. One client rewrites and removes the range while another scans it."""
    path = running.socket_path
    keys = [f"r/{n:02d}" for n in range(16)]

    def rewrite_and_remove(round_: int) -> None:
        ops = [put(key, {"key": key, "round": round_}) for key in keys]
        assert one(path, {"op": "txn", "ops": ops}, Mode.CBOR)["ok"]
        removal = {"op": "delete", "kind": "kv", "key": keys[round_ % len(keys)]}
        assert one(path, {"op": "txn", "ops": [removal]}, Mode.CBOR)["ok"]

    scan = {"op": "checkpoint_scan", "kind": "kv", "prefix": "r/"}
    scans = race(
        rewrite_and_remove, lambda: one(path, scan, Mode.CBOR), reads_wanted=300, rounds_wanted=30
    )
    for reply in scans:
        assert reply["ok"], reply
        for item in reply["items"]:
            assert item["value"]["key"] == item["key"], item
            assert item["digest"] == snapshot_digest(item["value"]), item
