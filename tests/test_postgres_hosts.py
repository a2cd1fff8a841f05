# Several hosts sharing one PostgreSQL: three daemons, each in a network
# namespace of its own that the test creates, reach the database over a veth
# link (the unix sockets clients use stay on this machine's file system). Then
# what one daemon knows, the others know; CAS, leases and watch hold across
# them; and neither a daemon's kill -9 nor PostgreSQL's immediate restart loses
# an acknowledged write. Also: starting against a database that is down, or
# with bad credentials or a bad URL.
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionstore.client import Client
from sessionstore.errors import Conflict, Fenced, SessionStoreError

from .conftest import DaemonProcess, snapshot
from .postgres_server import PostgresServer
from .tools import require, require_root
from .waiting import until

HOSTS = 3


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def namespaces() -> Iterator[list[tuple[str, str]]]:
    """(namespace, the database host's address as seen from it), one per host."""
    require("ip")
    require_root("network namespaces")
    tag = f"{os.getpid() % 10000}"
    made: list[tuple[str, str]] = []
    try:
        for number in range(HOSTS):
            name, outside, inside = f"ssh{tag}h{number}", f"ssv{tag}a{number}", f"ssv{tag}b{number}"
            _ip("netns", "add", name)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", name)
            _ip("addr", "add", f"10.77.{number + 1}.1/24", "dev", outside)
            _ip("link", "set", outside, "up")
            _ip(
                "netns",
                "exec",
                name,
                "ip",
                "addr",
                "add",
                f"10.77.{number + 1}.2/24",
                "dev",
                inside,
            )
            _ip("netns", "exec", name, "ip", "link", "set", inside, "up")
            _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
            made.append((name, f"10.77.{number + 1}.1"))
        yield made
    finally:
        for number, (name, _) in enumerate(made):
            subprocess.run(["ip", "link", "del", f"ssv{tag}a{number}"], capture_output=True)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


class Cluster:
    def __init__(self, server: PostgresServer, hosts: list[DaemonProcess]) -> None:
        self.server = server
        self.hosts = hosts

    def client(self, host: int, timeout: float = 30.0) -> Client:
        return self.hosts[host].client(timeout=timeout)


@pytest.fixture
def cluster(
    postgres: PostgresServer, namespaces: list[tuple[str, str]], short_tmp: Path
) -> Iterator[Cluster]:
    database = postgres.create_database()
    hosts = []
    for number, (name, address) in enumerate(namespaces):
        workdir = short_tmp / f"h{number}"
        workdir.mkdir()
        url = postgres.url(database, host=address)
        hosts.append(DaemonProcess(workdir, url, prefix=("ip", "netns", "exec", name)))
    for host in hosts:
        host.start()
    try:
        yield Cluster(postgres, hosts)
        for host in hosts:
            if host.proc is not None and host.proc.poll() is None:
                with host.client() as client:
                    assert client.verify()["problems"] == []
                    assert client.stats()["internal_errors"] == 0
                assert host.stop() == 0, host.log()
    finally:
        for host in hosts:
            host.cleanup()


def test_a_save_on_one_host_loads_on_the_others(cluster: Cluster) -> None:
    with cluster.client(0) as first:
        saved = first.save(snapshot("shared/1", note="from host 0"))
    for host in (1, 2):
        with cluster.client(host) as other:
            loaded = other.load_with_meta("shared/1")
            assert loaded["snapshot"] == snapshot("shared/1", note="from host 0")
            assert loaded["digest"] == saved["digest"] and loaded["seq"] == saved["seq"]
            assert other.list("shared/")["ids"] == ["shared/1"]


def test_a_batch_of_saves_is_one_round_trip_once_the_lease_is_known(cluster: Cluster) -> None:
    with cluster.client(1) as client:
        client.save(snapshot("trips/0"))  # the first batch reads the lease's row too
        before = client.stats()["batch_transactions"]
        for number in range(1, 11):
            client.save(snapshot(f"trips/{number}"))
        after = client.stats()["batch_transactions"]
    batches = after["batches"] - before["batches"]
    trips = (
        after["round_trips_per_batch_mean"] * after["batches"]
        - before["round_trips_per_batch_mean"] * before["batches"]
    )
    assert batches == 10
    assert round(trips) == batches


def test_a_kept_field_survives_a_put_on_a_host_that_never_saw_the_item(
    cluster: Cluster,
) -> None:
    """A put that keeps fields takes an item its daemon knows nothing of to be new, in
    one round trip; where another host wrote it, the stage finds the row and the batch
    decides again on the row as read."""

    def put(host: int, value: dict[str, Any]) -> dict[str, Any]:
        op = {"op": "put", "kind": "kv", "key": "item", "value": value, "keep": ["created_at"]}
        with cluster.client(host) as client:
            client.txn([op])
            stored = client.checkpoint_get("kv", "item")
            assert stored is not None
            return dict(stored)

    with cluster.client(1) as client:
        before = client.stats()["batch_transactions"]
    assert put(0, {"created_at": 1, "v": "host 0"}) == {"created_at": 1, "v": "host 0"}
    assert put(1, {"created_at": 2, "v": "host 1"}) == {"created_at": 1, "v": "host 1"}
    with cluster.client(1) as client:
        after = client.stats()["batch_transactions"]
    assert after["retries"] - before["retries"] == 1  # the guess, found wrong once
    assert put(1, {"created_at": 3, "v": "again"}) == {"created_at": 1, "v": "again"}


def test_thirty_racing_create_only_saves_have_exactly_one_winner(cluster: Cluster) -> None:
    outcomes: list[str] = []
    lock = threading.Lock()

    def attempt(number: int) -> None:
        with cluster.client(number % HOSTS) as client:
            try:
                client.save(snapshot("race", by=number), expect=None)
                result = f"won {number}"
            except Conflict:
                result = "conflict"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(30)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(outcomes) == 30 and len(winners) == 1, outcomes
    winner = int(winners[0].split()[1])
    for host in range(HOSTS):
        with cluster.client(host) as client:
            assert client.load("race") == snapshot("race", by=winner)


def test_a_lease_taken_on_one_host_fences_a_stale_holder_on_another(cluster: Cluster) -> None:
    with cluster.client(0) as a, cluster.client(1) as b:
        old = b.lease_acquire("worker-old")
        b.save(snapshot("fenced", v=1), lease=old)
        new = a.lease_acquire("worker-new")  # a takeover, through host A
        assert new["epoch"] == old["epoch"] + 1
        with pytest.raises(Fenced):
            b.save(snapshot("fenced", v=2), lease=old)  # the stale holder, through host B
        with pytest.raises(Fenced):
            b.save(snapshot("fenced", v=3))
        b.save(snapshot("fenced", v=4), lease=new)
        assert a.load("fenced") == snapshot("fenced", v=4)
        assert b.lease_release("worker-new", new["epoch"])


def test_a_watcher_on_one_host_sees_every_commit_in_order_across_a_restart(
    cluster: Cluster,
) -> None:
    events: list[dict[str, Any]] = []
    with cluster.client(2) as watcher_client:
        start = watcher_client.stats()["seq"]

    def watch() -> None:
        with Client(cluster.hosts[2].socket_path, timeout=60) as watcher:
            for event in watcher.watch(since=start):
                events.append(event)
                if len(events) == 40:
                    return

    thread = threading.Thread(target=watch)
    thread.start()
    for number in range(20):
        with cluster.client(number % 2) as writer:
            writer.save(snapshot(f"w/{number}"))
    cluster.hosts[0].stop()  # host A's daemon restarts in the middle
    cluster.hosts[0].start()
    for number in range(20, 40):
        with cluster.client(number % 2) as writer:
            writer.save(snapshot(f"w/{number}"))
    thread.join(60)
    assert [e["session_id"] for e in events] == [f"w/{n}" for n in range(40)]
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(start + 1, start + 41))  # every host's commits, none skipped


# A busy machine is slow, not lossy: the waits below end on progress (every writer
# acknowledged again after the disruption), and give up only after this long with
# no acknowledgement at all, which is a stuck store, not a slow one.
STALLED_S = 120.0


class Load:
    """Clients saving through some hosts until the deadline and, after a disruption,
    until every one of them has been acknowledged again: what was acknowledged (by
    id, the last acknowledged snapshot) and how many requests failed."""

    def __init__(self, workers: int) -> None:
        self.acknowledged: dict[str, dict[str, Any]] = {}
        self.failures = 0
        self.workers = workers
        self.disrupted_at: float | None = None
        self.recovered: set[int] = set()  # workers acknowledged after the disruption
        self.last_ack = time.monotonic()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def disrupt(self, action: Any) -> None:
        with self.lock:
            self.disrupted_at = time.monotonic()
        action()

    def stalled(self) -> bool:
        return time.monotonic() - self.last_ack > STALLED_S

    def done(self, worker: int, deadline: float) -> bool:
        if time.monotonic() < deadline:
            return False
        return self.disrupted_at is None or worker in self.recovered or self.stalled()

    def acked(self, worker: int, document: dict[str, Any], sent_at: float) -> None:
        with self.lock:
            self.acknowledged[f"load/{worker}"] = document
            self.last_ack = time.monotonic()
            if self.disrupted_at is not None and sent_at > self.disrupted_at:
                self.recovered.add(worker)

    def finish(self) -> None:
        for thread in self.threads:
            thread.join()
        assert not self.stalled(), f"no save was acknowledged for {STALLED_S} s"
        assert self.recovered == set(range(self.workers)), self.recovered
        assert len(self.acknowledged) == self.workers


def _writers(cluster: Cluster, hosts: list[int], seconds: float) -> Load:
    load = Load(workers=12)
    deadline = time.monotonic() + seconds

    def write(worker: int) -> None:
        host = hosts[worker % len(hosts)]
        number = 0
        client = Client(cluster.hosts[host].socket_path, timeout=STALLED_S)
        while not load.done(worker, deadline):
            document = snapshot(f"load/{worker}", n=number)
            sent_at = time.monotonic()
            try:
                client.save(document)
            except SessionStoreError:
                with load.lock:
                    load.failures += 1
                client.close()
                time.sleep(0.05)
                continue
            load.acked(worker, document, sent_at)
            number += 1
        client.close()

    load.threads = [threading.Thread(target=write, args=(n,)) for n in range(load.workers)]
    for thread in load.threads:
        thread.start()
    return load


def _served(cluster: Cluster, host: int, call: Any) -> Any:
    """call(client)'s result once the host serves it again: an io_error (its database
    not back yet) is retried while the daemon lives, until STALLED_S."""
    started = time.monotonic()
    while True:
        try:
            with cluster.client(host, timeout=STALLED_S) as client:
                return call(client)
        except SessionStoreError as error:
            daemon = cluster.hosts[host].proc
            assert daemon is not None and daemon.poll() is None, cluster.hosts[host].log()
            if error.code != "io_error" or time.monotonic() - started > STALLED_S:
                raise
            time.sleep(0.1)


def _assert_kept(cluster: Cluster, host: int, acknowledged: dict[str, dict[str, Any]]) -> None:
    def check(client: Client) -> None:
        for session_id, document in acknowledged.items():
            stored = client.load(session_id)
            assert stored is not None, session_id
            assert stored["session"]["n"] >= document["session"]["n"], session_id

    _served(cluster, host, check)


def test_kill_9_of_one_daemon_under_load_loses_nothing_acknowledged(cluster: Cluster) -> None:
    load = _writers(cluster, [0, 1], seconds=4.0)
    until(lambda: len(load.acknowledged) == load.workers, "every writer's first save")
    load.disrupt(cluster.hosts[0].kill9)
    with load.lock:
        so_far = dict(load.acknowledged)
    _assert_kept(cluster, 2, so_far)  # host 1 serves on meanwhile
    cluster.hosts[0].start()  # as systemd would; host 0's writers come back
    load.finish()
    _assert_kept(cluster, 2, load.acknowledged)
    _assert_kept(cluster, 0, load.acknowledged)


# The server comes back in the background, as systemd brings it back, after 0 s or
# after 12 s: longer than the writers' planned run and than any of the daemon's own
# waits (a pooled read's 10 s), as a crash recovery on a busy machine can take.
@pytest.mark.parametrize("down_s", [0.0, 12.0])
def test_an_immediate_postgresql_restart_under_load_loses_nothing_acknowledged(
    cluster: Cluster, down_s: float
) -> None:
    def restart() -> None:
        cluster.server.stop("immediate")
        time.sleep(down_s)
        cluster.server.start()

    load = _writers(cluster, [0, 1, 2], seconds=6.0)
    until(lambda: len(load.acknowledged) == load.workers, "every writer's first save")
    restarting = threading.Thread(target=restart)
    load.disrupt(restarting.start)
    load.finish()  # every daemon reconnected by itself: each writer was acknowledged again
    restarting.join()
    assert load.failures > 0  # in-flight requests got errors, not a false ok
    for host in range(HOSTS):
        _served(cluster, host, lambda client: client.save(snapshot("after-restart")))
        _assert_kept(cluster, host, load.acknowledged)


def test_a_database_that_is_down_is_waited_for(postgres: PostgresServer, short_tmp: Path) -> None:
    assert postgres is not None
    daemon = DaemonProcess(short_tmp, postgres.url("postgres").replace(str(postgres.port), "1"))
    daemon.start(wait=False)
    try:
        assert daemon.wait_notification("READY=1", timeout=3.0) is False
        assert any("waiting for PostgreSQL" in n for n in daemon.notifications), (
            daemon.notifications
        )
        assert daemon.proc is not None and daemon.proc.poll() is None  # still trying
    finally:
        daemon.cleanup()


@pytest.mark.parametrize(
    ("breakage", "needle"),
    [("password", "password authentication failed"), ("database", "does not exist")],
)
def test_bad_credentials_or_a_missing_database_exit_with_one_line(
    postgres: PostgresServer, short_tmp: Path, breakage: str, needle: str
) -> None:
    assert postgres is not None
    url = (
        postgres.url("postgres", password="wrong")
        if breakage == "password"
        else postgres.url("nope")
    )
    command = [sys.executable, "-m", "sessionstored", "--socket", str(short_tmp / "s")]
    result = subprocess.run(
        [*command, "--database", url], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "wrong" not in result.stderr  # the password is never printed


def test_a_role_that_may_not_create_the_schema_exits_with_one_line(
    postgres: PostgresServer, short_tmp: Path
) -> None:
    assert postgres is not None
    database = postgres.create_database()
    role = f"limited_{database}"
    postgres.sql(database, f"CREATE ROLE {role} LOGIN PASSWORD 'limited-pw'")
    url = f"postgresql://{role}:limited-pw@127.0.0.1:{postgres.port}/{database}"
    command = [sys.executable, "-m", "sessionstored", "--socket", str(short_tmp / "s")]
    result = subprocess.run(
        [*command, "--database", url], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result
    assert "permission denied" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_bad_url_is_refused_at_once(short_tmp: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sessionstored", "--socket", str(short_tmp / "s"), "--database", "mysql://x"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "postgresql://" in result.stderr


def test_with_a_key_the_database_never_sees_plaintext(
    postgres: PostgresServer, short_tmp: Path
) -> None:
    import psycopg

    assert postgres is not None
    database = postgres.create_database()
    key = short_tmp / "key"
    key.write_bytes(os.urandom(32))
    daemon = DaemonProcess(short_tmp, postgres.url(database))
    daemon.start("--key-file", str(key))
    try:
        with daemon.client() as client:
            client.save(snapshot("tenant/secret-id", note="SECRET-TEXT-4711"))
            client.checkpoint_put("kv", "kv/secret-key", {"v": "SECRET-VALUE-0815"})
            assert client.load("tenant/secret-id") == snapshot(
                "tenant/secret-id", note="SECRET-TEXT-4711"
            )
            assert client.checkpoint_scan("kv", "kv/")["items"][0]["key"] == "kv/secret-key"
            assert client.hello()["capabilities"]["encrypted_at_rest"] is True
        assert daemon.stop() == 0
        with psycopg.connect(postgres.url(database)) as conn:
            rows = [
                bytes(cell) if isinstance(cell, (bytes, memoryview)) else str(cell).encode()
                for table in ("ss_documents", "ss_changes", "ss_meta")
                for row in conn.execute(f"SELECT * FROM {table}").fetchall()
                for cell in row
                if cell is not None
            ]
        for secret in (b"SECRET-TEXT-4711", b"secret-id", b"SECRET-VALUE-0815", b"secret-key"):
            assert not any(secret in cell for cell in rows), secret
        refused = subprocess.run(
            daemon.command(), capture_output=True, text=True, timeout=60
        )  # the same database without the key
        assert refused.returncode == 2 and "sealed with key id" in refused.stderr
    finally:
        daemon.cleanup()


def test_the_changes_table_stays_bounded(postgres: PostgresServer, short_tmp: Path) -> None:
    import psycopg

    from sessionstore.errors import Compacted
    from sessionstored.storage.postgres.following import RETENTION_EVERY_BATCHES

    assert postgres is not None
    database = postgres.create_database()
    daemon = DaemonProcess(short_tmp, postgres.url(database))
    daemon.start("--history-changes", "100")
    try:
        with daemon.client() as client:
            for number in range(700):  # one client: a batch each, trimmed every 500 batches
                client.save(snapshot(f"r/{number % 50}", n=number))
            with psycopg.connect(postgres.url(database)) as conn:
                trimmed = conn.execute("SELECT count(*) FROM ss_changes").fetchone()
            # trimmed once 500 batches went by, to the history as the follower then saw
            # it (which may trail the last commit): at most history + 500 rows remain
            assert trimmed is not None and trimmed[0] <= 100 + RETENTION_EVERY_BATCHES < 700
            compacted = client.compact()
            with psycopg.connect(postgres.url(database)) as conn:
                left = conn.execute("SELECT count(*), min(seq) FROM ss_changes").fetchone()
            assert left is not None and left[0] == 100 and left[1] == 601
            assert compacted["seq"] == 700
            with pytest.raises(Compacted):
                next(iter(client.watch(since=0, reconnect=False)))
            assert client.stats()["sessions"] == 50
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()


def test_while_the_database_is_down_requests_get_io_error_then_it_serves_again(
    postgres: PostgresServer, short_tmp: Path
) -> None:
    from sessionstore.errors import IOFailure

    assert postgres is not None
    daemon = DaemonProcess(short_tmp, postgres.url(postgres.create_database()))
    daemon.start()
    try:
        with daemon.client() as client:
            client.save(snapshot("before"))
            postgres.stop("fast")
            try:
                with pytest.raises(IOFailure):
                    client.load("before")
                with pytest.raises(IOFailure):
                    client.save(snapshot("while-down"))
            finally:
                postgres.start()
            deadline = time.monotonic() + 30
            while True:  # the next batch reconnects by itself
                try:
                    client.save(snapshot("after"))
                    break
                except IOFailure:
                    assert time.monotonic() < deadline
                    time.sleep(0.5)
            assert client.load("before") == snapshot("before")
            assert client.load("while-down") is None  # refused, so not there
            assert client.stats()["internal_errors"] == 0
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()


def test_a_database_host_that_does_not_resolve_at_start_is_a_configuration_error(
    short_tmp: Path,
) -> None:
    """A typo in the URL's host exits 2 with one line (retrying would wait for ever); a
    name that stops resolving later is an outage, and the daemon retries."""
    done = subprocess.run(
        [sys.executable, "-m", "sessionstored", "--socket", str(short_tmp / "s.sock"),
         "--database", "postgresql://someone@no-such-host.invalid/db"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "no-such-host.invalid" in line and "does not resolve" in line  # and no retry line


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:secret@db:6432/app", "postgresql://u@db:6432/app"),
        ("postgresql://u:secret@a,b/app", "postgresql://u@a:5432,b:5432/app"),
        (
            "postgresql://u:secret@10.0.0.1:5433,10.0.0.2:5434/app?target_session_attrs=read-write",
            "postgresql://u@10.0.0.1:5433,10.0.0.2:5434/app?target_session_attrs=read-write",
        ),
        ("host=a,b port=1,2 user=u password=secret dbname=app", "postgresql://u@a:1,b:2/app"),
    ],
)
def test_urls_are_shown_host_by_host_without_the_password(url: str, shown: str) -> None:
    from sessionstored.storage.postgres.connection import redacted

    assert redacted(url) == shown
