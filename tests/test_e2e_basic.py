# End to end against a real daemon process on a real socket: the ops, the
# wire behaviours (pipelining, half-close, JSON mode, limits) and the CLI.
from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import cbor2
import pytest
import trio

from sessionstore import Conflict, InvalidSnapshot, TooLarge, snapshot_digest
from sessionstore.asyncio_client import AsyncClient
from sessionstore.client import Client
from sessionstore.errors import BadRequest, ConnectionLost
from sessionstore.trio_client import TrioClient

from .conftest import DaemonProcess, snapshot
from .tools import require


def _raw_exchange(
    path: str, payload: bytes, *, half_close: bool = True, timeout: float = 10
) -> bytes:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    sock.sendall(payload)
    if half_close:
        sock.shutdown(socket.SHUT_WR)
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks)


def _decode_all(data: bytes) -> list[dict]:
    from sessionstore.wire.protocol import END_OF_STREAM, NEED_DATA, Connection, Mode

    conn = Connection(mode=Mode.CBOR)
    conn.receive_data(data)
    conn.receive_eof()
    out = []
    while (message := conn.next_message()) not in (END_OF_STREAM, NEED_DATA):
        out.append(message)
    return out


def test_save_load_roundtrip_and_digest(running: DaemonProcess) -> None:
    snap = snapshot("tenant/session", name="first", extra_field={"kept": [1, 2.5, None, b"\x00"]})
    snap["trace_events"] = [{"kind": "tool", "n": 1}]
    with running.client() as client:
        saved = client.save(snap)
        assert saved["digest"] == snapshot_digest(snap)
        loaded = client.load_with_meta("tenant/session")
        assert loaded["snapshot"] == snap
        assert loaded["digest"] == saved["digest"]
        assert loaded["seq"] == saved["seq"] == 1
        head = client.head("tenant/session")
        assert head["found"] and head["digest"] == saved["digest"] and head["size"] > 0
        assert client.exists("tenant/session")
        assert client.load("tenant_session") is None
        assert client.head("missing") == {
            "found": False,
            "digest": None,
            "seq": None,
            "size": None,
        }


def test_cas_match_mismatch_and_create_only(running: DaemonProcess) -> None:
    with running.client() as client:
        first = client.save(snapshot("s", v=1), expect=None)
        with pytest.raises(Conflict) as conflict:
            client.save(snapshot("s", v=2), expect=None)
        assert conflict.value.current == first["digest"]
        second = client.save(snapshot("s", v=2), expect=first["digest"])
        with pytest.raises(Conflict) as stale:
            client.save(snapshot("s", v=3), expect=first["digest"])
        assert stale.value.current == second["digest"]
        assert client.load("s") == snapshot("s", v=2)
        with pytest.raises(Conflict):
            client.delete("s", expect=first["digest"])
        deleted = client.delete("s", expect=second["digest"])
        assert deleted == {"deleted": True, "seq": second["seq"] + 1}
        again = client.delete("s")
        assert again["deleted"] is False and again["seq"] == deleted["seq"]
        assert client.load("s") is None


def test_seq_counts_committed_mutations_only(running: DaemonProcess) -> None:
    with running.client() as client:
        seqs = [client.save(snapshot(f"id-{n}"))["seq"] for n in range(5)]
        with pytest.raises(Conflict):
            client.save(snapshot("id-0"), expect=None)
        with pytest.raises(InvalidSnapshot):
            client.save({"schema_version": 2, "session": {"id": "x"}})
        seqs.append(client.delete("id-0")["seq"])
        assert seqs == [1, 2, 3, 4, 5, 6]
        assert client.stats()["seq"] == 6


def test_hostile_ids_stay_distinct_and_inside(running: DaemonProcess) -> None:
    ids = [
        "../../../etc/passwd",
        "tenant/session",
        "tenant_session",
        "foo\\bar",
        "..",
        ".",
        "ünïcødé/会话",
        "a" * 1024,
        "é" * 512,
        "/",
        "id with spaces",
        "\t\n",
    ]
    with running.client() as client:
        for n, session_id in enumerate(ids):
            client.save(snapshot(session_id, n=n))
        for n, session_id in enumerate(ids):
            assert client.load(session_id) == snapshot(session_id, n=n)
        listed = list(client.iter_ids(page=5))
        assert listed == sorted(ids, key=lambda s: s.encode())
    # ids live inside log records: no file is named after one, none lands outside
    state_files = [Path(d, f) for d, _, fs in os.walk(running.workdir) for f in fs]
    assert all(running.state_dir in p.parents or p.parent == running.workdir for p in state_files)
    assert not any(session_id in str(p) for p in state_files for session_id in ids[:3])
    assert not (running.workdir / "etc").exists()
    with running.client() as client, pytest.raises(BadRequest):
        client.load("a" * 1025)


def test_list_prefix_after_limit(running: DaemonProcess) -> None:
    with running.client() as client:
        for name in ("a/1", "a/2", "a/3", "b/1", "ab"):
            client.save(snapshot(name))
        page = client.list("a/", limit=2)
        assert page["ids"] == ["a/1", "a/2"] and page["next"] == "a/2"
        page = client.list("a/", after="a/2", limit=2)
        assert page["ids"] == ["a/3"] and page["next"] is None
        assert client.list()["ids"] == ["a/1", "a/2", "a/3", "ab", "b/1"]
        with pytest.raises(BadRequest):
            client.list(limit=10001)


def test_invalid_snapshots_are_refused(running: DaemonProcess) -> None:
    bad = [
        {"schema_version": 2, "session": {"id": "x"}},
        {"session": {"id": "x"}},
        {"schema_version": 1},
        {"schema_version": 1, "session": {"id": ""}},
        {"schema_version": 1, "session": {"id": "a\0b"}},
        {"schema_version": 1, "session": {"id": "x"}, "artifacts": {}},
        {"schema_version": 1, "session": {"id": "x"}, "retained_artifact_uris": [1]},
        {
            "schema_version": 1,
            "session": {"id": "x"},
            "run_records": [{"snapshot": {"id": "r", "session_id": "other"}}],
        },
        {
            "schema_version": 1,
            "session": {"id": "x"},
            "run_records": [{"snapshot": {"id": "r"}}, {"snapshot": {"id": "r"}}],
        },
        {
            "schema_version": 1,
            "session": {"id": "x"},
            "run_records": [
                {"snapshot": {"id": "r"}, "events": [{"sequence": 2}, {"sequence": 2}]}
            ],
        },
        {
            "schema_version": 1,
            "session": {"id": "x"},
            "run_records": [
                {
                    "snapshot": {"id": "r", "event_count": 2},
                    "events": [{"sequence": 0}, {"sequence": 2}],
                }
            ],
        },
        {
            "schema_version": 1,
            "session": {"id": "x"},
            "subagent_tasks": [{"parent_session_id": "someone-else"}],
        },
    ]
    with running.client() as client:
        for document in bad:
            with pytest.raises(InvalidSnapshot):
                client.save(document)
        good = {
            "schema_version": 1,
            "session": {"id": "x"},
            "run_records": [
                {
                    "snapshot": {"id": "r", "session_id": "x", "event_count": 3},
                    "events": [{"sequence": 0}, {"sequence": 2}],
                }
            ],
            "subagent_tasks": [{"parent_session_id": ""}, {"parent_session_id": "x"}],
        }
        client.save(good)
        assert client.stats()["sessions"] == 1


def test_pipelining_keeps_order_and_read_your_writes(running: DaemonProcess) -> None:
    requests = []
    for n in range(50):
        requests.append({"op": "save", "rid": f"s{n}", "snapshot": snapshot("p", n=n)})
        requests.append({"op": "load", "rid": f"l{n}", "session_id": "p"})
    with running.client() as client:
        responses = client._send_raw(requests)
    assert [r["rid"] for r in responses] == [r["rid"] for r in requests]
    for n in range(50):
        assert responses[2 * n]["ok"] and responses[2 * n + 1]["snapshot"] == snapshot("p", n=n)
    seqs = [responses[2 * n]["seq"] for n in range(50)]
    assert seqs == list(range(1, 51))


def test_half_close_still_answers(running: DaemonProcess) -> None:
    payload = b"".join(
        cbor2.dumps({"op": "save", "rid": n, "snapshot": snapshot(f"h{n}")}) for n in range(10)
    ) + cbor2.dumps({"op": "ping", "rid": "last"})
    responses = _decode_all(_raw_exchange(running.socket_path, payload))
    assert [r["rid"] for r in responses] == [*range(10), "last"]
    assert all(r["ok"] for r in responses)


def test_garbage_gets_bad_request_and_daemon_keeps_serving(running: DaemonProcess) -> None:
    for junk in (
        b"\xff\xff\xff",
        b"\x1c",
        cbor2.dumps([1, 2]),
        cbor2.dumps({"no_op": 1}),
        cbor2.dumps({"op": 5}),
        b"\xc1\x1a\x51\x4b\x67\xb0",
        b"\x9f" * 100,
    ):
        responses = _decode_all(_raw_exchange(running.socket_path, junk))
        assert responses and responses[0]["ok"] is False
        assert responses[0]["error"]["code"] == "bad_request", (junk, responses)
    with running.client() as client:
        client.ping()


def test_unknown_op(running: DaemonProcess) -> None:
    responses = _decode_all(_raw_exchange(running.socket_path, cbor2.dumps({"op": "frobnicate"})))
    assert responses[0]["error"]["code"] == "unknown_op"


def test_json_lines_mode(running: DaemonProcess) -> None:
    lines = [
        {
            "op": "save",
            "rid": 1,
            "snapshot": {"schema_version": 1, "session": {"id": "j"}, "blob": {"$bytes": "AAEC"}},
        },
        {"op": "load", "rid": 2, "session_id": "j"},
    ]
    payload = b"".join(json.dumps(line).encode() + b"\n" for line in lines) + b"not json\n"
    out = _raw_exchange(running.socket_path, payload).decode().splitlines()
    first, second, third = (json.loads(line) for line in out)
    assert first["ok"] and first["rid"] == 1
    assert second["snapshot"]["blob"] == {"$bytes": "AAEC"}
    assert second["digest"] == first["digest"]
    assert third["error"]["code"] == "bad_request"
    with running.client() as client:
        assert client.load("j")["blob"] == b"\x00\x01\x02"


def test_socat_round_trip_with_cbor2_tool(running: DaemonProcess) -> None:
    require("socat")
    cmd = (
        f'echo \'{{"op":"ping","rid":7}}\' | {sys.executable} -m cbor2.tool --format json'
        f" | socat -t 2 - UNIX-CONNECT:{running.socket_path} | {sys.executable} -m cbor2.tool -s"
    )
    out = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30, check=True)
    assert json.loads(out.stdout) == {"ok": True, "rid": 7}
    typed = subprocess.run(
        ["socat", "-t", "2", "-", f"UNIX-CONNECT:{running.socket_path}"],
        input='{"op":"stats"}\n',
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert json.loads(typed.stdout)["ok"] is True


def test_oversized_request_refused_while_others_are_served(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp)
    try:
        daemon.start("--max-request-bytes", "65536", "--request-timeout-seconds", "2")
        with daemon.client() as client:
            assert client.hello()["limits"]["max_request_bytes"] == 65536
            client.save(snapshot("small"))
            big = snapshot("big", blob="x" * 100_000)
            with pytest.raises(TooLarge):  # read after the broken send, not a lost connection
                client.save(big)
        header_only = b"\xa2\x62op\x64save\x68snapshot\x5b" + (1 << 40).to_bytes(8, "big")
        responses = _decode_all(_raw_exchange(daemon.socket_path, header_only))
        assert responses[0]["error"]["code"] == "too_large"
        stalled = _decode_all(_raw_exchange(daemon.socket_path, header_only, half_close=False))
        assert stalled[0]["error"]["code"] == "bad_request"  # the request deadline ends it
        with daemon.client() as client:
            assert client.load("small") == snapshot("small")
            assert client.verify()["problems"] == []
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()


@pytest.mark.log_only  # the state directory's lock
def test_second_daemon_on_same_state_dir_refused(running: DaemonProcess, short_tmp: Path) -> None:
    other_socket = str(short_tmp / "other.sock")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sessionstored",
            "--state-dir",
            str(running.state_dir),
            "--socket",
            other_socket,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert "another sessionstored holds the lock" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_second_daemon_on_same_socket_refused(running: DaemonProcess, short_tmp: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sessionstored",
            "--state-dir",
            str(short_tmp / "state2"),
            "--socket",
            running.socket_path,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert "already listening" in result.stderr
    with running.client() as client:
        client.ping()


def test_bad_configuration_exits_with_one_line(short_tmp: Path) -> None:
    for args, env in (
        (["--socket-mode", "99x"], {}),
        ([], {"SESSIONSTORED_FAILPOINTS": "nowhere=crash"}),
        ([], {"SESSIONSTORED_FAILPOINTS": "before-intent=explode"}),
    ):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "sessionstored",
                "--state-dir",
                str(short_tmp / "s"),
                "--socket",
                str(short_tmp / "x.sock"),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, **env},
        )
        assert result.returncode == 2, result
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_socket_mode_and_directory(running: DaemonProcess) -> None:
    mode = stat.S_IMODE(os.stat(running.socket_path).st_mode)
    assert mode == 0o660


def test_sigterm_drains_and_exits_zero(running: DaemonProcess) -> None:
    client = running.client()
    client.save(snapshot("before-stop"))
    assert running.stop() == 0
    assert running.wait_notification("STOPPING=1", timeout=5)
    assert not os.path.exists(running.socket_path)
    client.close()
    running.start()
    with running.client() as again:
        assert again.load("before-stop") == snapshot("before-stop")


def test_version_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sessionstored", "--version"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0 and result.stdout.startswith("sessionstored ")


def test_cli_commands(running: DaemonProcess, short_tmp: Path) -> None:
    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "sessionstore.tools.cli",
                "--socket",
                running.socket_path,
                *args,
            ],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
        )

    document = json.dumps(snapshot("cli/1", note="hi"))
    put = cli("put", "-", stdin=document)
    assert put.returncode == 0, put.stderr
    digest = json.loads(put.stdout)["digest"]
    assert cli("put", "--create-only", "-", stdin=document).returncode == 5
    assert json.loads(cli("get", "cli/1").stdout) == snapshot("cli/1", note="hi")
    assert json.loads(cli("head", "cli/1").stdout)["digest"] == digest
    assert cli("ls").stdout == "cli/1\n"
    assert cli("get", "nope").returncode == 3
    assert json.loads(cli("verify").stdout)["problems"] == []
    assert json.loads(cli("stats").stdout)["sessions"] == 1
    assert json.loads(cli("call", "exists", '{"session_id":"cli/1"}').stdout)["exists"] is True
    assert json.loads(cli("rm", "cli/1", "--expect", digest).stdout)["deleted"] is True
    failed = cli("rm", "cli/1", "--expect", digest)
    assert failed.returncode == 5 and "conflict" in failed.stderr
    encoded = subprocess.run(
        [sys.executable, "-m", "sessionstore.tools.cli", "encode"],
        input=b'{"op":"ping"}',
        capture_output=True,
        timeout=30,
        check=True,
    ).stdout
    assert cbor2.loads(encoded) == {"op": "ping"}
    decoded = (
        subprocess.run(
            [sys.executable, "-m", "sessionstore.tools.cli", "decode"],
            input=encoded + encoded,
            capture_output=True,
            timeout=30,
            check=True,
        )
        .stdout.decode()
        .splitlines()
    )
    assert [json.loads(line) for line in decoded] == [{"op": "ping"}] * 2


def test_client_reports_missing_daemon(short_tmp: Path) -> None:
    with pytest.raises(ConnectionLost), Client(str(short_tmp / "none.sock")) as client:
        client.ping()


REQUIRED_ARGUMENTS: dict[str, dict[str, Any]] = {
    "save": {"snapshot": {"schema_version": 1, "session": {"id": "m"}}},
    "load": {"session_id": "m"},
    "head": {"session_id": "m"},
    "exists": {"session_id": "m"},
    "delete": {"session_id": "m"},
    "update": {"session_id": "m", "component": "artifacts", "value": []},
    "fork": {"session_id": "m", "new_session_id": "m2", "workspace": "/w"},
    "checkpoint_put": {"kind": "loop", "key": "k", "value": {}},
    "checkpoint_get": {"kind": "loop", "key": "k"},
    "checkpoint_delete": {"kind": "loop", "key": "k"},
    "lease_acquire": {"holder": "h"},
    "lease_release": {"holder": "h", "epoch": 1},
}


ANY_VALUE_ARGUMENTS = {("update", "value"), ("fork", "workspace")}  # their type is the op's


@pytest.mark.parametrize("mode", ["cbor", "json"])
def test_a_missing_or_mistyped_argument_is_bad_request(running: DaemonProcess, mode: str) -> None:
    requests = []
    for op, arguments in REQUIRED_ARGUMENTS.items():
        for name in arguments:
            kept = {k: v for k, v in arguments.items() if k != name}
            requests.append({"op": op, "rid": f"{op}-without-{name}", **kept})
            if (op, name) not in ANY_VALUE_ARGUMENTS:
                requests.append({"op": op, "rid": f"{op}-{name}-mistyped", **kept, name: [[]]})
    if mode == "cbor":
        with running.client() as client:
            responses = client._send_raw(requests)
    else:
        lines = "".join(json.dumps(r) + "\n" for r in requests).encode()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(running.socket_path))
            sock.sendall(lines)
            sock.shutdown(socket.SHUT_WR)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        responses = [json.loads(line) for line in received.splitlines()]
    assert [r["rid"] for r in responses] == [r["rid"] for r in requests]
    for response in responses:
        assert not response["ok"] and response["error"]["code"] == "bad_request", response
    with running.client() as client:
        assert client.stats()["seq"] == 0, "no malformed request wrote anything"


def test_an_oversized_save_is_too_large_for_every_client(short_tmp: Path) -> None:
    """The daemon answers `too_large` and closes while the client is still sending: the
    client reads that answer instead of reporting a lost connection."""
    daemon = DaemonProcess(short_tmp)
    try:
        daemon.start("--max-request-bytes", "65536")
        big = snapshot("big", blob="x" * (4 << 20))  # far more than the socket's buffers
        with daemon.client() as client:
            with pytest.raises(TooLarge):
                client.save(big)
            client.save(snapshot("after"))  # the client reconnects and goes on

        async def through_asyncio() -> None:
            async with AsyncClient(daemon.socket_path) as client:
                with pytest.raises(TooLarge):
                    await client.save(big)

        asyncio.run(through_asyncio())

        async def through_trio() -> None:
            async with TrioClient(daemon.socket_path) as client:
                with pytest.raises(TooLarge):
                    await client.save(big)

        trio.run(through_trio)
        command = [sys.executable, "-m", "sessionstore.tools.cli", "--socket", daemon.socket_path]
        put = subprocess.run(
            [*command, "put", "-"], input=json.dumps(big), capture_output=True, text=True
        )
        assert put.returncode == 2, put.stderr
        assert "too_large" in put.stderr
    finally:
        assert daemon.stop() == 0, daemon.log()
        daemon.cleanup()


def test_stats_seq_is_never_behind_a_reply_already_received(running: DaemonProcess) -> None:
    """Four writers at once; after each acknowledged save, that writer's stats must show
    its seq (on PostgreSQL a daemon learns other commits from ss_changes a moment later,
    but never lags its own)."""
    behind: list[tuple[int, int]] = []

    def writer(number: int) -> None:
        with running.client() as client:
            for n in range(60):
                seq = client.save(snapshot(f"seq-{number}-{n}"))["seq"]
                shown = client.stats()["seq"]
                if shown < seq:
                    behind.append((seq, shown))

    threads = [threading.Thread(target=writer, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert behind == []
