# Google ADK's and Strands Agents' sessions against each framework's own durable
# backend, in one run, on one disk (and one throwaway PostgreSQL cluster):
# - ADK: append_event p50 at one process and appends a second of 8 processes,
#   each appending to a session of its own, through SessionStoreSessionService
#   and DatabaseSessionService on SQLite (aiosqlite) and on PostgreSQL (asyncpg),
#   as ADK's documentation sets it up; get_session of a 5,000-event session,
#   whole and with num_recent_events=20; 20 concurrent invocations appending to
#   one session (each reloads and tries again when refused as stale);
# - Strands: a message stored (create_message through the repository, as the
#   session manager stores each one) p50 at one process and messages a second of
#   8 processes, through SessionStoreSessionRepository and FileSessionManager.
# Events and messages carry about 1 KiB of text.
#
#   python -m bench.agent_frameworks [--dir DIR] [--seconds S]
from __future__ import annotations

import asyncio
import multiprocessing
import time
from pathlib import Path
from typing import Any

from .adapters import PROCESSES, SPAWN_SLACK_S, figures_of

TEXT = "x" * 1024
APP = "bench"
LONG_SESSION_EVENTS = 5000
RECENT_EVENTS = 20
INVOCATIONS = 20  # appending to one session at once
APPENDS_PER_INVOCATION = 5
READS = 30  # get_session calls timed per point


def _adk_service(where: str) -> Any:
    if where.startswith(("sqlite", "postgresql")):
        from google.adk.sessions.database_session_service import DatabaseSessionService

        return DatabaseSessionService(db_url=where)
    from sessionstore.adk import SessionStoreSessionService

    return SessionStoreSessionService(where)


def _event(number: int) -> Any:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    return Event(
        invocation_id=f"invocation-{number}",
        author="assistant",
        content=types.Content(role="model", parts=[types.Part(text=TEXT)]),
        actions=EventActions(state_delta={"turn": number}),
    )


async def _close(service: Any) -> None:
    if hasattr(service, "close"):
        await service.close()


async def _appends(where: str, session_id: str, seconds: float, start_at: float) -> list[float]:
    service = _adk_service(where)
    try:
        session = await service.create_session(app_name=APP, user_id="u", session_id=session_id)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds
        number = 0
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await service.append_event(session, _event(number))
            latencies.append(time.perf_counter() - started)
            number += 1
        return latencies
    finally:
        await _close(service)


def _append_process(args: tuple[str, str, float, float]) -> list[float]:
    where, session_id, seconds, start_at = args
    return asyncio.run(_appends(where, session_id, seconds, start_at))


def _in_processes(worker: Any, jobs: list[Any], seconds: float) -> dict[str, Any]:
    with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:
        results = pool.map(worker, jobs)
    return figures_of([x for latencies in results for x in latencies], seconds)


async def _reads(where: str, tag: str) -> dict[str, Any]:
    """get_session of a LONG_SESSION_EVENTS-event session: whole, and the newest 20."""
    from google.adk.sessions.base_session_service import GetSessionConfig

    service = _adk_service(where)
    try:
        session = await service.create_session(app_name=APP, user_id="u", session_id=f"long-{tag}")
        for number in range(LONG_SESSION_EVENTS):
            await service.append_event(session, _event(number))
        out = {}
        for label, config in (
            ("whole", None),
            (f"newest {RECENT_EVENTS}", GetSessionConfig(num_recent_events=RECENT_EVENTS)),
        ):
            latencies = []
            for _ in range(READS if config else max(3, READS // 10)):
                started = time.perf_counter()
                got = await service.get_session(
                    app_name=APP, user_id="u", session_id=session.id, config=config
                )
                latencies.append(time.perf_counter() - started)
                assert got is not None
            out[label] = figures_of(latencies, sum(latencies))
        return out
    finally:
        await _close(service)


async def _invocations(where: str, tag: str) -> dict[str, Any]:
    """INVOCATIONS tasks appending to one session at once, each reloading its session
    and trying again when refused as stale: appends a second, and how many were."""
    from google.adk.errors import StaleSessionError

    service = _adk_service(where)
    refused = 0
    try:
        session_id = f"shared-{tag}"
        await service.create_session(app_name=APP, user_id="u", session_id=session_id)

        async def invocation(number: int) -> None:
            nonlocal refused
            for turn in range(APPENDS_PER_INVOCATION):
                while True:
                    session = await service.get_session(app_name=APP, user_id="u",
                                                        session_id=session_id)  # fmt: skip
                    try:
                        await service.append_event(session, _event(number * 100 + turn))
                        break
                    except StaleSessionError:
                        refused += 1

        started = time.perf_counter()
        await asyncio.gather(*(invocation(n) for n in range(INVOCATIONS)))
        elapsed = time.perf_counter() - started
        stored = await service.get_session(app_name=APP, user_id="u", session_id=session_id)
        appended = INVOCATIONS * APPENDS_PER_INVOCATION
        assert stored is not None and len(stored.events) == appended
        return {"ops_per_s": round(appended / elapsed, 1), "seconds": round(elapsed, 3),
                "refused_as_stale": refused}  # fmt: skip
    finally:
        await _close(service)


def _message(number: int) -> Any:
    from strands.types.session import SessionMessage

    return SessionMessage.from_message({"role": "user", "content": [{"text": TEXT}]}, number)


def _repository(where: str) -> Any:
    """A FileSessionManager in the directory "file:DIR", else ours on the socket."""
    if where.startswith("file:"):
        from strands.session.file_session_manager import FileSessionManager

        return FileSessionManager(session_id="bench", storage_dir=where.removeprefix("file:"))
    from sessionstore.strands import SessionStoreSessionRepository

    return SessionStoreSessionRepository(where)


def _messages_process(args: tuple[str, str, float, float]) -> list[float]:
    import warnings

    from strands.types.session import Session, SessionAgent, SessionType

    where, session_id, seconds, start_at = args
    with warnings.catch_warnings():  # FileSessionManager says it is deprecated
        warnings.simplefilter("ignore")
        repository = _repository(where)
    repository.create_session(Session(session_id=session_id, session_type=SessionType.AGENT))
    repository.create_agent(session_id, SessionAgent("default", {}, {}))
    time.sleep(max(0.0, start_at - time.time()))
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    number = 0
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        repository.create_message(session_id, "default", _message(number))
        latencies.append(time.perf_counter() - started)
        number += 1
    return latencies


def run(daemon_factory: Any, workdir: Path, seconds: float) -> dict[str, Any]:
    from .postgres import cluster

    out: dict[str, Any] = {}
    (workdir / "daemon").mkdir()
    daemon = daemon_factory(workdir / "daemon")
    try:
        with cluster() as server:
            backends = {
                "SessionStoreSessionService": daemon.socket,
                "DatabaseSessionService (SQLite)": f"sqlite+aiosqlite:///{workdir / 'adk.db'}",
            }
            if server is not None:
                url = server.url(server.create_database())
                backends["DatabaseSessionService (PostgreSQL)"] = url.replace(
                    "postgresql://", "postgresql+asyncpg://", 1
                )
            for name, where in backends.items():
                tag = name.split()[-1].strip("()").lower()
                start = time.time()
                out[f"{name} append_event 1 process"] = _in_processes(
                    _append_process, [(where, f"one-{tag}", seconds, start)], seconds
                )
                start = time.time() + SPAWN_SLACK_S
                jobs = [(where, f"p{n}-{tag}", seconds, start) for n in range(PROCESSES)]
                out[f"{name} append_event 8 processes"] = _in_processes(
                    _append_process, jobs, seconds
                )
                reads = asyncio.run(_reads(where, tag))
                for label, figures in reads.items():
                    out[f"{name} get_session of 5,000 events, {label}"] = figures
                out[f"{name} 20 invocations on one session"] = asyncio.run(_invocations(where, tag))
        (workdir / "strands").mkdir()
        for name, where in (
            ("SessionStoreSessionRepository", daemon.socket),
            ("FileSessionManager", f"file:{workdir / 'strands'}"),
        ):
            start = time.time()
            out[f"{name} message stored 1 process"] = _in_processes(
                _messages_process, [(where, "one", seconds, start)], seconds
            )
            start = time.time() + SPAWN_SLACK_S
            jobs = [(where, f"p{n}", seconds, start) for n in range(PROCESSES)]
            out[f"{name} message stored 8 processes"] = _in_processes(
                _messages_process, jobs, seconds
            )
    finally:
        daemon.stop()
    out["targets"] = targets(out)
    return out


def targets(out: dict[str, Any]) -> dict[str, float]:
    def figure(name: str, key: str) -> float:
        return float(out.get(name, {}).get(key, float("nan")))

    ours, sqlite = "SessionStoreSessionService", "DatabaseSessionService (SQLite)"
    return {
        "get_session newest 20 of 5,000 events p50 ms (<= 5)": figure(
            f"{ours} get_session of 5,000 events, newest {RECENT_EVENTS}", "p50_ms"
        ),
        "append_event p50 x DatabaseSessionService on SQLite (<= 1)": round(
            figure(f"{ours} append_event 1 process", "p50_ms")
            / figure(f"{sqlite} append_event 1 process", "p50_ms"),
            2,
        ),
        "append_event 8 processes x DatabaseSessionService on SQLite (>= 2)": round(
            figure(f"{ours} append_event 8 processes", "ops_per_s")
            / figure(f"{sqlite} append_event 8 processes", "ops_per_s"),
            2,
        ),
    }


def main() -> None:
    from .plots import write_part
    from .standalone import run_alone

    run_alone(
        "python -m bench.agent_frameworks",
        run,
        3.0,
        lambda result_file: write_part("agent_frameworks", result_file),
    )


if __name__ == "__main__":
    main()
