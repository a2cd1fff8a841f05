# Earlier generations: what keeping them costs and what reading them takes, in
# one run on one disk.
# - a save at --keep-generations 0, 8 and 64: saves/s and p50 of 4 KiB at 1 and
#   64 clients, and the daemon's CPU per save at 64 (from /proc), the mean of
#   ROUNDS_OF_SAVES daemons each, the Ns interleaved: keeping one
#   more generation is a list append in the index, so none of these may grow
#   with N; on PostgreSQL too (a throwaway cluster), where a save first keeps
#   the row it replaces in ss_generations;
# - `history` and `load at` (a random generation kept) p50 at one client, N = 8;
# - the space a session takes at N = 8 against N = 0: SESSIONS sessions of 4
#   KiB saved ROUNDS times each, then live bytes per session (after a compaction);
# - AdvancedSessionStoreSession against the SDK's AdvancedSQLiteSession (a file
#   database on the same disk): add_items of one turn (a user message and a
#   reply) p50, and create_branch_from_turn p50 on a 20-turn conversation.
from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from sessionstore.client import Client

from .adapters import figures_of
from .load import run_clients
from .workload import make_snapshot

KIB = 1024
KEEPS = (0, 8, 64)
SESSIONS = 1000
ROUNDS = 12  # more than 8 + 1: every session holds as many generations as it may
READS = 2000
TURNS = 20
WARM_UP_S = 1.0
ROUNDS_OF_SAVES = 2  # each N's mean over this many daemons


def _p50_ms(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return round(ordered[len(ordered) // 2] * 1000, 3) if ordered else 0.0


def _saves(daemon: Any, keep: int, seconds: float) -> dict[str, Any]:
    run_clients(daemon.socket, "save", 64, 4 * KIB, WARM_UP_S, f"warm-{keep}")  # not counted
    one = run_clients(daemon.socket, "save", 1, 4 * KIB, seconds, f"one-{keep}")
    before = daemon.cpu_s()
    many = run_clients(daemon.socket, "save", 64, 4 * KIB, seconds, f"many-{keep}")
    cpu = daemon.cpu_s() - before
    return {
        "saves_per_s_1": round(one.operations / one.elapsed_s),
        "p50_ms_1": _p50_ms(one.latencies_s),
        "saves_per_s_64": round(many.operations / many.elapsed_s),
        "p50_ms_64": _p50_ms(many.latencies_s),
        "cpu_us_per_save_64": round(cpu / max(1, many.operations) * 1e6, 1),
    }


def _space_per_session(daemon: Any) -> float:
    with Client(daemon.socket) as client:
        for round_ in range(ROUNDS):
            for n in range(SESSIONS):
                snapshot = make_snapshot(f"space/{n}", 4 * KIB)
                snapshot["session"]["round"] = round_
                client.save(snapshot)
        client.compact()
        return round(client.stats()["live_bytes"] / SESSIONS)


def _reads(daemon: Any) -> dict[str, Any]:
    with Client(daemon.socket) as client:
        for round_ in range(ROUNDS):
            snapshot = make_snapshot("read", 4 * KIB)
            snapshot["session"]["round"] = round_
            client.save(snapshot)
        seqs = [g["seq"] for g in client.history("read")]
        history, load_at = [], []
        for _ in range(READS):
            started = time.perf_counter()
            client.history("read")
            history.append(time.perf_counter() - started)
            started = time.perf_counter()
            client.load("read", at=random.choice(seqs))
            load_at.append(time.perf_counter() - started)
    return {"generations": len(seqs), "history_p50_ms": _p50_ms(history),
            "load_at_p50_ms": _p50_ms(load_at)}  # fmt: skip


def _conversation(turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for n in range(turns):
        items += [{"role": "user", "content": f"question {n} " + "q" * 200},
                  {"role": "assistant", "content": f"answer {n} " + "a" * 800}]  # fmt: skip
    return items


async def _advanced(session: Any, seconds: float) -> dict[str, Any]:
    adds: list[float] = []
    deadline = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < deadline:
        turn = _conversation(1)
        turn[0]["content"] += str(n)
        started = time.perf_counter()
        await session.add_items(turn)
        adds.append(time.perf_counter() - started)
        n += 1
    branching = type(session)(session_id="branching", create_tables=True, **_where(session))
    await branching.add_items(_conversation(TURNS))
    branches: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        await branching.create_branch_from_turn(TURNS // 2)
        branches.append(time.perf_counter() - started)
        await branching.switch_to_branch("main")
    result = {
        "add_items": figures_of(adds, seconds),
        "create_branch": figures_of(branches, seconds),
    }
    closed = branching.close()
    if asyncio.iscoroutine(closed):
        await closed
    return result


def _where(session: Any) -> dict[str, Any]:
    if hasattr(session, "db_path"):
        return {"db_path": session.db_path}
    return {"socket_path": session.socket_path}


def run(daemon_type: Any, workdir: Path, seconds: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    rounds: dict[int, list[dict[str, Any]]] = {keep: [] for keep in KEEPS}
    for round_ in range(ROUNDS_OF_SAVES):  # interleaved: a slow moment of the VM hits all
        for keep in sorted(KEEPS, reverse=True):
            where = workdir / f"keep-{keep}-{round_}"
            where.mkdir()
            daemon = daemon_type(where, "--keep-generations", str(keep))
            try:
                rounds[keep].append(_saves(daemon, keep, seconds))
            finally:
                daemon.stop()
    for keep, measured in rounds.items():
        results[f"keep_{keep}"] = {
            name: round(statistics.mean(m[name] for m in measured), 3) for name in measured[0]
        }
    for keep in (0, 8):
        (workdir / f"space-{keep}").mkdir()
        daemon = daemon_type(workdir / f"space-{keep}", "--keep-generations", str(keep))
        try:
            if keep == 8:
                results["keep_8"].update(_reads(daemon))
            results[f"keep_{keep}"]["bytes_per_session"] = _space_per_session(daemon)
        finally:
            daemon.stop()
    results.update(_on_postgres(daemon_type, workdir, seconds))
    results.update(_advanced_against_sqlite(daemon_type, workdir, seconds))
    return results


def _on_postgres(daemon_type: Any, workdir: Path, seconds: float) -> dict[str, Any]:
    from .postgres import cluster

    results: dict[str, Any] = {}
    with cluster() as server:
        if server is None:
            return {"postgresql": "skipped: PostgreSQL is not installed"}
        for keep in KEEPS:
            where = workdir / f"pg-keep-{keep}"
            where.mkdir()
            url = server.url(server.create_database())
            daemon = daemon_type(where, "--database", url, "--keep-generations", str(keep))
            try:
                many = run_clients(daemon.socket, "save", 64, 4 * KIB, seconds, f"pg-{keep}")
            finally:
                daemon.stop()
            results[f"postgresql_keep_{keep}"] = {
                "saves_per_s_64": round(many.operations / many.elapsed_s),
                "p50_ms_64": _p50_ms(many.latencies_s),
            }
    return results


def _advanced_against_sqlite(daemon_type: Any, workdir: Path, seconds: float) -> dict[str, Any]:
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from agents.extensions.memory import AdvancedSQLiteSession

    from sessionstore.agents import AdvancedSessionStoreSession

    (workdir / "advanced").mkdir()
    daemon = daemon_type(workdir / "advanced")
    try:
        ours = AdvancedSessionStoreSession(session_id="bench", socket_path=daemon.socket)
        figures = {"AdvancedSessionStoreSession": asyncio.run(_advanced(ours, seconds))}
    finally:
        daemon.stop()
    theirs = AdvancedSQLiteSession(
        session_id="bench", db_path=workdir / "advanced.db", create_tables=True
    )
    figures["AdvancedSQLiteSession"] = asyncio.run(_advanced(theirs, seconds))
    theirs.close()
    return figures


def main() -> None:
    from .standalone import run_alone

    run_alone("python -m bench.generations", run, 5.0)


if __name__ == "__main__":
    main()
