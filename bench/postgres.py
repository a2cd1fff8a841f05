# The daemon on PostgreSQL against PostgreSQL used directly and against the
# frameworks' own PostgreSQL backends, side by side in one run on a throwaway
# cluster the bench starts itself (tests/postgres_server.py), each point on a
# fresh database of its own; 4 KiB snapshots:
# - saves/s of 64 clients through one daemon, and through three daemons sharing
#   the database, with the daemons' batch timings (the counter row's wait and
#   hold per batch), the one daemon's CPU by thread, the server's CPU per save
#   (its postmaster and backends, those that ended too) and the machine's busy
#   cores (of 2 on the reference machine: below that, a run is not CPU-bound);
# - the anchor: the same clients' work (a snapshot encoded at every save, 8
#   processes of 8 threads), each save one prepared upsert in autocommit from 64
#   psycopg connections (synchronous_commit on), and the same from one connection;
# - LangGraph: PostgresSaver.put against SessionStoreSaver.put through one
#   daemon, at one thread (p50) and in 8 processes (puts/s);
# - the Agents SDK: SQLAlchemySession on postgresql+asyncpg against
#   SessionStoreSession through one daemon, at one caller and in 8 processes;
# - an online rekey of REKEY_DOCUMENTS sealed 4 KiB sessions while a client saves
#   in a loop through a daemon holding both keys: rows resealed per second, and how
#   long the saves waited.
from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sessionstore.wire.canonical import canonical_dumps

from .adapters import PROCESSES, SPAWN_SLACK_S, figures_of, put_for, puts_in_processes
from .cpu import machine_busy_s, process_tree_cpu_s, thread_cpu_s
from .load import CLIENTS_PER_PROCESS, run_clients
from .workload import make_snapshot

KIB = 1024
CLIENTS = 64
REKEY_DOCUMENTS = 5000
ITEM = {"role": "user", "content": "x" * 4096}
UPSERT = (
    "INSERT INTO anchor_sessions VALUES (%s, %s)"
    " ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body"
)


def _upsert_per_save(args: tuple[str, list[str], float, float]) -> tuple[list[float], int]:
    """One process of the anchor: a connection and a thread per client, each save one
    prepared upsert in autocommit (one round trip, committed as it returns, as a careful
    user of PostgreSQL writes it), the snapshot encoded at every save as the daemon's
    clients encode theirs."""
    import psycopg

    url, ids, start_at, deadline = args
    results: list[tuple[list[float], int]] = []

    def client(session_id: str) -> None:
        snapshot = make_snapshot(session_id, 4 * KIB)
        latencies: list[float] = []
        errors = 0
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit TO on")
            time.sleep(max(0.0, start_at - time.time()))
            while time.time() < deadline:
                started = time.perf_counter()
                try:
                    conn.execute(UPSERT, (session_id, canonical_dumps(snapshot)), prepare=True)
                except psycopg.Error:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - started)
        results.append((latencies, errors))

    threads = [threading.Thread(target=client, args=(i,)) for i in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [x for lats, _ in results for x in lats], sum(e for _, e in results)


def _anchor(server: Any, url: str, seconds: float, clients: int) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS anchor_sessions (id text PRIMARY KEY, body bytea)")
        conn.commit()
    ids = [f"anchor/{n}" for n in range(clients)]
    groups = [ids[i : i + CLIENTS_PER_PROCESS] for i in range(0, clients, CLIENTS_PER_PROCESS)]
    start_at = time.time() + 2.0
    with multiprocessing.get_context("fork").Pool(len(groups)) as pool:
        pending = pool.map_async(
            _upsert_per_save, [(url, g, start_at, start_at + seconds) for g in groups]
        )
        time.sleep(max(0.0, start_at - time.time()))  # the processes wait until then too
        cpu = _CpuDuring(server)
        results = pending.get()
    latencies = [x for lats, _ in results for x in lats]
    out = _save_figures(latencies, seconds, sum(e for _, e in results))
    out.update(cpu.figures(len(latencies)))
    return out


def _save_figures(latencies: list[float], seconds: float, errors: int) -> dict[str, Any]:
    out = figures_of(latencies, seconds, errors)
    out["p99_ms"] = (
        round(sorted(latencies)[int(0.99 * len(latencies))] * 1000, 3) if latencies else None
    )
    return out


def _batch_timing(socket_path: str) -> dict[str, Any]:
    from sessionstore.client import Client

    with Client(socket_path) as client:
        stats = client.stats()
    timing: dict[str, Any] = stats.get("batch_transactions", {})
    timing["jobs_per_batch_mean"] = stats.get("recent_batches", {}).get("jobs_per_batch_mean")
    return timing


def _server_pid(server: Any) -> int:
    with open(server.data_dir / "postmaster.pid") as pid_file:
        return int(pid_file.readline())


class _CpuDuring:
    """The machine's busy cores, and the PostgreSQL server's CPU, over a run."""

    def __init__(self, server: Any) -> None:
        self.server_pid = _server_pid(server)
        self.started = time.monotonic()
        self.busy = machine_busy_s()
        self.server = process_tree_cpu_s(self.server_pid)

    def figures(self, saves: int) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        return {
            "machine_busy_cores": round((machine_busy_s() - self.busy) / elapsed, 2),
            "server_cpu_us_per_save": round(
                (process_tree_cpu_s(self.server_pid) - self.server) / max(saves, 1) * 1e6, 1
            ),
        }


def _through(daemons: list[Any], seconds: float, server: Any) -> dict[str, Any]:
    """64 clients spread over the daemons, all at once; the first daemon's CPU by thread
    (cores), every daemon's batch timings, the server's CPU per save and the machine's
    busy cores."""
    samples: list[Any] = []
    share = CLIENTS // len(daemons)

    def run(index: int, socket_path: str) -> None:
        samples.append(run_clients(socket_path, "save", share, 4 * KIB, seconds, f"pg{index}"))

    threads = [threading.Thread(target=run, args=(i, d.socket)) for i, d in enumerate(daemons)]
    before = thread_cpu_s(daemons[0].proc.pid)[0]
    cpu = _CpuDuring(server)
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    after = thread_cpu_s(daemons[0].proc.pid)[0]
    latencies = [x for sample in samples for x in sample.latencies_s]
    out = _save_figures(latencies, seconds, sum(sample.errors for sample in samples))
    out.update(cpu.figures(len(latencies)))
    out["batches"] = [_batch_timing(d.socket) for d in daemons]
    out["daemon_cores_by_thread"] = {
        name: round((after[name] - before.get(name, 0.0)) / elapsed, 2)
        for name in after
        if after[name] - before.get(name, 0.0) >= 0.01 * elapsed
    }
    return out


def _start_daemons(daemon_factory: Any, workdir: Path, url: str, count: int) -> list[Any]:
    daemons = []
    for number in range(count):
        (workdir / f"d{number}").mkdir()
        daemons.append(daemon_factory(workdir / f"d{number}", "--database", url))
    return daemons


def _saves(daemon_factory: Any, workdir: Path, server: Any, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, count in (("one daemon, 64 clients", 1), ("three daemons, 64 clients", 3)):
        where = workdir / f"saves-{count}"
        where.mkdir()
        url = server.url(server.create_database())
        daemons = _start_daemons(daemon_factory, where, url, count)
        try:
            out[label] = _through(daemons, seconds, server)
        finally:
            for daemon in daemons:
                daemon.stop()
    url = server.url(server.create_database())
    out["one prepared upsert per save, 64 psycopg connections"] = _anchor(
        server, url, seconds, CLIENTS
    )
    out["one prepared upsert per save, 1 psycopg connection"] = _anchor(server, url, seconds, 1)
    return out


def _savers(daemon_factory: Any, workdir: Path, server: Any, seconds: float) -> dict[str, Any]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    from .adapters import _ours, _postgres_saver

    url = server.url(server.create_database())
    with psycopg.connect(url, autocommit=True) as conn:
        PostgresSaver(conn).setup()
    (workdir / "savers").mkdir()
    ours_url = server.url(server.create_database())
    daemon = daemon_factory(workdir / "savers", "--database", ours_url)
    out: dict[str, Any] = {}
    try:
        lat, err = put_for(_postgres_saver(url), "one", time.perf_counter() + seconds)
        out["PostgresSaver.put 1 thread"] = figures_of(lat, seconds, err)
        lat, err = put_for(_ours(daemon.socket), "one", time.perf_counter() + seconds)
        out["SessionStoreSaver.put on PostgreSQL 1 thread"] = figures_of(lat, seconds, err)
        out["PostgresSaver.put 8 processes"] = puts_in_processes("postgres", url, seconds)
        out["SessionStoreSaver.put on PostgreSQL 8 processes"] = puts_in_processes(
            "ours", daemon.socket, seconds
        )
    finally:
        daemon.stop()
    return out


def _agents_session(which: str, where: str, session_id: str, first: bool) -> Any:
    if which == "sqlalchemy":
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

        # the tables are made once, by the first (one-caller) run: as in production, and
        # 8 processes making them at once collide in PostgreSQL's catalog
        return SQLAlchemySession.from_url(session_id, url=where, create_tables=first)
    from sessionstore.agents import SessionStoreSession

    return SessionStoreSession(session_id, where)


def _add_items_process(
    which: str, where: str, session_id: str, seconds: float, first: bool, ready: Any, out: Any
) -> None:
    """One caller: once every process has imported, connected and added a first item
    (ready, a barrier), add_items for `seconds`; its latencies go to out."""

    async def run() -> list[float]:
        session = _agents_session(which, where, session_id, first)
        try:
            await session.add_items([ITEM])
            ready.wait()
            latencies: list[float] = []
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                await session.add_items([ITEM])
                latencies.append(time.perf_counter() - started)
            return latencies
        finally:
            if which == "sqlalchemy":
                await session.engine.dispose()
            else:
                await session.close()

    out.put(asyncio.run(run()))


def _add_items(which: str, where: str, seconds: float, processes: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    ready, out = context.Barrier(processes), context.Queue()
    workers = [
        context.Process(
            target=_add_items_process,
            args=(which, where, f"bench/{which}/{n}", seconds, processes == 1, ready, out),
        )
        for n in range(processes)
    ]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=SPAWN_SLACK_S * 20 + seconds) for _ in workers]
    for worker in workers:
        worker.join()
    return figures_of([x for lats in results for x in lats], seconds)


def _sessions(daemon_factory: Any, workdir: Path, server: Any, seconds: float) -> dict[str, Any]:
    url = server.url(server.create_database()).replace("postgresql://", "postgresql+asyncpg://")
    (workdir / "sessions").mkdir()
    ours_url = server.url(server.create_database())
    daemon = daemon_factory(workdir / "sessions", "--database", ours_url)
    out: dict[str, Any] = {}
    try:
        for label, which, where in (
            ("SQLAlchemySession (asyncpg)", "sqlalchemy", url),
            ("SessionStoreSession on PostgreSQL", "ours", daemon.socket),
        ):
            out[f"{label}.add_items 1 caller"] = _add_items(which, where, seconds, 1)
            out[f"{label}.add_items {PROCESSES} processes"] = _add_items(
                which, where, seconds, PROCESSES
            )
    finally:
        daemon.stop()
    return out


def _rekey(daemon_factory: Any, workdir: Path, url: str) -> dict[str, Any]:
    import os
    import subprocess

    from .backup import _busy, _fill
    from .loop_stall import summary_of

    old, new = workdir / "old.key", workdir / "new.key"
    for path in (old, new):
        path.write_bytes(os.urandom(32))
    (workdir / "a").mkdir()
    sealed = daemon_factory(workdir / "a", "--database", url, "--key-file", str(old))
    try:
        _fill(sealed.socket, REKEY_DOCUMENTS)
    finally:
        sealed.stop()
    (workdir / "b").mkdir()
    both = ("--key-file", str(new), "--previous-key-file", str(old))
    daemon = daemon_factory(workdir / "b", "--database", url, *both)
    waits: dict[str, list[float]] = {"ping": [], "save": []}
    running = threading.Event()
    running.set()
    try:
        _busy(daemon.socket, running, waits)
        time.sleep(2.0)
        before = list(waits["save"])
        waits["save"].clear()
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "sessionstored", "rekey", "--database", url,
             "--old-key-file", str(old), "--new-key-file", str(new)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        seconds = time.perf_counter() - started
    finally:
        running.clear()
        daemon.stop()
    return {
        "documents": REKEY_DOCUMENTS,
        "seconds": round(seconds, 2),
        "documents_per_s": round(REKEY_DOCUMENTS / seconds),
        "save_before": summary_of(before) if before else None,
        "save_during": summary_of(waits["save"]) if waits["save"] else None,
    }


@contextlib.contextmanager
def cluster(preload: str = "") -> Iterator[Any]:
    """A throwaway PostgreSQL cluster (tests/postgres_server.py), with these
    shared_preload_libraries, stopped after; None when PostgreSQL is not installed."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.postgres_server import start_server

    servers = start_server(preload)
    try:
        yield next(servers)
    finally:
        for _ in servers:
            pass


def run(daemon_factory: Any, workdir: Path, seconds: float) -> dict[str, Any]:
    with cluster() as server:
        if server is None:
            return {"skipped": "PostgreSQL is not installed (apt install postgresql)"}
        return _run_on(server, daemon_factory, workdir, seconds)


def _run_on(server: Any, daemon_factory: Any, workdir: Path, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out.update(_saves(daemon_factory, workdir, server, seconds))
    out.update(_savers(daemon_factory, workdir, server, seconds))
    out.update(_sessions(daemon_factory, workdir, server, seconds))
    (workdir / "rekey").mkdir()
    out["online rekey"] = _rekey(
        daemon_factory, workdir / "rekey", server.url(server.create_database())
    )
    out["targets"] = targets(out)
    return out


def targets(out: dict[str, Any]) -> dict[str, float]:
    def ratio(ours: str, theirs: str, figure: str) -> float:
        return round(out[ours][figure] / out[theirs][figure], 2)

    anchor = "one prepared upsert per save, 64 psycopg connections"
    theirs = "SQLAlchemySession (asyncpg).add_items"
    ours = "SessionStoreSession on PostgreSQL.add_items"
    return {
        "64 clients, one daemon: x one prepared upsert per save (>= 1.5)": ratio(
            "one daemon, 64 clients", anchor, "ops_per_s"
        ),
        "64 clients, three daemons: x one daemon (>= 1)": ratio(
            "three daemons, 64 clients", "one daemon, 64 clients", "ops_per_s"
        ),
        "8 processes: SessionStoreSaver on PostgreSQL x PostgresSaver (>= 1)": ratio(
            "SessionStoreSaver.put on PostgreSQL 8 processes",
            "PostgresSaver.put 8 processes",
            "ops_per_s",
        ),
        "1 thread: SessionStoreSaver put p50 x PostgresSaver's (<= 1.5)": ratio(
            "SessionStoreSaver.put on PostgreSQL 1 thread", "PostgresSaver.put 1 thread", "p50_ms"
        ),
        "8 processes: SessionStoreSession x SQLAlchemySession (>= 1)": ratio(
            f"{ours} {PROCESSES} processes", f"{theirs} {PROCESSES} processes", "ops_per_s"
        ),
        "1 caller: SessionStoreSession add_items p50 x SQLAlchemySession's (<= 1.5)": ratio(
            f"{ours} 1 caller", f"{theirs} 1 caller", "p50_ms"
        ),
    }


if __name__ == "__main__":  # python -m bench.postgres [--dir DIR] [--seconds S]: this part alone
    from .plots import write_part
    from .standalone import run_alone

    run_alone(
        "python -m bench.postgres",
        run,
        5.0,
        lambda result_file: write_part("postgres", result_file),
    )
