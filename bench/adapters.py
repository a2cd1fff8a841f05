# The framework adapters against the frameworks' own SQLite backends, in one
# run on one disk (the adapters' targets):
# - LangGraph: SqliteSaver.put vs SessionStoreSaver.put at one thread (p50),
#   AsyncSqliteSaver.aput vs SessionStoreSaver.aput, and total puts/s of 8
#   processes putting at once, each on its own thread (SQLite's lock errors
#   counted, not hidden);
# - Agents SDK: SQLiteSession.add_items vs SessionStoreSession.add_items at
#   one caller (p50), and ours at a session of 10 items vs one of 10,000.
# Payloads are 4 KiB. Both SQLite backends run as shipped (WAL; the synchronous
# level they get is printed).
from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

PAYLOAD = "x" * 4096
PROCESSES = 8
SPAWN_SLACK_S = 6.0


def _p50_ms(latencies: list[float]) -> float:
    return statistics.median(latencies) * 1000 if latencies else float("nan")


def figures_of(latencies: list[float], seconds: float, errors: int = 0) -> dict[str, Any]:
    return {
        "ops_per_s": round(len(latencies) / seconds, 1),
        "p50_ms": round(_p50_ms(latencies), 3),
        "errors": errors,
    }


def _checkpoint(number: int) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    checkpoint = empty_checkpoint()
    checkpoint["id"] = str(uuid6(clock_seq=number))
    checkpoint["channel_values"] = {"messages": PAYLOAD}
    checkpoint["channel_versions"] = {"messages": number + 1}
    return checkpoint


def _sqlite_saver(db: str) -> Any:
    from langgraph.checkpoint.sqlite import SqliteSaver

    saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False, timeout=30))
    saver.setup()
    return saver


def _ours(socket_path: str) -> Any:
    from sessionstore.langgraph import SessionStoreSaver

    return SessionStoreSaver(socket_path)


def put_for(saver: Any, thread: str, deadline: float) -> tuple[list[float], int]:
    """Puts on one thread until the deadline, each on the previous: latencies, errors."""
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    latencies: list[float] = []
    errors = 0
    number = 0
    while time.perf_counter() < deadline:
        checkpoint = _checkpoint(number)
        started = time.perf_counter()
        try:
            config = saver.put(config, checkpoint, {"source": "loop", "step": number}, {})
        except Exception:  # SQLite's "database is locked", counted
            errors += 1
        else:
            latencies.append(time.perf_counter() - started)
        number += 1
    return latencies, errors


def _postgres_saver(url: str) -> Any:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    return PostgresSaver(psycopg.connect(url, autocommit=True, prepare_threshold=0))


SAVERS = {"sqlite": _sqlite_saver, "postgres": _postgres_saver, "ours": _ours}


def _put_process(args: tuple[str, str, str, float, float]) -> tuple[list[float], int]:
    """One of the 8: ready, it waits for the common start, then puts until the deadline."""
    which, where, thread, start, deadline = args
    saver = SAVERS[which](where)
    time.sleep(max(0.0, start - time.time()))
    return put_for(saver, thread, time.perf_counter() + (deadline - time.time()))


def puts_in_processes(which: str, where: str, seconds: float) -> dict[str, Any]:
    """PROCESSES processes putting at once, each on its own thread, for `seconds`."""
    start = time.time() + SPAWN_SLACK_S  # every process imports and connects before it
    jobs = [(which, where, f"p{n}", start, start + seconds) for n in range(PROCESSES)]
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        results = pool.map(_put_process, jobs)
    latencies = [x for lats, _ in results for x in lats]
    return figures_of(latencies, seconds, sum(e for _, e in results))


async def _aput_for(saver: Any, thread: str, seconds: float) -> list[float]:
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    latencies: list[float] = []
    number = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        config = await saver.aput(config, _checkpoint(number), {"step": number}, {})
        latencies.append(time.perf_counter() - started)
        number += 1
    return latencies


async def _async_sqlite(db: str, seconds: float) -> list[float]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        await saver.setup()
        return await _aput_for(saver, "aput", seconds)


async def _async_ours(socket_path: str, seconds: float) -> list[float]:
    saver = _ours(socket_path)
    try:
        return await _aput_for(saver, "aput", seconds)
    finally:
        await saver.aclose()


async def _add_items_for(session: Any, seconds: float) -> list[float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    number = 0
    while time.perf_counter() < deadline:
        item = {"role": "user", "content": f"{number} {PAYLOAD}"}
        started = time.perf_counter()
        await session.add_items([item])
        latencies.append(time.perf_counter() - started)
        number += 1
    return latencies


async def _prefill(session: Any, count: int) -> None:
    for start in range(0, count, 500):
        size = min(500, count - start)
        await session.add_items([{"role": "user", "content": PAYLOAD} for _ in range(size)])


def _run(coroutine: Awaitable[Any]) -> Any:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def run(socket_path: str, workdir: Path, seconds: float) -> dict[str, Any]:
    from agents.memory import SQLiteSession

    from sessionstore.agents import SessionStoreSession

    out: dict[str, Any] = {}
    db = str(workdir / "langgraph.db")
    probe = sqlite3.connect(db)
    probe.execute("PRAGMA journal_mode=WAL")
    out["sqlite_synchronous"] = probe.execute("PRAGMA synchronous").fetchone()[0]
    probe.close()

    saver_sqlite = _sqlite_saver(db)
    lat, err = put_for(saver_sqlite, "one", time.perf_counter() + seconds)
    out["SqliteSaver.put 1 thread"] = figures_of(lat, seconds, err)
    lat, err = put_for(_ours(socket_path), "one", time.perf_counter() + seconds)
    out["SessionStoreSaver.put 1 thread"] = figures_of(lat, seconds, err)
    out["AsyncSqliteSaver.aput 1 task"] = figures_of(
        _run(_async_sqlite(str(workdir / "async.db"), seconds)), seconds
    )
    out["SessionStoreSaver.aput 1 task"] = figures_of(
        _run(_async_ours(socket_path, seconds)), seconds
    )

    out["SqliteSaver.put 8 processes"] = puts_in_processes("sqlite", db, seconds)
    out["SessionStoreSaver.put 8 processes"] = puts_in_processes("ours", socket_path, seconds)

    async def sessions() -> None:
        sqlite_session = SQLiteSession("bench", str(workdir / "agents.db"))
        out["SQLiteSession.add_items 1 caller"] = figures_of(
            await _add_items_for(sqlite_session, seconds), seconds
        )
        ours = SessionStoreSession("bench", socket_path)
        out["SessionStoreSession.add_items 1 caller"] = figures_of(
            await _add_items_for(ours, seconds), seconds
        )
        short = SessionStoreSession("at-10", socket_path)
        await _prefill(short, 10)
        out["SessionStoreSession.add_items at 10 items"] = figures_of(
            await _add_items_for(short, seconds), seconds
        )
        long = SessionStoreSession("at-10000", socket_path)
        await _prefill(long, 10_000)
        out["SessionStoreSession.add_items at 10,000 items"] = figures_of(
            await _add_items_for(long, seconds), seconds
        )
        for session in (ours, short, long):
            await session.close()

    _run(sessions())
    out["targets"] = _targets(out)
    return out


def _ratio(out: dict[str, Any], ours: str, theirs: str, figure: str) -> float:
    return round(out[ours][figure] / out[theirs][figure], 2)


def _targets(out: dict[str, Any]) -> dict[str, float]:
    return {
        "saver put p50: x SqliteSaver.put (<= 2)": _ratio(
            out, "SessionStoreSaver.put 1 thread", "SqliteSaver.put 1 thread", "p50_ms"
        ),
        "8 processes: x SqliteSaver puts/s (>= 2)": _ratio(
            out, "SessionStoreSaver.put 8 processes", "SqliteSaver.put 8 processes", "ops_per_s"
        ),
        "add_items p50: x SQLiteSession (<= 1)": _ratio(
            out,
            "SessionStoreSession.add_items 1 caller",
            "SQLiteSession.add_items 1 caller",
            "p50_ms",
        ),
        "add_items p50 at 10,000 items: x at 10 (<= 2)": _ratio(
            out,
            "SessionStoreSession.add_items at 10,000 items",
            "SessionStoreSession.add_items at 10 items",
            "p50_ms",
        ),
    }


def main(daemon_factory: Callable[[Path], Any], workdir: Path, seconds: float) -> dict[str, Any]:
    daemon = daemon_factory(workdir)
    try:
        return run(daemon.socket, workdir, seconds)
    finally:
        daemon.stop()


if __name__ == "__main__":  # python -m bench.adapters [--dir DIR] [--seconds S]: this part alone
    from .plots import write_part
    from .standalone import run_alone

    run_alone(
        "python -m bench.adapters",
        main,
        3.0,
        lambda result_file: write_part("adapters", result_file),
    )
