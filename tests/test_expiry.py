# Expiry through real daemons, on both engines: every document kind may carry a ttl_s; an expired
# generation is gone for every read and decision the moment it expires, the
# sweep removes it as a committed change watchers see with "expired": true,
# and expiry times survive kill -9, index checkpoints, compaction and a backup
# restored elsewhere. Waits end on what the store says (an event, a passed
# expires_at_ms), never on a guess of how long something takes.
from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from sessionstore.client import Client
from sessionstore.errors import BadRequest, Conflict, SessionStoreError

from .conftest import DaemonProcess, restored_client, take_backup
from .postgres_server import PostgresServer
from .wall_clock import advance_past, now_ms


def _snapshot(session_id: str, **fields: Any) -> dict[str, Any]:
    return {"schema_version": 1, "session": {"id": session_id, **fields}}


def _expired_events(client: Client, since: int, count: int) -> list[dict[str, Any]]:
    events = []
    for event in client.watch(since=since):
        if event.get("expired"):
            events.append(event)
            if len(events) == count:
                return events
    raise AssertionError("the watch ended")


def test_every_kind_expires_for_every_read_then_the_sweep_removes_it(
    running: DaemonProcess,
) -> None:
    with running.client() as client:
        start = client.stats()["seq"]
        client.call("save", snapshot=_snapshot("s"), ttl_s=0.5)
        client.call("checkpoint_put", kind="loop", key="run", value={"run_id": "run"}, ttl_s=0.5)
        client.call("checkpoint_put", kind="kv", key="k", value={"v": 1}, ttl_s=0.5)
        client.txn([{"op": "put", "kind": "workflow", "key": "wf", "value": {}, "ttl_s": 0.5}])
        appended = client.txn([{"op": "append", "kind": "kv", "prefix": "log/", "value": {},
                                "ttl_s": 0.5}])["results"][0]["key"]  # fmt: skip
        client.call("save", snapshot=_snapshot("kept"))
        head = client.call("head", session_id="s")
        expires = head["expires_at_ms"]
        assert now_ms() < expires <= now_ms() + 500
        assert client.call("load", session_id="s")["expires_at_ms"] == expires
        items = client.checkpoint_scan("kv")["items"]
        assert [i["key"] for i in items] == ["k", appended]
        assert all(i["expires_at_ms"] > 0 for i in items)
        assert "expires_at_ms" not in client.call("head", session_id="kept")
        latest = max(
            expires,
            *(i["expires_at_ms"] for kind in ("loop", "kv", "workflow")
              for i in client.checkpoint_scan(kind, values=False)["items"]),
        )  # fmt: skip
        advance_past(client, latest)
        assert client.call("head", session_id="s")["found"] is False
        assert client.load("s") is None and client.exists("s") is False
        assert client.list()["ids"] == ["kept"]
        for kind, key in (("loop", "run"), ("kv", "k"), ("workflow", "wf")):
            assert client.checkpoint_get(kind, key) is None
            assert client.checkpoint_scan(kind)["items"] == []
        # absent to decisions too: create-only succeeds, a requirement on it fails
        again = client.save(_snapshot("s", again=True), expect=None)
        with pytest.raises(Conflict):
            client.txn(
                [{"op": "put", "kind": "kv", "key": "other", "value": {}}],
                require=[{"kind": "kv", "key": "k", "exists": True}],
            )
        # the sweep (woken by the clock's move) removes each, "s" only if it came first
        swept_s = False
        for event in client.watch(since=start):  # what came before "s" was saved again
            if event["seq"] >= again["seq"]:
                break
            swept_s |= bool(event.get("expired")) and event.get("session_id") == "s"
        events = _expired_events(client, start, 4 + swept_s)
    assert {(e["event"], e.get("session_id") or e["key"]) for e in events} == {
        ("checkpoint", "run"), ("checkpoint", "k"), ("checkpoint", "wf"), ("checkpoint", appended),
        *([("delete", "s")] if swept_s else []),
    }  # fmt: skip
    assert all(e.get("deleted") is True for e in events if e["event"] == "checkpoint")
    with running.client() as client:
        assert client.load("s") == _snapshot("s", again=True)  # written again: not swept
        assert client.stats()["expirations"] == 4 + swept_s


def test_expire_and_persist_and_update_keep_or_change_the_expiry(running: DaemonProcess) -> None:
    with running.client() as client:
        client.save(_snapshot("e"), ttl_s=3600)
        first = client.call("head", session_id="e")
        updated = client.update("e", "trace_events", [{"t": 1}])
        after_update = client.call("head", session_id="e")
        assert after_update["seq"] == updated["seq"]
        assert after_update["expires_at_ms"] == first["expires_at_ms"]  # kept
        persisted = client.call("expire", session_id="e", ttl_s=None)
        assert persisted["found"] is True and "expires_at_ms" not in persisted
        head = client.call("head", session_id="e")
        assert "expires_at_ms" not in head and head["digest"] == after_update["digest"]
        later = client.call("expire", kind="kv", key="missing", ttl_s=5)
        assert later["found"] is False
        client.checkpoint_put("kv", "k", {"v": 1})
        set_now = client.call("expire", kind="kv", key="k", ttl_s=60)
        assert (
            client.call("checkpoint_get", kind="kv", key="k")["expires_at_ms"]
            == set_now["expires_at_ms"]
        )
        client.save(_snapshot("e"))  # a save without ttl_s: no expiry (Redis's SET)
        assert "expires_at_ms" not in client.call("head", session_id="e")
        forked = client.call("fork", session_id="e", new_session_id="f", workspace="/w", ttl_s=9)
        assert forked["seq"] > 0 and client.call("head", session_id="f")["expires_at_ms"] > 0


def test_expire_refuses_a_session_id_with_a_kind_or_a_key(running: DaemonProcess) -> None:
    with running.client() as client:
        client.save(_snapshot("x"), ttl_s=3600)
        client.checkpoint_put("kv", "x", {"v": 1})
        session = client.call("head", session_id="x")
        seq = client.stats()["seq"]
        for extra in ({"kind": "kv", "key": "x"}, {"kind": "kv"}, {"key": "x"}):
            for ttl in (None, 60):
                with pytest.raises(SessionStoreError) as refused:
                    client.call("expire", session_id="x", ttl_s=ttl, **extra)
                assert refused.value.code == "bad_request", (extra, ttl)
        with pytest.raises(BadRequest):
            client.expire("x", 60, kind="kv", key="x")
        assert client.call("head", session_id="x") == session
        assert "expires_at_ms" not in client.call("checkpoint_get", kind="kv", key="x")
        assert client.stats()["seq"] == seq  # nothing written


def test_a_rewrite_moves_or_cancels_the_expiry_the_sweep_keeps(running: DaemonProcess) -> None:
    short, marker = {"ttl_s": 0.2}, {"ttl_s": 0.4}
    with running.client() as client:
        client.txn([
            {"op": "put", "kind": "kv", "key": "sooner", "value": {}, "ttl_s": 3600},
            {"op": "put", "kind": "kv", "key": "later", "value": {}, **short},
            {"op": "put", "kind": "kv", "key": "cancelled", "value": {}, **short},
            {"op": "put", "kind": "kv", "key": "deleted", "value": {}, **short},
        ])  # fmt: skip
        rewritten = client.txn([
            {"op": "put", "kind": "kv", "key": "sooner", "value": {"v": 2}, **short},
            {"op": "put", "kind": "kv", "key": "later", "value": {"v": 2}, "ttl_s": 3600},
            {"op": "put", "kind": "kv", "key": "cancelled", "value": {"v": 2}},
            {"op": "delete", "kind": "kv", "key": "deleted"},
            {"op": "put", "kind": "kv", "key": "marker", "value": {}, **marker},
        ])["seq"]  # fmt: skip
        # the sweep takes expiries in time order: once the marker is removed, every
        # earlier expiry the schedule held has been taken
        swept = []
        for event in client.watch(since=rewritten):
            if event.get("expired"):
                swept.append(event["key"])
                if event["key"] == "marker":
                    break
        assert swept == ["sooner", "marker"]
        assert client.checkpoint_get("kv", "later") == {"v": 2}
        assert client.call("checkpoint_get", kind="kv", key="later")["expires_at_ms"] > (
            now_ms() + 3_000_000
        )
        assert client.checkpoint_get("kv", "cancelled") == {"v": 2}
        assert "expires_at_ms" not in client.call("checkpoint_get", kind="kv", key="cancelled")


@pytest.mark.log_only  # the log engine's in-memory schedule (PostgreSQL sweeps by a query)
def test_rewrites_keep_the_expiry_schedule_to_the_live_documents(running: DaemonProcess) -> None:
    keys, rewrites, entries_per_live, slack_entries = 1_000, 30, 4, 2_048
    with running.client() as client:
        for rewrite in range(rewrites):
            client.txn([
                {"op": "put", "kind": "kv", "key": f"k{n}", "value": {"r": rewrite},
                 "ttl_s": 3600}
                for n in range(keys)
            ])  # fmt: skip
        assert client.stats()["expiry_schedule_entries"] <= entries_per_live * keys + slack_entries
        client.txn([{"op": "delete", "kind": "kv", "key": f"k{n}"} for n in range(keys)])
        assert client.stats()["expiry_schedule_entries"] <= slack_entries
        client.ping()


@pytest.mark.parametrize(
    "ttl", [-1, 0, math.nan, math.inf, -math.inf, 1e20, 2**64 - 1, "60", True, [1], {"s": 1}]
)
def test_a_hostile_ttl_is_bad_request_everywhere(running: DaemonProcess, ttl: Any) -> None:
    with running.client() as client:
        client.save(_snapshot("x"))
        calls = [
            ("save", {"snapshot": _snapshot("x")}),
            ("update", {"session_id": "x", "component": "trace_events", "value": []}),
            ("fork", {"session_id": "x", "new_session_id": "y", "workspace": "/w"}),
            ("checkpoint_put", {"kind": "kv", "key": "k", "value": {}}),
            ("expire", {"session_id": "x"}),
            ("txn", {"ops": [{"op": "put", "kind": "kv", "key": "k", "value": {}}]}),
        ]
        for op, args in calls:
            if op == "txn":
                args["ops"][0]["ttl_s"] = ttl
            else:
                args["ttl_s"] = ttl
            with pytest.raises(SessionStoreError) as refused:
                client.call(op, **args)
            assert refused.value.code == "bad_request", (op, ttl)
            assert "ttl_s" in str(refused.value)
        client.ping()  # the connection and the daemon serve on
        assert "expires_at_ms" not in client.call("head", session_id="x")


def test_expiry_survives_kill_9_checkpoints_compaction_and_a_restore(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(short_tmp)
    daemon.start("--checkpoint-every", "5")
    try:
        with daemon.client() as client:
            for n in range(12):  # past two index checkpoints
                client.call("save", snapshot=_snapshot(f"long/{n}"), ttl_s=3600)
            client.call("checkpoint_put", kind="kv", key="k", value={"v": 1}, ttl_s=3600)
            short = client.call("save", snapshot=_snapshot("short"), ttl_s=1)
            wanted = {f"long/{n}": client.call("head", session_id=f"long/{n}")["expires_at_ms"]
                      for n in range(12)}  # fmt: skip
            short_expires = client.call("head", session_id="short")["expires_at_ms"]
        daemon.kill9()  # before "short" expires: the sweep has not removed it
        daemon.start("--checkpoint-every", "5")
        with daemon.client() as client:
            advance_past(client, short_expires)  # its expiry came back with the restart
            assert client.load("short") is None
            [event] = _expired_events(client, short["seq"], 1)  # swept after the restart
            assert event["session_id"] == "short"
            client.compact()
            for session_id, expires in wanted.items():
                assert client.call("head", session_id=session_id)["expires_at_ms"] == expires
            assert client.verify()["problems"] == []
            backup = take_backup(daemon, short_tmp / "b.bak")
        assert daemon.stop() == 0
        daemon.start()  # the history of the sweep's removal, from the log and checkpoint
        with daemon.client() as client:
            [replayed] = _expired_events(client, short["seq"], 1)
            assert replayed == event
        with restored_client(backup) as client:
            for session_id, expires in wanted.items():
                assert client.call("head", session_id=session_id)["expires_at_ms"] == expires
            assert client.call("checkpoint_get", kind="kv", key="k")["expires_at_ms"] > 0
    finally:
        daemon.stop()


def test_reads_racing_the_sweep_see_a_document_or_nothing(running: DaemonProcess) -> None:
    count = 300
    with running.client() as client:
        start = client.stats()["seq"]
        client.txn([
            {"op": "put", "kind": "kv", "key": f"r/{n:04d}", "value": {"n": n}, "ttl_s": 0.3}
            for n in range(count)
        ])  # fmt: skip
        expires = max(i["expires_at_ms"] for i in client.checkpoint_scan(
            "kv", prefix="r/", values=False, limit=1000)["items"])  # fmt: skip
    problems: list[str] = []
    stop = threading.Event()

    def read() -> None:
        with running.client() as reader:
            while not stop.is_set():
                asked_at = now_ms()
                try:
                    value = reader.checkpoint_get("kv", "r/0150")
                    page = reader.checkpoint_scan("kv", prefix="r/", limit=1000)["items"]
                except SessionStoreError as error:
                    problems.append(f"{error.code}: {error}")
                    return
                if asked_at > expires and (value is not None or page):
                    problems.append(f"read an expired document at {asked_at} > {expires}")
                if value is not None and value != {"n": 150}:
                    problems.append(f"read {value!r}")

    readers = [threading.Thread(target=read) for _ in range(3)]
    for thread in readers:
        thread.start()
    with running.client() as client:
        _expired_events(client, start, count)  # the sweep removed every one
    stop.set()
    for thread in readers:
        thread.join(60)
    assert problems == []


def test_the_cli_sets_shows_and_removes_expiry_and_export_import_keep_it(
    running: DaemonProcess, tmp_path: Path
) -> None:
    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "sessionstore.tools.cli", "--socket",
                   running.socket_path, "--json", *args]  # fmt: skip
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)

    put = cli("put", "--ttl", "3600", stdin='{"schema_version": 1, "session": {"id": "c"}}')
    assert put.returncode == 0, put.stderr
    head = json.loads(cli("head", "c").stdout)
    assert head["expires_at_ms"] > now_ms()
    assert cli("checkpoint", "put", "kv", "k", '{"v": 1}', "--ttl", "3").returncode == 0
    meta = json.loads(cli("checkpoint", "get", "kv", "k", "--meta").stdout)
    assert meta["value"] == {"v": 1} and meta["expires_at_ms"] > 0
    exported = cli("export").stdout
    lines = [json.loads(line) for line in exported.splitlines()]
    assert {(d["kind"], d["id"]): d.get("expires_at_ms") for d in lines} == {
        ("session", "c"): head["expires_at_ms"], ("kv", "k"): meta["expires_at_ms"],
    }  # fmt: skip
    # by the time it is imported, "k" has expired: its line says so (the import reads the
    # importer's clock)
    exported = exported.replace(str(meta["expires_at_ms"]), str(now_ms() - 1000))
    target = DaemonProcess(Path(tempfile.mkdtemp(prefix="ss-", dir="/tmp")))
    target.start()
    try:
        command = [sys.executable, "-m", "sessionstore.tools.cli", "--socket",
                   target.socket_path, "--json", "import"]  # fmt: skip
        result = subprocess.run(command, input=exported, capture_output=True, text=True)
        summary = json.loads(result.stdout)
        assert (summary["imported"], summary["expired"]) == (1, 1), result.stderr
        with target.client() as client:
            moved = client.call("head", session_id="c")["expires_at_ms"]
            assert abs(moved - head["expires_at_ms"]) < 1000  # the time it had left
            assert client.checkpoint_get("kv", "k") is None
    finally:
        target.stop()
        target.cleanup()
    assert json.loads(cli("persist", "c").stdout)["found"] is True
    assert "expires_at_ms" not in json.loads(cli("head", "c").stdout)
    assert cli("expire", "c", "60").returncode == 0
    assert json.loads(cli("head", "c").stdout)["expires_at_ms"] > now_ms()
    missing = cli("expire", "--kind", "kv", "gone", "5")
    assert missing.returncode == 3 and json.loads(missing.stdout)["found"] is False
    assert cli("expire", "c", "-1").returncode == 2  # a usage error, before any request


def test_on_postgresql_one_daemon_sweeps_and_another_takes_over(
    postgres: PostgresServer, short_tmp: Path
) -> None:
    url = postgres.url(postgres.create_database())
    hosts = [DaemonProcess(short_tmp / f"h{n}", url) for n in range(2)]
    for host in hosts:
        (short_tmp / host.workdir.name).mkdir()
        host.start()
    try:
        with hosts[0].client() as client:
            start = client.stats()["seq"]
            client.txn([
                {"op": "put", "kind": "kv", "key": f"a/{n}", "value": {}, "ttl_s": 0.3}
                for n in range(20)
            ])  # fmt: skip
            events = _expired_events(client, start, 20)
        assert sorted(e["key"] for e in events) == sorted(f"a/{n}" for n in range(20))
        swept = [h.client().stats()["expirations"] for h in hosts]
        assert sorted(swept) == [0, 20]  # one daemon swept them all, each once
        sweeper = swept.index(20)
        hosts[sweeper].kill9()
        other = hosts[1 - sweeper]
        with other.client() as client:
            seq = client.stats()["seq"]
            client.checkpoint_put("kv", "b", {}, ttl_s=0.3)
            [event] = _expired_events(client, seq, 1)  # the other one took over
            assert event["key"] == "b" and client.stats()["expirations"] == 1
    finally:
        for host in hosts:
            host.stop()


def test_a_read_may_refresh_the_expiry_of_what_it_finds(running: DaemonProcess) -> None:
    with running.client() as client:
        client.save(_snapshot("r"), ttl_s=60)
        client.save(_snapshot("plain"))
        client.checkpoint_put("kv", "a", {"v": 1}, ttl_s=60)
        client.checkpoint_put("kv", "b", {"v": 2})
        lease = client.lease_acquire("someone")  # a refresh changes no content: not fenced
        before = client.call("head", session_id="r")
        loaded = client.call("load", session_id="r", refresh_ttl_s=7200)
        assert loaded["expires_at_ms"] > before["expires_at_ms"] + 3_000_000
        after = client.call("head", session_id="r")
        assert after["expires_at_ms"] == loaded["expires_at_ms"]
        assert after["digest"] == before["digest"] and after["seq"] > before["seq"]
        plain = client.call("load", session_id="plain", refresh_ttl_s=7200)
        assert "expires_at_ms" not in plain  # what does not expire is left so
        got = client.call("checkpoint_get", kind="kv", key="a", refresh_ttl_s=100)
        assert got["expires_at_ms"] < loaded["expires_at_ms"]  # set, not only extended
        page = client.call("checkpoint_scan", kind="kv", refresh_ttl_s=7200)["items"]
        assert [i.get("expires_at_ms", 0) > got["expires_at_ms"] for i in page] == [True, False]
        assert (
            client.call("checkpoint_get", kind="kv", key="a")["expires_at_ms"]
            == page[0]["expires_at_ms"]
        )
        through_methods = client.load_with_meta("r", refresh_ttl_s=60)
        assert through_methods["expires_at_ms"] < loaded["expires_at_ms"]
        assert client.load("r", refresh_ttl_s=7200) == _snapshot("r")  # the snapshot alone
        assert client.call("head", session_id="r")["expires_at_ms"] > loaded["expires_at_ms"]
        assert client.checkpoint_get("kv", "a", refresh_ttl_s=60) == {"v": 1}
        assert client.checkpoint_scan("kv", refresh_ttl_s=60)["items"][0]["key"] == "a"
        for bad in (0, -5, math.nan, "1"):
            with pytest.raises(SessionStoreError) as refused:
                client.call("load", session_id="r", refresh_ttl_s=bad)
            assert refused.value.code == "bad_request"
        client.lease_release("someone", lease["epoch"])


def test_on_postgresql_expiry_survives_a_restart_and_a_backup_restored_into_a_log(
    postgres: PostgresServer, short_tmp: Path
) -> None:
    daemon = DaemonProcess(short_tmp, postgres.url(postgres.create_database()))
    daemon.start()
    try:
        with daemon.client() as client:
            client.save(_snapshot("p"), ttl_s=3600)
            client.checkpoint_put("kv", "k", {"v": 1}, ttl_s=3600)
            wanted = client.call("head", session_id="p")["expires_at_ms"]
        assert daemon.stop() == 0
        daemon.start()
        with daemon.client() as client:
            assert client.call("head", session_id="p")["expires_at_ms"] == wanted
        backup = take_backup(daemon, short_tmp / "p.bak")
    finally:
        daemon.stop()
    with restored_client(backup) as client:
        assert client.call("head", session_id="p")["expires_at_ms"] == wanted
        assert client.call("checkpoint_get", kind="kv", key="k")["expires_at_ms"] > 0


def test_the_clock_moves_forward_only_on_a_daemon_started_to_let_it(
    daemon: DaemonProcess,
) -> None:
    daemon.start(env={"SESSIONSTORED_UNSAFE_SETTABLE_CLOCK": "0"})
    with daemon.client() as client, pytest.raises(BadRequest, match="--UNSAFE-settable-clock"):
        client.call("advance_clock", by_ms=1)
    assert daemon.stop() == 0
    daemon.start("--UNSAFE-settable-clock", env={"SESSIONSTORED_UNSAFE_SETTABLE_CLOCK": "0"})
    with daemon.client() as client:
        client.save(_snapshot("brief"), ttl_s=3600)
        before = client.call("advance_clock", by_ms=0)["now_ms"]
        after = client.call("advance_clock", by_ms=3_600_000)["now_ms"]
        assert after >= before + 3_600_000
        assert client.load("brief") is None  # an hour later by the daemon's clock
        for bad in (-1, 1.5, "1", None, True):
            with pytest.raises(BadRequest, match="by_ms"):
                client.call("advance_clock", by_ms=bad)
