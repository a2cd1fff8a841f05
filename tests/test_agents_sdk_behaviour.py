# What the OpenAI Agents SDK's own session tests expect of any backend, as its
# bundled SQLiteSession does it: session_settings taken as a dict, a
# SessionSettings or nothing; an item that cannot be serialised is a TypeError,
# stores nothing, and leaves the session usable. Through the SDK's Runner and
# its offline ScriptedModel, on both backends.
from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from agents import Agent, Runner
from agents.memory import SessionSettings
from agents.testing import ScriptedModel, assistant_message

from sessionstore import StaleOwner
from sessionstore.agents import AdvancedSessionStoreSession, SessionStoreSession

from .conftest import DaemonProcess


def test_session_settings_are_taken_as_the_sdks_backends_take_them(
    running: DaemonProcess,
) -> None:
    sock = running.socket_path
    assert SessionStoreSession("s", sock).session_settings == SessionSettings()
    given = SessionStoreSession("s", sock, session_settings={"limit": 5})
    assert given.session_settings == SessionSettings(limit=5)
    with pytest.raises(TypeError):
        SessionStoreSession("s", sock, session_settings={"limitt": 1})

    async def main() -> list[Any]:
        session = SessionStoreSession("limited", sock, session_settings={"limit": 2})
        try:
            for turn in range(3):
                model = ScriptedModel([[assistant_message(f"answer {turn}")]])
                agent = Agent(name="assistant", instructions="Answer.", model=model)
                result = await Runner.run(agent, f"question {turn}", session=session)
                assert result.final_output == f"answer {turn}"
            return await session.get_items()
        finally:
            await session.close()

    items = asyncio.run(main())
    assert len(items) == 2  # the limit of the settings given as a dict


def test_an_item_that_cannot_be_serialised_is_a_type_error_and_stores_nothing(
    running: DaemonProcess,
) -> None:
    async def main() -> None:
        session = SessionStoreSession("bad", running.socket_path)
        try:
            await session.add_items([{"role": "user", "content": "kept"}])  # type: ignore[list-item]
            good = [{"role": "user", "content": "fine"}] * 10
            with pytest.raises(TypeError):
                await session.add_items([*good, {"content": object()}])  # type: ignore[list-item]
            assert await session.get_items() == [{"role": "user", "content": "kept"}]
            await session.add_items([{"role": "user", "content": "after"}])  # type: ignore[list-item]
            assert len(await session.get_items()) == 2  # still usable
        finally:
            await session.close()

    asyncio.run(main())


@pytest.mark.parametrize("advanced", [False, True], ids=["SessionStoreSession", "advanced"])
def test_two_workers_resume_one_session_and_only_the_owner_writes(
    running: DaemonProcess, advanced: bool
) -> None:
    """Worker a runs the session; worker b resumes it and takes it over; a's next turn
    is refused with StaleOwner and stores nothing."""

    def open_session(owner: str) -> Any:
        if advanced:
            return AdvancedSessionStoreSession(
                session_id="shared", socket_path=running.socket_path, owner=owner
            )
        return SessionStoreSession("shared", running.socket_path, owner=owner)

    async def turn(session: Any, said: str, answer: str) -> None:
        model = ScriptedModel([[assistant_message(answer)]])
        agent = Agent(name="assistant", instructions="Answer.", model=model)
        await Runner.run(agent, said, session=session)

    async def main() -> list[Any]:
        first, second = open_session("worker-a"), open_session("worker-b")
        try:
            await turn(first, "one", "a1")
            with pytest.raises(StaleOwner):  # b may not write while a owns the session
                await turn(second, "from b, too early", "no")
            await second.take_over()
            await turn(second, "two", "b1")
            with pytest.raises(StaleOwner):  # a was fenced
                await turn(first, "from a, fenced", "no")
            with pytest.raises(StaleOwner):
                await first.clear_session()
            return await second.get_items()
        finally:
            await first.close()
            await second.close()

    items = asyncio.run(main())
    texts = [
        item["content"] if isinstance(item["content"], str) else item["content"][0]["text"]
        for item in items
    ]
    assert texts == ["one", "a1", "two", "b1"]


def test_an_owned_session_with_a_ttl_is_fenced_and_its_items_expire_with_it(
    running: DaemonProcess,
) -> None:
    async def main() -> list[Any]:
        first = SessionStoreSession("timed", running.socket_path, owner="worker-a", ttl=60)
        second = SessionStoreSession("timed", running.socket_path, owner="worker-b", ttl=60)
        try:
            await first.add_items([{"role": "user", "content": "a"}])
            with pytest.raises(StaleOwner):
                await second.add_items([{"role": "user", "content": "b, too early"}])
            await second.take_over()
            await second.add_items([{"role": "user", "content": "b"}])
            with pytest.raises(StaleOwner):
                await first.pop_item()
            return await first.get_items()
        finally:
            await first.close()
            await second.close()

    assert asyncio.run(main()) == [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
    ]
    with running.client() as client:
        stored = client.checkpoint_scan("kv", "agents/timed/")["items"]
    assert len(stored) == 2 and all("expires_at_ms" in item for item in stored)
