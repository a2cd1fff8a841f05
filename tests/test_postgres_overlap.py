# Daemons sharing one PostgreSQL commit side by side: a batch locks the
# documents it touches, not the database, and takes its seqs only as it
# commits. Here: a batch held open on one daemon does not stop another's batch
# on other documents, while one on the same document waits for it; and every
# guarantee holds when daemons race (compare-and-set, txn requirements, the
# lease fence, seq as the gapless commit order, one client's pipelined order).
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sessionstore.client import Client
from sessionstore.errors import Conflict, Fenced, SessionStoreError

from .conftest import DaemonProcess, snapshot
from .postgres_server import PostgresServer

WAIT_S = 60.0  # what a condition below is given before the test gives up on it


class Pair:
    def __init__(self, server: PostgresServer, database: str, hosts: list[DaemonProcess]):
        self.server = server
        self.database = database
        self.hosts = hosts

    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.server.url(self.database), autocommit=True) as conn:
            return conn.execute(statement).fetchall()

    def wait_for(self, statement: str, what: str) -> None:
        """Until the query answers a true first column."""
        deadline = time.monotonic() + WAIT_S
        while not self.sql(statement)[0][0]:
            assert time.monotonic() < deadline, f"never saw: {what}"
            time.sleep(0.05)


def _start(
    postgres: PostgresServer,
    short_tmp: Path,
    envs: list[dict[str, str]],
    *extra: str,
) -> Iterator[Pair]:
    database = postgres.create_database()
    hosts = []
    for number in range(len(envs)):
        workdir = short_tmp / f"d{number}"
        workdir.mkdir()
        hosts.append(DaemonProcess(workdir, postgres.url(database)))
    try:
        for host, env in zip(hosts, envs, strict=True):
            host.start(*extra, env=env)
        yield Pair(postgres, database, hosts)
    finally:
        for host in hosts:
            host.cleanup()


@pytest.fixture
def pair(postgres: PostgresServer, short_tmp: Path) -> Iterator[Pair]:
    """Each with three batches in flight: they race among themselves too."""
    yield from _start(postgres, short_tmp, [{}, {}], "--batches-in-flight", "3")


@pytest.fixture
def held_pair(postgres: PostgresServer, short_tmp: Path) -> Iterator[Pair]:
    """The first daemon's first batch stops before it takes its seqs, its rows staged and
    its locks held, until the daemon is killed."""
    hold = {"SESSIONSTORED_FAILPOINTS": "before-commit-record=hang"}
    yield from _start(postgres, short_tmp, [hold, {}])


WAITING_ON_A_DOCUMENT = (
    "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
)
HOLDING = "SELECT count(*) >= 2 FROM pg_locks WHERE locktype = 'advisory' AND granted"


def test_a_batch_held_open_stops_only_the_batches_on_its_documents(held_pair: Pair) -> None:
    held, other = held_pair.hosts
    held_reply: list[Any] = []

    def save_held() -> None:
        try:
            with held.client(timeout=WAIT_S) as client:
                held_reply.append(client.save(snapshot("held", by="first")))
        except (SessionStoreError, OSError) as error:
            held_reply.append(error)

    first = threading.Thread(target=save_held)
    first.start()
    held_pair.wait_for(HOLDING, "the first daemon's batch holding its locks")
    with other.client() as client:
        saved = client.save(snapshot("elsewhere", by="second"))  # commits meanwhile
        assert client.load("elsewhere") == snapshot("elsewhere", by="second")
        assert client.load("held") is None  # staged, not committed: nobody sees it
    done: list[Any] = []

    def save_same() -> None:
        with other.client(timeout=WAIT_S) as client:
            done.append(client.save(snapshot("held", by="second")))

    second = threading.Thread(target=save_same)
    second.start()
    held_pair.wait_for(WAITING_ON_A_DOCUMENT, "the second daemon waiting on the document")
    assert not done
    held.kill9()  # its transaction ends with its connection, never committed
    second.join(WAIT_S)
    first.join(WAIT_S)
    assert done and done[0]["seq"] == saved["seq"] + 1  # the held batch took no seq
    assert held_reply and isinstance(held_reply[0], SessionStoreError | OSError)
    with other.client() as client:
        assert client.load("held") == snapshot("held", by="second")
        assert client.verify()["problems"] == []


def _clients(pair: Pair, workers: int, work: Any) -> None:
    errors: list[BaseException] = []

    def run(number: int) -> None:
        try:
            with pair.hosts[number % len(pair.hosts)].client() as client:
                work(number, client)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 4)
    assert not errors, errors


def test_compare_and_set_across_daemons_never_loses_an_update(pair: Pair) -> None:
    workers, increments = 8, 25
    with pair.hosts[0].client() as client:
        client.save(snapshot("counter", n=0))
    conflicts = [0]

    def increment(_: int, client: Client) -> None:
        for _ in range(increments):
            while True:
                current = client.load_with_meta("counter")
                n = current["snapshot"]["session"]["n"]
                try:
                    client.save(snapshot("counter", n=n + 1), expect=current["digest"])
                    break
                except Conflict:
                    conflicts[0] += 1

    _clients(pair, workers, increment)
    for host in pair.hosts:
        with host.client() as client:
            assert client.load("counter") == snapshot("counter", n=workers * increments)


def test_txn_requirements_hold_across_daemons(pair: Pair) -> None:
    """Transfers between two documents, each a txn that requires both generations it read:
    whatever interleaves, the total stays and every acknowledged transfer counts once."""
    with pair.hosts[0].client() as client:
        client.txn(
            [
                {"op": "put", "kind": "kv", "key": "acct/a", "value": {"balance": 500}},
                {"op": "put", "kind": "kv", "key": "acct/b", "value": {"balance": 500}},
            ]
        )
    moved: list[int] = []
    lock = threading.Lock()

    def transfer(number: int, client: Client) -> None:
        for attempt in range(20):
            items = client.checkpoint_scan("kv", "acct/")["items"]
            a, b = items
            amount = 1 + (number + attempt) % 5
            try:
                client.txn(
                    [
                        {
                            "op": "put",
                            "kind": "kv",
                            "key": "acct/a",
                            "value": {"balance": a["value"]["balance"] - amount},
                        },
                        {
                            "op": "put",
                            "kind": "kv",
                            "key": "acct/b",
                            "value": {"balance": b["value"]["balance"] + amount},
                        },
                    ],
                    require=[
                        {"kind": "kv", "key": "acct/a", "digest": a["digest"]},
                        {"kind": "kv", "key": "acct/b", "digest": b["digest"]},
                    ],
                )
            except Conflict:
                continue
            with lock:
                moved.append(amount)

    _clients(pair, 8, transfer)
    assert moved
    with pair.hosts[1].client() as client:
        items = client.checkpoint_scan("kv", "acct/")["items"]
    balances = {item["key"]: item["value"]["balance"] for item in items}
    assert balances == {"acct/a": 500 - sum(moved), "acct/b": 500 + sum(moved)}


def test_seq_is_the_gapless_commit_order_across_daemons(pair: Pair) -> None:
    with pair.hosts[0].client() as client:
        start = client.stats()["seq"]
    acknowledged: list[tuple[str, int]] = []
    lock = threading.Lock()

    def save(number: int, client: Client) -> None:
        for generation in range(30):
            reply = client.save(snapshot(f"order/{number}", g=generation))
            with lock:
                acknowledged.append((f"order/{number}", reply["seq"]))

    _clients(pair, 12, save)
    total = len(acknowledged)
    for host in pair.hosts:
        events: list[dict[str, Any]] = []
        with host.client(timeout=WAIT_S) as watcher:
            for event in watcher.watch(since=start):
                events.append(event)
                if len(events) == total:
                    break
        assert [e["seq"] for e in events] == list(range(start + 1, start + total + 1))
        assert sorted((e["session_id"], e["seq"]) for e in events) == sorted(acknowledged)
    for number in range(12):  # each client's saves, in the order it made them
        seqs = [seq for session, seq in acknowledged if session == f"order/{number}"]
        assert seqs == sorted(seqs)


def test_a_lease_takeover_on_one_daemon_fences_saves_racing_on_the_other(pair: Pair) -> None:
    with pair.hosts[1].client() as holder:
        old = holder.lease_acquire("old-holder")
        start = holder.stats()["seq"]
    accepted: list[int] = []
    taken = threading.Event()
    after_takeover: list[str] = []

    def save_with_old(number: int, client: Client) -> None:
        for generation in range(200):
            was_taken = taken.is_set()
            try:
                accepted.append(
                    client.save(snapshot(f"fence/{number}", g=generation), lease=old)["seq"]
                )
            except Fenced:
                return
            if was_taken:
                after_takeover.append(f"fence/{number} g={generation}")

    writers = [
        threading.Thread(target=lambda n=n: _with_client(pair.hosts[1], n, save_with_old))
        for n in range(4)
    ]
    for writer in writers:
        writer.start()
    while len(accepted) < 20:
        time.sleep(0.01)
    with pair.hosts[0].client() as taker:
        new = taker.lease_acquire("new-holder")
    taken.set()
    for writer in writers:
        writer.join(WAIT_S)
    assert not after_takeover  # nothing with the old lease after the takeover's reply
    with pair.hosts[0].client(timeout=WAIT_S) as watcher:
        for event in watcher.watch(since=start):
            if event["event"] == "lease":
                takeover_seq = event["seq"]
                break
    assert new["epoch"] == old["epoch"] + 1
    assert all(seq < takeover_seq for seq in accepted)


def _with_client(host: DaemonProcess, number: int, work: Any) -> None:
    with host.client() as client:
        work(number, client)


def test_one_clients_pipelined_writes_apply_in_the_order_sent(pair: Pair) -> None:
    """Batches in flight on one daemon never reorder one client's writes: 64 saves of one
    session sent before any reply, among other clients' saves of other sessions."""
    stop = threading.Event()

    def background(number: int) -> None:
        with pair.hosts[0].client() as client:
            generation = 0
            while not stop.is_set():
                client.save(snapshot(f"busy/{number}", g=generation))
                generation += 1

    others = [threading.Thread(target=background, args=(n,)) for n in range(6)]
    for thread in others:
        thread.start()
    try:
        with pair.hosts[0].client() as client:
            requests = [{"op": "save", "snapshot": snapshot("piped", g=g)} for g in range(64)]
            replies = client._send_raw(requests)
    finally:
        stop.set()
        for thread in others:
            thread.join(WAIT_S)
    seqs = [reply["seq"] for reply in replies]
    assert all(reply["ok"] for reply in replies) and seqs == sorted(seqs)
    with pair.hosts[1].client() as client:
        assert client.load("piped") == snapshot("piped", g=63)


def test_a_damaged_row_fails_the_batch_that_decides_on_it_and_nothing_else(pair: Pair) -> None:
    from sessionstore.errors import IOFailure

    with pair.hosts[0].client() as client:
        client.save(snapshot("damaged", v=1))
        pair.sql(
            "UPDATE ss_documents SET body = body || '\\x00'::bytea WHERE key = 'damaged'::bytea"
            " RETURNING 1"
        )
        with pytest.raises(IOFailure, match=r"ss_documents.*digest mismatch"):
            client.update("damaged", "session", {"id": "damaged", "v": 2})
        client.save(snapshot("healthy", v=1))  # the daemon serves on
        assert client.load("healthy") == snapshot("healthy", v=1)
