# PostgreSQL failover under load: a primary and a synchronous streaming standby
# (pg_basebackup -R, synchronous_standby_names), both started here; two
# daemons on a multi-host URL with target_session_attrs=read-write; writers
# saving and running txns and a watcher on each daemon. Each round kills the
# primary (-m immediate) and promotes the standby (pg_ctl promote), then makes
# a fresh synchronous standby of the new primary on the old one's port. Three
# rounds; after each, every acknowledged write is there, each writer's seqs
# only went up, the watchers saw every seq once and in order, and a write that
# was in flight is whole or absent.
from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sessionstore import snapshot_digest
from sessionstore.client import Client
from sessionstore.errors import ConnectionLost, SessionStoreError

from . import waiting
from .acked_writes import exported_digests
from .conftest import DaemonProcess, snapshot
from .postgres_server import (
    PASSWORD,
    SUPERUSER,
    PostgresServer,
    _bin_dir,
    _free_port,
    new_cluster,
    server_user,
)

ROUNDS = 3
WRITERS = 6
STANDBY_NAME = "standby"
ACKS_PER_PHASE = 100  # writes acknowledged before the primary dies, and again after


def _owned_dir(path: Path, run_as: str | None) -> Path:
    path.mkdir()
    if run_as:
        shutil.chown(path, user=run_as)
    return path


def _connect(server: PostgresServer) -> psycopg.Connection[Any]:
    return psycopg.connect(
        host=str(server.socket_dir), port=server.port, user=SUPERUSER, dbname="postgres",
        autocommit=True,
    )  # fmt: skip


def _standby_of(primary: PostgresServer, base: Path, port: int) -> PostgresServer:
    """A streaming standby of primary (pg_basebackup -R), started, on port."""
    run_as = primary.run_as
    home = _owned_dir(base, run_as)
    data, sockets = home / "data", _owned_dir(home / "sock", run_as)
    source = (
        f"host={primary.socket_dir} port={primary.port} user={SUPERUSER}"
        f" application_name={STANDBY_NAME}"
    )
    standby = PostgresServer(primary.bin_dir, data, sockets, port, run_as)
    standby._run(str(primary.bin_dir / "pg_basebackup"), "-D", str(data), "-R", "-X", "stream",
         "-c", "fast", "-d", source)  # fmt: skip
    standby.start()
    return standby


def _make_synchronous(primary: PostgresServer) -> None:
    with _connect(primary) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'")
        conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 60
        while True:
            row = conn.execute(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY_NAME,),
            ).fetchone()
            if row is not None and row[0] == "sync":
                return
            assert time.monotonic() < deadline, f"no synchronous standby: {row}"
            time.sleep(0.1)


@pytest.fixture
def servers() -> Iterator[list[PostgresServer]]:
    """[primary, synchronous standby]; the test appends each server it makes, and every
    one still running is stopped at the end."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed")
    base = Path(tempfile.mkdtemp(prefix="ssfo-", dir="/tmp"))
    run_as = server_user()
    if run_as:  # its servers reach their directories through it
        shutil.chown(base, user=run_as)
    primary = new_cluster(bin_dir, base / "a")
    made = [primary]
    try:
        primary.start()
        made.append(_standby_of(primary, base / "b", _free_port()))
        _make_synchronous(primary)
        yield made
    finally:
        for server in made:
            with contextlib.suppress(subprocess.CalledProcessError):
                server.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class Load:
    """Writers through both daemons, and a watcher on each."""

    daemons: list[DaemonProcess]
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    acked: dict[str, tuple[int, str]] = field(default_factory=dict)  # id -> (seq, digest)
    in_flight: dict[str, set[str]] = field(default_factory=dict)  # digests sent, unanswered
    seqs: dict[int, list[int]] = field(default_factory=dict)  # writer -> its acked seqs
    errors: int = 0
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self.stop.clear()
        self.threads = [threading.Thread(target=self._writer, args=(n,)) for n in range(WRITERS)]
        for thread in self.threads:
            thread.start()

    def acknowledged(self) -> int:
        with self.lock:
            return sum(map(len, self.seqs.values()))

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)
            assert not thread.is_alive()

    def _writer(self, number: int) -> None:
        daemon = self.daemons[number % len(self.daemons)]
        client: Client | None = None
        n = 0
        while not self.stop.is_set():
            n += 1
            session_id = f"w{number}"
            body = snapshot(session_id, n=n, pad="p" * 500)
            digest = snapshot_digest(body)
            try:
                if client is None:
                    client = daemon.client(timeout=60)
                with self.lock:
                    self.in_flight.setdefault(session_id, set()).add(digest)
                if n % 4 == 0:  # a txn: both keys or neither
                    value = {"writer": number, "n": n}
                    ops = [{"op": "put", "kind": "kv", "key": f"t{number}/{k}", "value": value}
                           for k in "ab"]  # fmt: skip
                    reply = client.txn(ops)
                    with self.lock:
                        self.seqs.setdefault(number, []).append(reply["seq"])
                    continue
                reply = client.save(body)
            except (ConnectionLost, SessionStoreError):
                with self.lock:
                    self.errors += 1
                if client is not None:
                    client.close()
                client = None
                time.sleep(0.05)
                continue
            with self.lock:
                self.acked[session_id] = (reply["seq"], reply["digest"])
                self.in_flight[session_id] = set()
                self.seqs.setdefault(number, []).append(reply["seq"])
        if client is not None:
            client.close()


def _watch(daemon: DaemonProcess, since: int, seen: list[int], until: list[int]) -> None:
    with daemon.client(timeout=60) as client:
        for event in client.watch(since=since):
            seen.append(event["seq"])
            if until and event["seq"] >= until[0]:
                return


def _check(load: Load, daemons: list[DaemonProcess], round_: int) -> dict[str, int]:
    for number, seqs in load.seqs.items():
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"writer {number}"
    for daemon in daemons:
        stored = exported_digests(daemon)
        for session_id, (_, digest) in load.acked.items():
            found = stored.get(("session", session_id))
            allowed = {digest} | load.in_flight.get(session_id, set())
            assert found in allowed, f"round {round_}: {session_id} lost its acknowledged save"
        for number in range(WRITERS):  # a txn is both of its puts or neither
            a, b = stored.get(("kv", f"t{number}/a")), stored.get(("kv", f"t{number}/b"))
            assert a == b, f"round {round_}: txn {number} half applied"
    return {"acknowledged": sum(len(s) for s in load.seqs.values()), "errors": load.errors}


def test_failover_to_a_synchronous_standby_loses_nothing_acknowledged(
    servers: list[PostgresServer], short_tmp: Path
) -> None:
    primary, standby = servers
    with _connect(primary) as conn:
        conn.execute("CREATE DATABASE failover")
    url = (
        f"postgresql://{SUPERUSER}:{PASSWORD}@127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
        "/failover?target_session_attrs=read-write"
    )
    daemons = []
    for name in ("d0", "d1"):
        (short_tmp / name).mkdir()
        daemons.append(DaemonProcess(short_tmp / name, url))
    try:
        for daemon in daemons:
            daemon.start()
            with daemon.client() as client:  # the URL as given, but for the password
                assert client.stats()["database"] == url.replace(f":{PASSWORD}@", "@")
        load = Load(daemons)
        seen: list[list[int]] = [[], []]
        until: list[int] = []
        watchers = [
            threading.Thread(target=_watch, args=(d, 0, seen[i], until), daemon=True)
            for i, d in enumerate(daemons)
        ]
        for watcher in watchers:
            watcher.start()
        last_seq = [0, 0]
        for round_ in range(ROUNDS):
            load.start()
            before = load.acknowledged()
            waiting.until(lambda: load.acknowledged() >= before + ACKS_PER_PHASE,  # noqa: B023
                          "writes before the primary dies")  # fmt: skip
            started = time.monotonic()
            primary.stop("immediate")  # the primary dies
            standby._run(str(standby.bin_dir / "pg_ctl"), "-D", str(standby.data_dir), "-w",
                 "promote")  # fmt: skip
            promoted_s = time.monotonic() - started
            shutil.rmtree(primary.data_dir.parent, ignore_errors=True)  # gone for good
            replacement = _standby_of(standby, primary.data_dir.parent, primary.port)
            servers.append(replacement)
            _make_synchronous(standby)
            after = load.acknowledged()
            waiting.until(lambda: load.acknowledged() >= after + ACKS_PER_PHASE,  # noqa: B023
                          "writes through the new primary", limit_s=120)  # fmt: skip
            load.finish()
            counts = _check(load, daemons, round_)
            for index, daemon in enumerate(daemons):
                with daemon.client() as client:
                    seq = client.stats()["seq"]
                assert seq >= last_seq[index], "seq went back"
                last_seq[index] = seq
            print(f"failover round {round_ + 1}: {counts}, promoted in {promoted_s:.2f} s")
            primary, standby = standby, replacement
        with daemons[0].client() as client:  # the watchers' end: one more change
            final = client.save(snapshot("last"))["seq"]
        until.append(final)
        for watcher in watchers:
            watcher.join(60)
        for index, events in enumerate(seen):
            assert events == list(range(1, len(events) + 1)), f"watcher {index} has a gap"
            assert events[-1] >= final
        for daemon in daemons:
            assert daemon.stop() == 0, daemon.log()
            assert PASSWORD not in daemon.log()
    finally:
        for daemon in daemons:
            daemon.cleanup()
