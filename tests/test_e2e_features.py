# The rest of the contract against a real daemon: update, fork, checkpoints,
# leases with fencing, watch, compaction, persistence across restarts.
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import cbor2
import pytest

from sessionstore import Conflict, InvalidSnapshot, NotFound, snapshot_digest
from sessionstore.client import Client
from sessionstore.errors import BadRequest, Compacted, Fenced
from sessionstore.wire.protocol import NEED_DATA, Connection, Mode

from .conftest import DaemonProcess, snapshot


def _rich(session_id: str) -> dict:
    snap = snapshot(session_id, config={"workspace": "/old", "name": "n"})
    snap["run_records"] = [
        {
            "snapshot": {"id": "run-1", "session_id": session_id, "event_count": 2},
            "events": [{"sequence": 0}, {"sequence": 1}],
        },
    ]
    snap["subagent_tasks"] = [
        {"id": "t1", "parent_session_id": session_id},
        {"id": "t2", "parent_session_id": ""},
    ]
    snap["artifacts"] = [{"uri": "file:///a"}]
    return snap


def test_hello_reports_capabilities(running: DaemonProcess) -> None:
    with running.client() as client:
        capabilities = client.hello()["capabilities"]
    assert capabilities == {
        "atomic_session_snapshots": True,
        "aggregate_cas": True,
        "append_only_event_log": True,
        "lease_fencing": True,
        "encrypted_at_rest": False,
        "watch": True,
        "keyed_documents": True,
        "txn": True,
        "txn_keep": True,
        "expiry": True,
        "vector_rank": True,
        "history": True,
    }


def test_update_replaces_one_component(running: DaemonProcess) -> None:
    with running.client() as client:
        with pytest.raises(NotFound):
            client.update("u", "artifacts", [])
        created = client.update("u", "session", {"id": "u", "name": "made by update"})
        assert client.load("u") == {
            "schema_version": 1,
            "session": {"id": "u", "name": "made by update"},
        }
        updated = client.update("u", "trace_events", [{"n": 1}], expect=created["digest"])
        expected = {
            "schema_version": 1,
            "session": {"id": "u", "name": "made by update"},
            "trace_events": [{"n": 1}],
        }
        assert client.load("u") == expected
        assert updated["digest"] == snapshot_digest(expected)
        assert updated["seq"] == created["seq"] + 1
        with pytest.raises(Conflict):
            client.update("u", "artifacts", [], expect=created["digest"])
        with pytest.raises(BadRequest):
            client.update("u", "not_a_component", [])
        with pytest.raises(InvalidSnapshot):
            client.update("u", "artifacts", {"not": "an array"})
        with pytest.raises(InvalidSnapshot):
            client.update("u", "session", {"id": "someone-else"})
        with pytest.raises(InvalidSnapshot):
            client.update("u", "run_records", [{"snapshot": {"id": "r", "session_id": "other"}}])
        assert client.load("u") == expected


def test_concurrent_updates_of_different_components_lose_nothing(running: DaemonProcess) -> None:
    with running.client() as client:
        client.save(snapshot("race"))
    components = ["artifacts", "trace_events", "verification_reports", "retained_artifact_uris"]
    rounds = 25

    def updater(component: str) -> None:
        with running.client() as client:
            for n in range(rounds):
                value = (
                    [f"{component}-{n}"] if component == "retained_artifact_uris" else [{"n": n}]
                )
                client.update("race", component, value)

    threads = [threading.Thread(target=updater, args=(c,)) for c in components]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    with running.client() as client:
        final = client.load("race")
    assert final["artifacts"] == [{"n": rounds - 1}]
    assert final["trace_events"] == [{"n": rounds - 1}]
    assert final["verification_reports"] == [{"n": rounds - 1}]
    assert final["retained_artifact_uris"] == [f"retained_artifact_uris-{rounds - 1}"]


def test_fork_rebinds_ownership(running: DaemonProcess) -> None:
    with running.client() as client:
        client.save(_rich("parent"))
        result = client.fork("parent", "child", "/new/workspace")
        child = client.load("child")
        assert result["digest"] == snapshot_digest(child)
        assert child["session"]["id"] == "child"
        assert child["session"]["config"] == {"workspace": "/new/workspace", "name": "n"}
        assert child["run_records"][0]["snapshot"]["session_id"] == "child"
        assert [t["parent_session_id"] for t in child["subagent_tasks"]] == ["child", ""]
        assert child["artifacts"] == [{"uri": "file:///a"}]
        assert client.load("parent") == _rich("parent")
        with pytest.raises(Conflict):
            client.fork("parent", "child", "/elsewhere")
        with pytest.raises(NotFound):
            client.fork("nobody", "orphan", "/w")
        assert not client.exists("orphan")


def test_checkpoints_overwrite_and_idempotent_delete(running: DaemonProcess) -> None:
    with running.client() as client:
        first = client.checkpoint_put("loop", "run-1", {"run_id": "run-1", "step": 1})
        second = client.checkpoint_put("loop", "run-1", {"run_id": "run-1", "step": 2})
        assert second["seq"] == first["seq"] + 1
        client.checkpoint_put("workflow", "run-1", {"workflow_id": "run-1", "stage": "b"})
        assert client.checkpoint_get("loop", "run-1") == {"run_id": "run-1", "step": 2}
        assert client.checkpoint_get("workflow", "run-1") == {"workflow_id": "run-1", "stage": "b"}
        assert client.checkpoint_get("loop", "absent") is None
        with pytest.raises(BadRequest):
            client.checkpoint_put("loop", "run-2", {"run_id": "run-3"})
        with pytest.raises(BadRequest):
            client.checkpoint_put("workflow", "w", {"workflow_id": "x"})
        with pytest.raises(BadRequest):
            client.checkpoint_put("sideways", "k", {})
        assert client.checkpoint_delete("loop", "run-1") is True
        assert client.checkpoint_delete("loop", "run-1") is False
        assert client.checkpoint_get("loop", "run-1") is None
        assert client.stats()["sessions"] == 0
    running.stop()
    running.start()
    with running.client() as client:
        assert client.checkpoint_get("workflow", "run-1") == {"workflow_id": "run-1", "stage": "b"}


def _settled_seq(client: Client, at_least: int) -> int:
    """The daemon's seq once it has reached at_least (or after 10 s): on PostgreSQL a
    daemon learns its seq from the changes table, a moment after each commit."""
    deadline = time.monotonic() + 10
    while (seq := client.stats()["seq"]) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)
    return int(seq)


def test_lease_takeover_fences_the_stale_holder(running: DaemonProcess) -> None:
    with running.client() as client:
        client.save(snapshot("doc"))
        client.checkpoint_put("loop", "r", {"step": 0})
        first = client.lease_acquire("agent-a")
        assert first["holder"] == "agent-a" and first["epoch"] == 1
        assert client.lease_get() == {k: first[k] for k in ("holder", "epoch", "acquired_at_ms")}
        with pytest.raises(Fenced) as no_lease:
            client.save(snapshot("doc", v=1))
        assert no_lease.value.details["epoch"] == 1
        client.save(snapshot("doc", v=1), lease=first)
        second = client.lease_acquire("agent-b")
        assert second["epoch"] == 2
        stale = [
            lambda: client.save(snapshot("doc", v=2), lease=first),
            lambda: client.delete("doc", lease=first),
            lambda: client.update("doc", "artifacts", [], lease=first),
            lambda: client.fork("doc", "doc2", "/w", lease=first),
            lambda: client.checkpoint_put("loop", "r", {"step": 9}, lease=first),
            lambda: client.checkpoint_delete("loop", "r", lease=first),
        ]
        seq_before = _settled_seq(client, 5)  # five writes so far
        for attempt in stale:
            with pytest.raises(Fenced) as fenced:
                attempt()
            assert fenced.value.details["epoch"] == 2
        assert client.stats()["seq"] == seq_before, "a fenced write must write nothing"
        assert client.load("doc") == snapshot("doc", v=1)
        assert client.checkpoint_get("loop", "r") == {"step": 0}
        client.save(snapshot("doc", v=3), lease=second)
        assert _settled_seq(client, seq_before + 1) == seq_before + 1  # only this one wrote
        assert client.lease_release("agent-a", 1) is False
        assert client.lease_release("agent-b", 2) is True
        assert client.lease_get() is None
        with pytest.raises(Fenced):
            client.save(snapshot("doc", v=4), lease=second)
        client.save(snapshot("doc", v=4))
        assert client.lease_acquire("agent-c")["epoch"] == 3
    running.stop()
    running.start()
    with running.client() as client:
        assert client.lease_get()["holder"] == "agent-c"
        assert client.lease_acquire("agent-d")["epoch"] == 4


def test_watch_reports_every_durable_change_in_order(running: DaemonProcess) -> None:
    events: list[dict] = []
    ready = threading.Event()

    def watch() -> None:
        with running.client() as watcher:
            for event in watcher.watch():
                events.append(event)
                if len(events) == 1:
                    ready.set()
                if len(events) >= 6:
                    return

    with running.client() as client:
        start_seq = client.stats()["seq"]
        thread = threading.Thread(target=watch)
        thread.start()
        first = client.save(snapshot("w1"))
        ready.wait(10)
        digests = [first["digest"], client.save(snapshot("w1", v=2))["digest"]]
        client.delete("w1")
        client.checkpoint_put("loop", "k", {"a": 1})
        client.checkpoint_delete("loop", "k")
        client.lease_acquire("h")
    thread.join(20)
    assert [e["seq"] for e in events] == list(range(start_seq + 1, start_seq + 7))
    assert [e["event"] for e in events] == [
        "commit",
        "commit",
        "delete",
        "checkpoint",
        "checkpoint",
        "lease",
    ]
    assert [e["digest"] for e in events[:2]] == digests
    assert events[2]["session_id"] == "w1"
    assert events[3]["kind"] == "loop" and events[3]["key"] == "k" and not events[3]["deleted"]
    assert events[4]["deleted"] is True
    assert all(e["committed_at_ms"] > 0 for e in events)


def test_watch_since_replays_history_and_survives_restart(running: DaemonProcess) -> None:
    with running.client() as client:
        saved = [client.save(snapshot(f"h{n}")) for n in range(5)]
    running.stop()
    running.start()
    with running.client() as client:
        replay = []
        for event in client.watch(since=saved[1]["seq"]):
            replay.append(event)
            if len(replay) == 3:
                break
    assert [e["seq"] for e in replay] == [s["seq"] for s in saved[2:]]
    assert [e["digest"] for e in replay] == [s["digest"] for s in saved[2:]]


def test_watch_compacted_then_replay_longer_than_the_lag_limit(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp)
    try:
        daemon.start(
            "--history-changes", "5", "--watch-max-lag", "3", "--checkpoint-every", "1000000"
        )
        with daemon.client() as client:
            for n in range(12):
                client.save(snapshot(f"c{n}"))
            client.compact()
            with pytest.raises(Compacted) as compacted:
                next(iter(client.watch(since=1, reconnect=False)))
            oldest = compacted.value.details["oldest_seq"]
            assert oldest == 8
            replay = iter(client.watch(since=oldest - 1))
            assert [next(replay)["seq"] for _ in range(5)] == list(range(oldest, oldest + 5))
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()


def test_compaction_keeps_everything_and_seq_never_goes_back(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp)
    try:
        daemon.start("--checkpoint-every", "1000000", "--history-changes", "10")
        with daemon.client() as client:
            for n in range(60):
                client.save(snapshot(f"k{n % 7}", n=n))
            client.delete("k0")
            result = client.compact()
            assert result["seq"] == 61
            assert result["wal_bytes_after"] < result["wal_bytes_before"] / 2
            assert client.stats()["checkpoint_seq"] == 61
        daemon.kill9()
        daemon.start("--checkpoint-every", "20", "--history-changes", "10")
        with daemon.client() as client:
            recovery = client.stats()["recovery"]
            assert recovery["checkpoint_seq"] == 61 and recovery["records_replayed"] < 30
            assert client.stats()["seq"] == 61
            assert client.load("k0") is None
            assert client.load("k6") == snapshot("k6", n=55)
            for n in range(45):
                client.save(snapshot(f"k{n % 7}", n=100 + n))
            stats = client.stats()
            assert stats["checkpoints"] >= 2 and stats["checkpoint_seq"] >= 101
            assert client.verify()["problems"] == []
        daemon.kill9()
        daemon.start()
        with daemon.client() as client:
            assert client.stats()["seq"] == 106
            assert client.load("k1") == snapshot("k1", n=143)
            assert client.save(snapshot("k1"))["seq"] == 107
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()


def test_cli_for_the_new_ops(running: DaemonProcess) -> None:
    import json
    import subprocess
    import sys

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

    assert cli("put", "-", stdin=json.dumps(_rich("cli"))).returncode == 0
    updated = cli("update", "cli", "artifacts", '[{"uri": "x"}]')
    assert updated.returncode == 0, updated.stderr
    assert cli("fork", "cli", "cli-2", "/fork").returncode == 0
    assert json.loads(cli("get", "cli-2").stdout)["session"]["config"]["workspace"] == "/fork"
    assert cli("checkpoint", "put", "loop", "r1", '{"run_id": "r1", "n": 1}').returncode == 0
    assert json.loads(cli("checkpoint", "get", "loop", "r1").stdout) == {"run_id": "r1", "n": 1}
    assert cli("checkpoint", "get", "workflow", "r1").returncode == 3
    lease = json.loads(cli("lease", "acquire", "--holder", "ops").stdout)
    fenced = cli("checkpoint", "rm", "loop", "r1")
    assert fenced.returncode == 6 and "held by 'ops'" in fenced.stderr
    allowed = cli("checkpoint", "rm", "loop", "r1", "--lease", f"ops:{lease['epoch']}")
    assert json.loads(allowed.stdout) == {"deleted": True}
    assert json.loads(cli("lease", "get").stdout)["holder"] == "ops"
    released = cli("lease", "release", "--holder", "ops", "--epoch", str(lease["epoch"]))
    assert json.loads(released.stdout) == {"released": True}
    events = [
        json.loads(line)
        for line in cli("watch", "--since", "0", "--count", "3").stdout.splitlines()
    ]
    assert [e["seq"] for e in events] == [1, 2, 3]
    assert [e["event"] for e in events] == ["commit", "commit", "commit"]
    compacted = json.loads(cli("compact").stdout)
    assert compacted["seq"] == json.loads(cli("stats").stdout)["seq"]


def test_a_watcher_that_stops_reading_is_told_lagged_logged_counted_and_resumes(
    short_tmp: Path,
) -> None:
    daemon = DaemonProcess(short_tmp)
    try:
        daemon.start("--watch-max-lag", "50", "--history-changes", "100000")
        with socket.socket(socket.AF_UNIX) as watcher:
            watcher.connect(daemon.socket_path)
            watcher.sendall(cbor2.dumps({"op": "watch"}))
            with daemon.client() as client:
                for n in range(300):  # the watcher reads none of it meanwhile
                    client.save(snapshot(f"w{n % 5}", n=n))
                stats = client.stats()
                assert stats["watchers_cut_off"] == 1 and stats["watchers_dropped"] == 0
            watcher.settimeout(30)
            conn = Connection(mode=Mode.CBOR)
            events: list[dict[str, Any]] = []
            while not events or events[-1].get("event") != "lagged":
                while (message := conn.next_message()) is NEED_DATA:
                    conn.receive_data(watcher.recv(1 << 16))
                events.append(message)
        first, *changes, lagged = events
        assert first["watching"] is True
        seqs = [e["seq"] for e in changes]
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) <= 51
        assert lagged == {"event": "lagged", "resume_from": seqs[-1]}
        with daemon.client() as client:
            resumed = iter(client.watch(since=lagged["resume_from"]))
            rest = [next(resumed)["seq"] for _ in range(300 - seqs[-1])]
        assert rest == list(range(seqs[-1] + 1, 301)), "resuming is gapless"
        assert "watcher cut off: " in daemon.log()
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
