# Crashes of a real daemon: the S-PE-01 port, every failpoint of the contract,
# and kill -9 in the middle of concurrent writers. After every restart the
# last acknowledged generation must be there, whole, and verify must be clean.
from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import cbor2
import pytest

from sessionstore import snapshot_digest
from sessionstore.client import Client
from sessionstore.errors import ConnectionLost, IOFailure, SessionStoreError
from sessionstore.reply_types import Generation
from sessionstore.wire.canonical import canonical_dumps
from sessionstore.wire.protocol import NEED_DATA, Connection, Mode
from sessionstored.exit_codes import ExitCode

from .conftest import DaemonProcess, alive, descendants, snapshot
from .waiting import until

pytestmark = pytest.mark.log_only  # the log's failpoints and kill -9 recovery

COMMIT_POINTS = ("before-intent", "after-intent", "before-commit-record", "after-commit-record")
RENAME_POINTS = ("before-rename", "after-rename")
# Crashed at or before this one, a batch is rolled back; at it, it is durable.
DURABLE_FROM = COMMIT_POINTS.index("after-commit-record")


def _generation(name: str, prompt: str) -> dict:
    snap = snapshot("test-session-1", config={"name": name, "system_prompt": prompt})
    snap["trace_events"] = [{"generation": name}]
    return snap


def _temp_files(daemon: DaemonProcess) -> list[str]:
    return [n for n in os.listdir(daemon.state_dir / "tmp") if not n.startswith("spare-")]


def test_s_pe_01_forty_generations_five_crashes_after_intent(daemon: DaemonProcess) -> None:
    crashes = 0
    for cycle in range(40):
        generation, prompt = f"GEN-{cycle:02}", f"PROMPT-{cycle:02}"
        staged_crash = cycle % 8 == 0
        env = {"SESSIONSTORED_FAILPOINTS": "after-intent=crash@2"} if staged_crash else {}
        daemon.start(env=env)
        durable = _generation(generation, prompt)
        with daemon.client() as client:
            assert client.save(durable)["digest"] == snapshot_digest(durable)
            if staged_crash:
                torn = _generation(f"TORN-{cycle:02}", prompt)
                with pytest.raises(ConnectionLost):
                    client.save(torn)
                assert daemon.wait_exit() == -9
                crashes += 1
        if not staged_crash:
            assert daemon.stop() == 0
        daemon.start()
        with daemon.client() as client:
            loaded = client.load_with_meta("test-session-1")
            assert loaded["digest"] == snapshot_digest(durable), f"cycle {cycle}"
            assert loaded["snapshot"]["session"]["config"]["name"] == generation
            assert loaded["snapshot"]["session"]["config"]["system_prompt"] == prompt
            assert client.verify()["problems"] == []
            recovery = client.stats()["recovery"]
            if staged_crash:
                # the torn generation's intent reached the log, with no commit record
                assert recovery["rolled_back"] == 1 and recovery["torn_tail"] is not None
        assert _temp_files(daemon) == []
        assert daemon.stop() == 0
    assert crashes == 5


@pytest.mark.parametrize("point", COMMIT_POINTS)
def test_crash_at_every_commit_failpoint(daemon: DaemonProcess, point: str) -> None:
    first, second = snapshot("fp", gen=1), snapshot("fp", gen=2)
    daemon.start(env={"SESSIONSTORED_FAILPOINTS": f"{point}=crash@2"})
    with daemon.client() as client:
        acked = client.save(first)
        with pytest.raises(ConnectionLost):
            client.save(second)
    assert daemon.wait_exit() == -9
    daemon.start()
    expected = second if COMMIT_POINTS.index(point) >= DURABLE_FROM else first
    with daemon.client() as client:
        loaded = client.load_with_meta("fp")
        assert loaded["snapshot"] == expected
        assert loaded["seq"] == (2 if expected is second else acked["seq"])
        after = client.save(snapshot("fp", gen=3))
        assert after["seq"] == loaded["seq"] + 1
        assert client.verify()["problems"] == []
    assert _temp_files(daemon) == []


@pytest.mark.parametrize("point", COMMIT_POINTS)
def test_error_at_every_commit_failpoint(daemon: DaemonProcess, point: str) -> None:
    first, second, third = (snapshot("fp", gen=n) for n in (1, 2, 3))
    daemon.start(env={"SESSIONSTORED_FAILPOINTS": f"{point}=error@2"})
    undoable = COMMIT_POINTS.index(point) < DURABLE_FROM
    with daemon.client() as client:
        client.save(first)
        with pytest.raises(IOFailure):
            client.save(second)
        if undoable:
            # the batch was rewound: the daemon goes on, seq is not consumed
            assert client.load("fp") == first
            assert client.save(third)["seq"] == 2
            daemon.stop()
            daemon.start()
            with daemon.client() as again:
                assert again.load("fp") == third
                assert again.stats()["recovery"]["corruption"] == []
                assert again.verify()["problems"] == []
            return
    # durable but unanswered: the daemon fails stop, and recovery keeps the batch
    assert daemon.wait_exit() == ExitCode.STORAGE_FAILURE
    assert f"exiting with status {int(ExitCode.STORAGE_FAILURE)}" in daemon.log()
    daemon.start()
    with daemon.client() as client:
        assert client.load_with_meta("fp")["snapshot"] == second
        assert client.save(third)["seq"] == 3
        assert client.verify()["problems"] == []


def _compactable(client: Client) -> dict[str, dict]:
    """Two segments' worth of data (--segment-mib 1), most of the first one dead."""
    kept = {f"kept-{n}": snapshot(f"kept-{n}", blob="k" * 20_000) for n in range(10)}
    for snap in kept.values():
        client.save(snap)
    for n in range(60):
        client.save(snapshot("churn", n=n, blob="c" * 20_000))
    kept["churn"] = snapshot("churn", n=59, blob="c" * 20_000)
    return kept


def test_large_saves_preallocate_the_log_and_survive_kill_9(daemon: DaemonProcess) -> None:
    daemon.start("--segment-mib", "1")
    with daemon.client() as client:
        for n in range(60):  # commits of ~60 KB: new segments are preallocated, not zero-filled
            client.save(snapshot("large", n=n, blob="b" * 60_000))
        client.save(small := snapshot("small", n=1))
        stats = client.stats()
    made, seq = stats["log_segments_made"], stats["seq"]
    assert made["preallocated"] >= 1, made
    daemon.kill9()
    daemon.start("--segment-mib", "1")
    with daemon.client() as client:
        assert client.load("large") == snapshot("large", n=59, blob="b" * 60_000)
        assert client.load("small") == small
        assert client.stats()["seq"] == seq
        assert client.verify()["problems"] == []


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("point", RENAME_POINTS)
def test_crash_at_every_rename_failpoint_of_compaction(
    daemon: DaemonProcess, point: str, nth: int
) -> None:
    # pass 1: the compacted segment; 2 and 3: the two copies of the index checkpoint
    daemon.start("--segment-mib", "1", env={"SESSIONSTORED_FAILPOINTS": f"{point}=crash@{nth}"})
    with daemon.client() as client:
        kept = _compactable(client)
        seq = client.stats()["seq"]
        with pytest.raises(ConnectionLost):
            client.compact()
    assert daemon.wait_exit() == -9
    daemon.start("--segment-mib", "1")
    with daemon.client() as client:
        for session_id, snap in kept.items():
            assert client.load(session_id) == snap, session_id
        assert client.stats()["seq"] == seq
        assert client.verify()["problems"] == []
        client.compact()
        assert client.verify()["problems"] == []
    assert _temp_files(daemon) == []


@pytest.mark.parametrize("point", RENAME_POINTS)
def test_error_at_a_rename_failpoint_of_compaction(daemon: DaemonProcess, point: str) -> None:
    daemon.start("--segment-mib", "1", env={"SESSIONSTORED_FAILPOINTS": f"{point}=error@1"})
    with daemon.client() as client:
        kept = _compactable(client)
        with pytest.raises(IOFailure):
            client.compact()  # before-rename: nothing changed; after-rename: nothing applied
        for session_id, snap in kept.items():
            assert client.load(session_id) == snap
        assert client.compact()["seq"] == client.stats()["seq"]
        assert client.verify()["problems"] == []
    assert daemon.stop() == 0
    daemon.start("--segment-mib", "1")
    with daemon.client() as client:
        assert client.stats()["recovery"]["corruption"] == []
        for session_id, snap in kept.items():
            assert client.load(session_id) == snap
    assert _temp_files(daemon) == []


def test_hang_blocks_writes_but_reads_are_served(daemon: DaemonProcess) -> None:
    daemon.start(env={"SESSIONSTORED_FAILPOINTS": "before-intent=hang@2"})
    with daemon.client() as client:
        client.save(snapshot("h", gen=1))
    stuck = daemon.client(timeout=1.0)
    with pytest.raises(ConnectionLost):
        stuck.save(snapshot("h", gen=2))
    stuck.close()
    with daemon.client(timeout=10) as reader:
        reader.ping()
        assert reader.load("h") == snapshot("h", gen=1)
    daemon.kill9()
    daemon.start()
    with daemon.client() as client:
        assert client.load("h") == snapshot("h", gen=1)
        assert client.verify()["problems"] == []


def test_a_slow_disk_is_waited_for_through_the_loop_not_on_it(daemon: DaemonProcess) -> None:
    """Every commit 20 ms slower: after the first (waited for on the loop for at most
    a moment, then through trio), no commit is waited for on the loop."""
    daemon.start(env={"SESSIONSTORED_FAILPOINTS": "before-commit-record=slow"})
    with daemon.client() as client, daemon.client() as reader:
        for gen in range(1, 5):
            assert client.save(snapshot("slow", gen=gen))["seq"] == gen
            reader.ping()
        stats = client.stats()
        assert stats["batches"] == 4
        assert stats["batches_waited_on_loop"] == 0
        assert client.load("slow") == snapshot("slow", gen=4)


def _writer_loop(
    daemon: DaemonProcess,
    worker: int,
    stop: threading.Event,
    acked: dict[str, int],
    inflight: dict[str, int],
) -> None:
    session_id = f"writer-{worker}"
    generation = 0
    try:
        with daemon.client(timeout=10) as client:
            while not stop.is_set():
                generation += 1
                inflight[session_id] = generation
                client.save(snapshot(session_id, gen=generation, pad="p" * (worker * 97)))
                acked[session_id] = generation
    except SessionStoreError:
        return


def _start_writers(
    daemon: DaemonProcess, count: int
) -> tuple[dict[str, int], dict[str, int], threading.Event, list[threading.Thread]]:
    """count writer threads, each saving its own session; (acked, inflight, stop, threads)."""
    acked: dict[str, int] = {}
    inflight: dict[str, int] = {}
    stop = threading.Event()
    threads = [
        threading.Thread(target=_writer_loop, args=(daemon, n, stop, acked, inflight))
        for n in range(count)
    ]
    for thread in threads:
        thread.start()
    return acked, inflight, stop, threads


@pytest.mark.parametrize("round_", range(3))
def test_kill9_under_16_concurrent_writers_loses_nothing(
    daemon: DaemonProcess, round_: int
) -> None:
    daemon.start()
    acked, inflight, stop, threads = _start_writers(daemon, 16)
    deadline = time.monotonic() + 10
    while len(acked) < 16 or min(acked.values()) < 5 + round_ * 3:
        assert time.monotonic() < deadline, f"writers made no progress: {acked}"
        time.sleep(0.01)
    daemon.kill9()
    stop.set()
    for thread in threads:
        thread.join(10)
    daemon.start()
    with daemon.client() as client:
        for session_id, generation in acked.items():
            loaded = client.load(session_id)
            assert loaded is not None, session_id
            # the acknowledged generation, or the one in flight when the daemon died
            assert loaded["session"]["gen"] in (generation, inflight[session_id]), session_id
        assert client.verify()["problems"] == []
        assert client.stats()["seq"] >= sum(acked.values())


def test_recovery_twice_equals_once(daemon: DaemonProcess) -> None:
    daemon.start(env={"SESSIONSTORED_FAILPOINTS": "before-commit-record=crash@3"})
    with daemon.client() as client:
        client.save(snapshot("r", gen=1))
        client.save(snapshot("r", gen=2))
        with pytest.raises(ConnectionLost):
            client.save(snapshot("r", gen=3))
    daemon.wait_exit()
    daemon.start()
    with daemon.client() as client:
        once = (client.load_with_meta("r"), client.stats()["seq"])
        assert client.stats()["recovery"]["rolled_back"] == 1
        assert client.verify()["problems"] == []
    assert daemon.stop() == 0
    daemon.start()
    with daemon.client() as client:
        twice = (client.load_with_meta("r"), client.stats()["seq"])
        recovery = client.stats()["recovery"]
        assert recovery["rolled_back"] == 0 and recovery["torn_tail"] is None
        assert client.verify()["problems"] == []
    assert once == twice


def test_kill9_during_compaction_under_load_loses_nothing(daemon: DaemonProcess) -> None:
    # the compacted segment's temp file is written and synced, and its rename (the first
    # rewrite of this store) hangs: the compaction is certainly half done when killed
    daemon.start("--segment-mib", "1", env={"SESSIONSTORED_FAILPOINTS": "before-rename=hang@1"})
    with daemon.client() as client:
        kept = _compactable(client)
    acked, inflight, stop, threads = _start_writers(daemon, 8)
    until(lambda: len(acked) == 8 and min(acked.values()) >= 3, "every writer saving")
    compacting = daemon.client(timeout=30)

    def compact() -> None:
        with contextlib.suppress(SessionStoreError):
            compacting.compact()

    compactor = threading.Thread(target=compact)
    compactor.start()
    until(lambda: any(".seg" in n for n in _temp_files(daemon)), "compaction's rename")
    daemon.kill9()
    stop.set()
    for thread in [*threads, compactor]:
        thread.join(10)
    compacting.close()
    daemon.start("--segment-mib", "1")
    with daemon.client() as client:
        assert client.stats()["recovery"]["corruption"] == []
        for session_id, snap in kept.items():
            assert client.load(session_id) == snap
        for session_id, generation in acked.items():
            loaded = client.load(session_id)
            assert loaded is not None and loaded["session"]["gen"] in (
                generation,
                inflight[session_id],
            )
        assert client.verify()["problems"] == []


MIXED_SNAPSHOT_PAD_BYTES = (10, 4 * 1024, 60 * 1024)
MIXED_WRITERS, MIXED_SESSIONS = 16, 32
MIXED_QUIET_EVERY = 8
# small segments, two earlier generations kept and compaction at a tenth dead: automatic
# compactions come every few hundred saves, their copying overlapping the writers' saves
MIXED_OPTIONS = ("--segment-mib", "1", "--keep-generations", "2", "--compact-dead-share", "0.1")


def _mixed_writer(
    daemon: DaemonProcess,
    worker: int,
    round_: int,
    stop: threading.Event,
    acked: dict[str, str],
    inflight: dict[str, str],
    written: set[str],
) -> None:
    """Saves of 10 B, 4 KiB and 60 KiB, mixed, to the worker's two sessions: a busy one,
    and a quiet one saved once in MIXED_QUIET_EVERY, whose current generation ages into
    the segments compaction picks while the writers go on."""
    choices = random.Random(f"{round_}-{worker}")
    busy, quiet = f"s{worker}", f"s{worker + MIXED_WRITERS}"
    saves = 0
    try:
        with daemon.client(timeout=10) as client:
            while not stop.is_set():
                session_id = quiet if choices.randrange(MIXED_QUIET_EVERY) == 0 else busy
                saves += 1
                tag = f"{round_}-{saves}"
                pad = "p" * choices.choice(MIXED_SNAPSHOT_PAD_BYTES)
                snap = snapshot(session_id, tag=tag, pad=pad)
                written.add(snapshot_digest(snap))
                inflight[session_id] = tag
                client.save(snap)
                acked[session_id] = tag
    except SessionStoreError:
        return


def _stat_reaches(client: Client, name: str, value: int) -> Callable[[], bool]:
    return lambda: client.stats()[name] >= value


def _assert_every_listed_generation_loads(client: Client, written: set[str]) -> int:
    """Each generation `history` lists loads at its seq, as written; returns how many."""
    generations = 0
    for n in range(MIXED_SESSIONS):
        session_id = f"s{n}"
        listed: list[Generation] = client.history(session_id)
        for generation in listed:
            loaded = client.load_with_meta(session_id, at=generation["seq"])
            assert loaded["seq"] == generation["seq"], (session_id, generation)
            assert loaded["digest"] == generation["digest"] in written, (session_id, generation)
            assert snapshot_digest(loaded["snapshot"]) == generation["digest"]
        generations += len(listed)
    return generations


def test_kill9_under_mixed_writers_keeps_every_listed_generation_readable(
    daemon: DaemonProcess,
) -> None:
    """16 writers on 32 sessions, kill -9 at a random moment after automatic compactions,
    a few rounds: every acknowledged save loads, verify is clean, and every generation
    `history` offers loads at its seq."""
    written: set[str] = set()
    acked: dict[str, str] = {}
    for round_ in range(4):
        moment = random.Random(round_)
        daemon.start(*MIXED_OPTIONS)
        stop = threading.Event()
        inflight: dict[str, str] = {}
        threads = [
            threading.Thread(
                target=_mixed_writer, args=(daemon, n, round_, stop, acked, inflight, written)
            )
            for n in range(MIXED_WRITERS)
        ]
        for thread in threads:
            thread.start()
        with daemon.client() as watcher:
            compactions = 1 + moment.randrange(3)
            until(_stat_reaches(watcher, "compactions", compactions), "compactions")
            seq = watcher.stats()["seq"] + moment.randrange(200)  # the random moment
            until(_stat_reaches(watcher, "seq", seq), "saves after the compactions")
        daemon.kill9()
        stop.set()
        for thread in threads:
            thread.join(10)
        daemon.start(*MIXED_OPTIONS)
        with daemon.client() as client:
            assert client.stats()["recovery"]["corruption"] == []
            assert client.verify()["problems"] == [], f"round {round_}"
            for session_id, tag in acked.items():
                loaded = client.load(session_id)
                assert loaded is not None, session_id
                assert loaded["session"]["tag"] in (tag, inflight.get(session_id)), session_id
                acked[session_id] = loaded["session"]["tag"]  # an unanswered save may be in
            assert _assert_every_listed_generation_loads(client, written) > MIXED_SESSIONS
        assert daemon.stop() == 0


def test_the_worker_processes_die_with_a_killed_daemon(daemon: DaemonProcess) -> None:
    """kill -9 of the daemon: its fork server, workers and resource tracker go too."""
    daemon.start()
    assert daemon.proc is not None
    # 200 KiB with floats and keys out of order: canonicalised in a worker
    snap = snapshot("w", events=[{"b": n, "a": 0.5} for n in range(20_000)])
    request = cbor2.dumps({"op": "save", "snapshot": snap})
    with Client(daemon.socket_path) as client:
        client.ping()
    reply = _raw_request(daemon.socket_path, request)
    assert reply["ok"], reply
    children = descendants(daemon.proc.pid)
    assert len(children) >= 3, children  # the fork server, a worker, the resource tracker
    daemon.kill9()  # which checks that every process below the daemon is gone too
    assert not [pid for pid in children if alive(pid)]
    daemon.start()  # and the next daemon starts its own
    with daemon.client() as client:
        assert client.load("w") == cbor2.loads(canonical_dumps(snap))
        assert client.verify()["problems"] == []


def _raw_request(path: str, data: bytes) -> Any:
    conn = Connection(max_message_bytes=1 << 26, mode=Mode.CBOR)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(60)
        sock.connect(path)
        sock.sendall(data)
        while (message := conn.next_message()) is NEED_DATA:
            conn.receive_data(sock.recv(65536))
    return message
