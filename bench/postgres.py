# The daemon on PostgreSQL (issue 16's figures), side by side in one run on a
# throwaway cluster the bench starts itself (tests/postgres_server.py):
# - saves/s of 64 clients (4 KiB snapshots) through one daemon, and through
#   three daemons sharing the database;
# - the anchor: the same bytes committed one transaction per save from 64
#   psycopg connections (synchronous_commit on), 8 processes of 8 threads;
# - LangGraph's PostgresSaver.put through 8 processes, against this saver on
#   PostgreSQL through one daemon.
# - an online rekey (issue 28) of REKEY_DOCUMENTS sealed 4 KiB sessions on a
#   database of their own, while a client saves in a loop through a daemon
#   holding both keys: rows resealed per second, and how long the saves waited.
# Target: at least 2x one-commit-per-save at 64 clients.
from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .adapters import _figures, puts_in_processes
from .load import CLIENTS_PER_PROCESS, run_clients
from .workload import snapshot_bytes

KIB = 1024
CLIENTS = 64
REKEY_DOCUMENTS = 5000


def _commit_per_save(args: tuple[str, list[str], float, float]) -> tuple[list[float], int]:
    """One process of the anchor: a connection and a thread per client, one commit each."""
    import psycopg

    url, ids, start_at, deadline = args
    results: list[tuple[list[float], int]] = []

    def client(session_id: str) -> None:
        body = snapshot_bytes(session_id, 4 * KIB)
        latencies: list[float] = []
        errors = 0
        with psycopg.connect(url) as conn:
            conn.execute("SET synchronous_commit TO on")
            conn.commit()
            time.sleep(max(0.0, start_at - time.time()))
            while time.time() < deadline:
                started = time.perf_counter()
                try:
                    conn.execute(
                        "INSERT INTO anchor_sessions VALUES (%s, %s) ON CONFLICT (id)"
                        " DO UPDATE SET body = EXCLUDED.body",
                        (session_id, body),
                    )
                    conn.commit()
                except psycopg.Error:
                    conn.rollback()
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


def _anchor(url: str, seconds: float) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS anchor_sessions (id text PRIMARY KEY, body bytea)")
        conn.commit()
    ids = [f"anchor/{n}" for n in range(CLIENTS)]
    groups = [ids[i : i + CLIENTS_PER_PROCESS] for i in range(0, CLIENTS, CLIENTS_PER_PROCESS)]
    start_at = time.time() + 2.0
    with multiprocessing.get_context("fork").Pool(len(groups)) as pool:
        results = pool.map(
            _commit_per_save, [(url, g, start_at, start_at + seconds) for g in groups]
        )
    latencies = [x for lats, _ in results for x in lats]
    return _figures(latencies, seconds, sum(e for _, e in results))


def _save_figures(samples: list[Any], seconds: float) -> dict[str, Any]:
    latencies = [x for sample in samples for x in sample.latencies_s]
    errors = sum(sample.errors for sample in samples)
    out = _figures(latencies, seconds, errors)
    out["p99_ms"] = (
        round(sorted(latencies)[int(0.99 * len(latencies))] * 1000, 3) if latencies else None
    )
    return out


def _through(sockets: list[str], seconds: float) -> dict[str, Any]:
    """64 clients spread over the daemons, all at once."""
    samples: list[Any] = []
    share = CLIENTS // len(sockets)

    def run(index: int, socket_path: str) -> None:
        samples.append(run_clients(socket_path, "save", share, 4 * KIB, seconds, f"pg{index}"))

    threads = [threading.Thread(target=run, args=(i, s)) for i, s in enumerate(sockets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return _save_figures(samples, seconds)


def _savers(url: str, socket_path: str, seconds: float) -> dict[str, Any]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    with psycopg.connect(url, autocommit=True) as conn:
        PostgresSaver(conn).setup()
    return {
        "PostgresSaver.put 8 processes": puts_in_processes("postgres", url, seconds),
        "SessionStoreSaver.put on PostgreSQL 8 processes": puts_in_processes(
            "ours", socket_path, seconds
        ),
    }


def _rekey(daemon_factory: Any, workdir: Path, url: str) -> dict[str, Any]:
    import os
    import subprocess

    from .backup import _busy, _fill
    from .loop_stall import _summary

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
        "save_before": _summary(before) if before else None,
        "save_during": _summary(waits["save"]) if waits["save"] else None,
    }


def run(daemon_factory: Any, workdir: Path, seconds: float) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.postgres_server import start_server

    servers = start_server()
    server = next(servers)
    if server is None:
        return {"skipped": "PostgreSQL is not installed (apt install postgresql)"}
    out: dict[str, Any] = {}
    try:
        database = server.create_database()
        url = server.url(database)
        daemons = []
        for number in range(3):
            (workdir / f"d{number}").mkdir()
            daemons.append(daemon_factory(workdir / f"d{number}", "--database", url))
        try:
            out["one daemon, 64 clients"] = _through([daemons[0].socket], seconds)
            out["three daemons, 64 clients"] = _through([d.socket for d in daemons], seconds)
            out["one commit per save, 64 psycopg connections"] = _anchor(url, seconds)
            out.update(_savers(url, daemons[0].socket, seconds))
        finally:
            for daemon in daemons:
                daemon.stop()
        (workdir / "rekey").mkdir()
        out["online rekey"] = _rekey(
            daemon_factory, workdir / "rekey", server.url(server.create_database())
        )
        ours = out["one daemon, 64 clients"]["ops_per_s"]
        anchor = out["one commit per save, 64 psycopg connections"]["ops_per_s"]
        out["targets"] = {
            "64 clients, one daemon: x one commit per save (>= 2)": round(ours / anchor, 2),
            "64 clients, three daemons: x one commit per save": round(
                out["three daemons, 64 clients"]["ops_per_s"] / anchor, 2
            ),
            "8 processes: SessionStoreSaver on PostgreSQL x PostgresSaver": round(
                out["SessionStoreSaver.put on PostgreSQL 8 processes"]["ops_per_s"]
                / out["PostgresSaver.put 8 processes"]["ops_per_s"],
                2,
            ),
        }
    finally:
        for _ in servers:
            pass
    return out


if __name__ == "__main__":  # python -m bench.postgres [--dir DIR] [--seconds S]: this part alone
    from .standalone import run_alone

    run_alone("python -m bench.postgres", run, 5.0)
