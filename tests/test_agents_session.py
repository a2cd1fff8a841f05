# SessionStoreSession against a real daemon: what the SDK's own session tests
# check (limits, order, pop on empty, clear, sessions kept apart), a
# conversation carried from one process to the next through Runner.run with
# the SDK's offline ScriptedModel, and sixteen concurrent writers over four
# processes.
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents.memory import Session, SessionSettings

from sessionstore.agents import SessionStoreSession

from . import agents_child
from .conftest import DaemonProcess

REPO = Path(__file__).resolve().parent.parent


def message(text: str) -> Any:
    return {"role": "user", "content": text}


def run(
    running: DaemonProcess, body: Callable[[Callable[..., SessionStoreSession]], Awaitable[None]]
) -> None:
    opened: list[SessionStoreSession] = []

    def session(session_id: str, **options: Any) -> SessionStoreSession:
        opened.append(SessionStoreSession(session_id, running.socket_path, **options))
        return opened[-1]

    async def main() -> None:
        try:
            await body(session)
        finally:
            for each in opened:
                await each.close()

    asyncio.run(main())


def test_it_is_a_session_of_the_sdk(running: DaemonProcess) -> None:
    assert isinstance(SessionStoreSession("s", running.socket_path), Session)


def test_items_come_back_in_order_and_limits_take_the_newest(running: DaemonProcess) -> None:
    async def body(session: Callable[..., SessionStoreSession]) -> None:
        chat = session("chat")
        assert await chat.get_items() == []
        await chat.add_items([message("one"), message("two")])
        await chat.add_items([])
        await chat.add_items([message("three"), message("four"), message("five")])
        texts = [item["content"] for item in await chat.get_items()]  # type: ignore[typeddict-item]
        assert texts == ["one", "two", "three", "four", "five"]
        newest = await chat.get_items(limit=2)
        assert [i["content"] for i in newest] == ["four", "five"]  # type: ignore[typeddict-item]
        assert len(await chat.get_items(limit=50)) == 5
        assert await chat.get_items(limit=0) == []
        limited = session("chat", session_settings=SessionSettings(limit=3))
        assert [i["content"] for i in await limited.get_items()] == ["three", "four", "five"]  # type: ignore[typeddict-item]
        assert len(await limited.get_items(limit=1)) == 1  # an explicit limit wins

    run(running, body)


def test_a_long_history_is_read_across_pages(running: DaemonProcess) -> None:
    async def body(session: Callable[..., SessionStoreSession]) -> None:
        chat = session("long")
        for start in range(0, 2500, 500):
            await chat.add_items([message(str(n)) for n in range(start, start + 500)])
        everything = await chat.get_items()
        assert [int(i["content"]) for i in everything] == list(range(2500))  # type: ignore[typeddict-item]
        newest = await chat.get_items(limit=1200)
        assert [int(i["content"]) for i in newest] == list(range(1300, 2500))  # type: ignore[typeddict-item]

    run(running, body)


def test_pop_takes_the_newest_and_empty_gives_none(running: DaemonProcess) -> None:
    async def body(session: Callable[..., SessionStoreSession]) -> None:
        chat = session("pop")
        assert await chat.pop_item() is None
        await chat.add_items([message("a"), message("b")])
        assert await chat.pop_item() == message("b")
        assert await chat.get_items() == [message("a")]
        assert await chat.pop_item() == message("a")
        assert await chat.pop_item() is None
        many = session("pop-race")
        await many.add_items([message(str(n)) for n in range(30)])
        popped = await asyncio.gather(*(many.pop_item() for _ in range(40)))
        taken = [item for item in popped if item is not None]
        assert sorted(int(i["content"]) for i in taken) == list(range(30))  # type: ignore[typeddict-item]
        assert await many.get_items() == []

    run(running, body)


def test_clear_and_sessions_kept_apart(running: DaemonProcess) -> None:
    async def body(session: Callable[..., SessionStoreSession]) -> None:
        ids = ["s", "s/1", "s1", "s%2F1", "../../etc/passwd", "x" * 900]
        for number, session_id in enumerate(ids):
            await session(session_id).add_items([message(f"{number}-{k}") for k in range(3)])
        for number, session_id in enumerate(ids):
            got = await session(session_id).get_items()
            assert got == [message(f"{number}-{k}") for k in range(3)], session_id
        await session("s").clear_session()
        assert await session("s").get_items() == []
        assert len(await session("s/1").get_items()) == 3
        assert len(await session("s1").get_items()) == 3

    run(running, body)


def child(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "tests.agents_child", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_second_process_continues_the_conversation(running: DaemonProcess) -> None:
    first = child(running.socket_path, "ada", "turn1")
    assert first.returncode == 0, first.stderr
    second = child(running.socket_path, "ada", "turn2")
    assert second.returncode == 0, second.stderr
    given = json.dumps(json.loads(second.stdout))
    assert "My name is Ada." in given and "Hello, Ada." in given
    assert (
        given.index("My name is Ada.")
        < given.index("Hello, Ada.")
        < given.index("What is my name?")
    )

    async def body(session: Callable[..., SessionStoreSession]) -> None:
        history = await session("ada").get_items()
        assert len(history) == 4  # two questions, two answers

    run(running, body)


def test_sixteen_callers_over_four_processes_lose_nothing_and_keep_order(
    running: DaemonProcess,
) -> None:
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.agents_child",
                running.socket_path,
                "shared",
                "add",
                f"p{n}",
            ],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err

    async def body(session: Callable[..., SessionStoreSession]) -> None:
        items = await session("shared").get_items()
        texts = [item["content"] for item in items]  # type: ignore[typeddict-item]
        per_caller = agents_child.ITEMS_PER_CALLER
        assert len(texts) == 4 * agents_child.CALLERS * per_caller
        assert len(set(texts)) == len(texts)
        for n in range(4):
            for caller in range(agents_child.CALLERS):
                mine = [t for t in texts if t.startswith(f"p{n}.{caller}.")]
                assert mine == [f"p{n}.{caller}.{k}" for k in range(per_caller)]

    run(running, body)


def test_calls_of_any_size_succeed_past_the_daemons_txn_limits(running: DaemonProcess) -> None:
    """add_items of more items than one txn holds (10,000 ops), and clear_session of more
    than one delete_prefix may remove (100,000): each is split, and succeeds."""

    async def body(session: Callable[..., SessionStoreSession]) -> None:
        chat = session("huge")
        await chat.add_items([message(str(n)) for n in range(10_001)])
        everything = await chat.get_items()
        assert [int(i["content"]) for i in everything] == list(range(10_001))  # type: ignore[typeddict-item]
        for start in range(10_001, 110_001, 10_000):
            await chat.add_items([message(str(n)) for n in range(start, start + 10_000)])
        assert len(await chat.get_items(limit=5)) == 5
        await chat.clear_session()
        assert await chat.get_items() == []
        other = session("other")
        await other.add_items([message("kept")])
        await chat.clear_session()  # nothing left: still fine
        assert len(await other.get_items()) == 1

    run(running, body)
