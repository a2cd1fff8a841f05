# Where a LangGraph put on PostgreSQL spends its time, statement by statement:
# one thread putting checkpoints for a few seconds, through PostgresSaver (set up
# as its documentation says) and through SessionStoreSaver via a daemon on the
# same cluster, each on a database of its own, with pg_stat_statements loaded.
# For each: puts a second and their p50, the statements PostgreSQL ran per put
# (calls, mean execution time, rows; those inside functions too, so a function's
# time is also counted in the statements it ran), the daemon's CPU per put by
# thread from /proc, and its round trips per batch from `stats`.
#
#   python -m bench.pg_statements [--dir DIR] [--seconds S]
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

from .adapters import _ours, _postgres_saver, figures_of, put_for
from .cpu import thread_cpu_s

STATEMENT_CHARS = 90  # of each statement's text, in the table
TOP_STATEMENTS = 14


def _statements(url: str, puts: int) -> list[dict[str, Any]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query, calls, total_exec_time, rows, total_plan_time, plans"
            " FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND query NOT ILIKE '%%pg_stat_statements%%'"
            " ORDER BY total_exec_time DESC LIMIT %s",
            (TOP_STATEMENTS,),
        ).fetchall()
    return [
        {
            "statement": " ".join(query.split())[:STATEMENT_CHARS],
            "calls_per_put": round(calls / max(puts, 1), 2),
            "exec_us_per_call": round(total_ms * 1000 / max(calls, 1), 1),
            "exec_us_per_put": round(total_ms * 1000 / max(puts, 1), 1),
            "rows_per_call": round(rows / max(calls, 1), 2),
            "plans_per_call": round(plans / max(calls, 1), 2),
            "plan_us_per_plan": round(plan_ms * 1000 / max(plans, 1), 1),
        }
        for query, calls, total_ms, rows, plan_ms, plans in rows
    ]


def _reset(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def _database(server: Any) -> str:
    url: str = server.url(server.create_database())
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return url


def _profile(saver: Any, url: str, seconds: float, daemon: Any = None) -> dict[str, Any]:
    put_for(saver, "warm-up", time.perf_counter() + 0.5)
    _reset(url)
    before = thread_cpu_s(daemon.proc.pid)[0] if daemon is not None else {}
    latencies, errors = put_for(saver, "profiled", time.perf_counter() + seconds)
    out = figures_of(latencies, seconds, errors)
    out["statements"] = _statements(url, len(latencies))
    if daemon is not None:
        after = thread_cpu_s(daemon.proc.pid)[0]
        out["daemon_cpu_us_per_put"] = {
            thread: round((after[thread] - before.get(thread, 0.0)) / len(latencies) * 1e6, 1)
            for thread in after
            if after[thread] - before.get(thread, 0.0) > 0
        }
        from sessionstore import Client

        with Client(daemon.socket) as client:
            stats: dict[str, Any] = dict(client.stats())
        out["batch_transactions"] = stats["batch_transactions"]  # PostgreSQL's own field
    return out


def run(daemon_factory: Any, workdir: Path, seconds: float) -> dict[str, Any]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver

    from .postgres import cluster

    with cluster(preload="pg_stat_statements") as server:
        if server is None:
            return {"skipped": "PostgreSQL is not installed (apt install postgresql)"}
        theirs = _database(server)
        with psycopg.connect(theirs, autocommit=True) as conn:
            PostgresSaver(cast(Any, conn)).setup()  # DDL alone: the row type does not matter
        results = {"PostgresSaver": _profile(_postgres_saver(theirs), theirs, seconds)}
        ours = _database(server)
        (workdir / "daemon").mkdir()
        daemon = daemon_factory(workdir / "daemon", "--database", ours)
        try:
            saver = _ours(daemon.socket)
            results["SessionStoreSaver"] = _profile(saver, ours, seconds, daemon)
        finally:
            daemon.stop()
    return results


def main() -> None:
    from .plots import write_pg_statements
    from .standalone import run_alone

    run_alone("python -m bench.pg_statements", run, 5.0, write_pg_statements)


if __name__ == "__main__":
    main()
