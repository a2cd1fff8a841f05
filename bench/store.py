# LangGraph's long-term memory store: SessionStoreStore against SqliteStore
# (as shipped, on the same disk) and PostgresStore (on a throwaway cluster the
# bench starts, with SessionStoreStore through a daemon on PostgreSQL beside
# it), in one run, with the same 1 KiB values:
# - put, get and search (a 100-item namespace, a filter, limit 10) p50 at one
#   caller;
# - puts/s of PROCESSES processes putting at once, each in a namespace of its own;
# - semantic search in a namespace of SEMANTIC_ITEMS items (dims SEMANTIC_DIMS,
#   deterministic vectors, so no model runs): search(query=...) p50 against
#   SqliteStore's (sqlite-vec, when installed) and InMemoryStore's, which rank
#   in the client.
from __future__ import annotations

import hashlib
import multiprocessing
import random
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .adapters import PROCESSES, SPAWN_SLACK_S, figures_of

VALUE = {"text": "x" * 1024, "kind": "note", "rank": 0}
SEARCH_NAMESPACE_ITEMS = 100
SEMANTIC_DIMS = 768  # a base-size embedding model's; InMemoryStore holds them as lists
PUT_BATCH = 500  # items per batch() when filling the semantic namespace


def _embed(texts: list[str]) -> list[list[float]]:
    """SEMANTIC_DIMS numbers from each text, the same every run (no model)."""
    import numpy as np

    vectors = []
    for text in texts:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        vectors.append(np.random.default_rng(seed).uniform(-1, 1, SEMANTIC_DIMS).tolist())
    return vectors


def _index() -> Any:
    return {"dims": SEMANTIC_DIMS, "embed": _embed, "fields": ["text"]}


def _sqlite_store(db: str, index: Any = None) -> Any:
    from langgraph.store.sqlite import SqliteStore

    conn = sqlite3.connect(db, check_same_thread=False, isolation_level=None)
    store = SqliteStore(conn, index=index)
    store.setup()
    return store


def _ours(socket_path: str, index: Any = None) -> Any:
    from sessionstore.langgraph import SessionStoreStore

    return SessionStoreStore(socket_path, index=index)


def _postgres_store(url: str, index: Any = None) -> Any:
    import psycopg
    from langgraph.store.postgres import PostgresStore

    conn = psycopg.connect(url, autocommit=True, prepare_threshold=0)
    store = PostgresStore(conn, index=index)
    store.setup()
    return store


STORES: dict[str, Callable[[str], Any]] = {
    "sqlite": _sqlite_store,
    "postgres": _postgres_store,
    "ours": _ours,
}


def _timed(call: Callable[[], Any], seconds: float) -> list[float]:
    latencies = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - started)
    return latencies


def one_caller(store: Any, label: str, seconds: float) -> dict[str, Any]:
    counter = iter(range(10**9))
    out = {}
    lat = _timed(lambda: store.put(("bench", label), f"k{next(counter)}", VALUE), seconds)
    out["put"] = figures_of(lat, seconds)
    written = len(lat)
    lat = _timed(lambda: store.get(("bench", label), f"k{random.randrange(written)}"), seconds)
    out["get"] = figures_of(lat, seconds)
    for n in range(SEARCH_NAMESPACE_ITEMS):
        store.put(("search", label), f"s{n}", {**VALUE, "rank": n})
    lat = _timed(
        lambda: store.search(("search", label), filter={"rank": {"$gte": 50}}, limit=10), seconds
    )
    out["search"] = figures_of(lat, seconds)
    return out


def _put_process(args: tuple[str, str, str, float, float]) -> tuple[list[float], int]:
    which, where, namespace, start, deadline = args
    store = STORES[which](where)
    time.sleep(max(0.0, start - time.time()))
    latencies: list[float] = []
    errors = 0
    number = 0
    while time.time() < deadline:
        started = time.perf_counter()
        try:
            store.put(("processes", namespace), f"k{number}", VALUE)
        except Exception:  # SQLite's "database is locked", counted
            errors += 1
        else:
            latencies.append(time.perf_counter() - started)
        number += 1
    return latencies, errors


def puts_in_processes(which: str, where: str, seconds: float) -> dict[str, Any]:
    start = time.time() + SPAWN_SLACK_S
    jobs = [(which, where, f"p{n}", start, start + seconds) for n in range(PROCESSES)]
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        results = pool.map(_put_process, jobs)
    return figures_of([x for lats, _ in results for x in lats], seconds, sum(e for _, e in results))


def semantic(store: Any, items: int, seconds: float) -> dict[str, Any]:
    """Fill a namespace of `items` indexed items (timed), then search it by query."""
    started = time.perf_counter()
    from langgraph.store.base import PutOp

    for first in range(0, items, PUT_BATCH):
        store.batch(
            [PutOp(("semantic",), f"d{n}", {"text": f"document {n}"})
             for n in range(first, min(items, first + PUT_BATCH))]
        )  # fmt: skip
    filled = time.perf_counter() - started
    queries = iter(range(10**9))
    lat = _timed(lambda: store.search(("semantic",), query=f"q{next(queries)}", limit=10), seconds)
    return {"items": items, "fill_s": round(filled, 1), "search": figures_of(lat, seconds)}


def run(daemon_factory: Any, workdir: Path, seconds: float, semantic_items: int) -> dict[str, Any]:
    from langgraph.store.memory import InMemoryStore

    out: dict[str, Any] = {}
    (workdir / "daemon").mkdir()
    daemon = daemon_factory(workdir / "daemon")
    try:
        sqlite_db = str(workdir / "store.db")
        out["SqliteStore 1 caller"] = one_caller(_sqlite_store(sqlite_db), "sqlite", seconds)
        out["SessionStoreStore 1 caller"] = one_caller(_ours(daemon.socket), "ours", seconds)
        out["SqliteStore put 8 processes"] = puts_in_processes("sqlite", sqlite_db, seconds)
        out["SessionStoreStore put 8 processes"] = puts_in_processes("ours", daemon.socket, seconds)
        ours = _ours(daemon.socket, _index())
        out["SessionStoreStore semantic search"] = semantic(ours, semantic_items, seconds)
        out["InMemoryStore semantic search"] = semantic(
            InMemoryStore(index=_index()), semantic_items, seconds
        )
        try:
            vec = _sqlite_store(str(workdir / "vec.db"), _index())
        except Exception as error:  # sqlite-vec missing: said, not hidden
            out["SqliteStore semantic search"] = {"skipped": f"{type(error).__name__}: {error}"}
        else:
            out["SqliteStore semantic search"] = semantic(vec, semantic_items, seconds)
    finally:
        daemon.stop()
    out.update(_on_postgres(daemon_factory, workdir, seconds))
    out["targets"] = targets(out)
    return out


def _on_postgres(daemon_factory: Any, workdir: Path, seconds: float) -> dict[str, Any]:
    from .postgres import cluster

    with cluster() as server:
        if server is None:
            return {"PostgresStore": {"skipped": "PostgreSQL is not installed"}}
        out: dict[str, Any] = {}
        url = server.url(server.create_database())
        out["PostgresStore 1 caller"] = one_caller(_postgres_store(url), "postgres", seconds)
        out["PostgresStore put 8 processes"] = puts_in_processes("postgres", url, seconds)
        (workdir / "on-postgres").mkdir()
        daemon = daemon_factory(
            workdir / "on-postgres", "--database", server.url(server.create_database())
        )
        try:
            out["SessionStoreStore on PostgreSQL 1 caller"] = one_caller(
                _ours(daemon.socket), "ours-pg", seconds
            )
            out["SessionStoreStore on PostgreSQL put 8 processes"] = puts_in_processes(
                "ours", daemon.socket, seconds
            )
        finally:
            daemon.stop()
        return out


def targets(out: dict[str, Any]) -> dict[str, float]:
    def ratio(ours: str, theirs: str, op: str) -> float:
        return round(out[ours][op]["p50_ms"] / out[theirs][op]["p50_ms"], 2)

    found = {
        f"{op} p50: x SqliteStore": ratio("SessionStoreStore 1 caller", "SqliteStore 1 caller", op)
        for op in ("put", "get", "search")
    }
    found["8 processes: x SqliteStore puts/s"] = round(
        out["SessionStoreStore put 8 processes"]["ops_per_s"]
        / out["SqliteStore put 8 processes"]["ops_per_s"],
        2,
    )
    if "PostgresStore 1 caller" in out:
        for op in ("put", "get", "search"):
            found[f"{op} p50 on PostgreSQL: x PostgresStore"] = ratio(
                "SessionStoreStore on PostgreSQL 1 caller", "PostgresStore 1 caller", op
            )
    return found


if __name__ == "__main__":
    # python -m bench.store [--dir DIR] [--seconds S] [--semantic-items N]: this part alone
    import argparse
    import functools

    from .plots import write_store
    from .standalone import run_alone

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--semantic-items", type=int, default=10_000)
    known, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    part = functools.partial(run, semantic_items=known.semantic_items)
    run_alone("python -m bench.store", part, 3.0, write_store)
