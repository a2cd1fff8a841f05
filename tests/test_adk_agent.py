# A real ADK agent (LlmAgent under ADK's Runner, a scripted model of our own in
# place of a network one) keeps its conversation in sessionstore: a kill -9 of
# the daemon between two turns loses nothing, and the second turn's model sees
# the first turn; a rewind keeps the history and undoes the state.
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.events.event import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.genai import types

from sessionstore import Client, StaleOwner
from sessionstore.adk import SessionStoreSessionService

from .conftest import DaemonProcess

APP, USER = "demo", "u1"


class ScriptedLlm(BaseLlm):
    """Answers each request with the next of its replies; keeps what it was asked."""

    model: str = "scripted"
    replies: list[str] = []
    requests: list[LlmRequest] = []

    @classmethod
    def supported_models(cls) -> list[str]:
        return ["scripted"]

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(llm_request)
        text = self.replies[len(self.requests) - 1]
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


def _texts(request: LlmRequest) -> list[str]:
    return [part.text for content in request.contents for part in content.parts or [] if part.text]


async def _turn(socket_path: str, session_id: str | None, said: str, reply: str) -> Any:
    service = SessionStoreSessionService(socket_path)
    model = ScriptedLlm(replies=[reply])
    agent = LlmAgent(name="assistant", model=model, instruction="Be brief.", output_key="last")
    runner = Runner(app_name=APP, agent=agent, session_service=service)
    try:
        if session_id is None:
            session_id = (await service.create_session(app_name=APP, user_id=USER)).id
        message = types.Content(role="user", parts=[types.Part(text=said)])
        events = [
            event
            async for event in runner.run_async(
                user_id=USER, session_id=session_id, new_message=message
            )
        ]
        return session_id, events, model.requests
    finally:
        await runner.close()
        await service.close()


def test_an_adk_agent_resumes_its_conversation_after_kill_9(running: DaemonProcess) -> None:
    session_id, events, _ = asyncio.run(_turn(running.socket_path, None, "hi", "hello"))
    assert events[-1].content.parts[0].text == "hello"
    running.kill9()
    running.start()
    _, _, requests = asyncio.run(_turn(running.socket_path, session_id, "again", "second"))
    assert _texts(requests[0]) == ["hi", "hello", "again"]  # the first turn, kept

    async def stored() -> Any:
        service = SessionStoreSessionService(running.socket_path)
        try:
            return await service.get_session(app_name=APP, user_id=USER, session_id=session_id)
        finally:
            await service.close()

    session = asyncio.run(stored())
    assert session.state == {"last": "second"}
    assert [e.author for e in session.events] == ["user", "assistant", "user", "assistant"]


def test_a_rewind_keeps_the_history_and_undoes_the_state(running: DaemonProcess) -> None:
    async def main() -> Any:
        session_id, first, _ = await _turn(running.socket_path, None, "one", "first")
        await _turn(running.socket_path, session_id, "two", "second")
        service = SessionStoreSessionService(running.socket_path)
        runner = Runner(
            app_name=APP,
            agent=LlmAgent(name="assistant", model=ScriptedLlm(replies=[])),
            session_service=service,
        )
        try:
            await runner.rewind_async(
                user_id=USER, session_id=session_id,
                rewind_before_invocation_id=first[-1].invocation_id,
            )  # fmt: skip
            return await service.get_session(app_name=APP, user_id=USER, session_id=session_id)
        finally:
            await runner.close()
            await service.close()

    session = asyncio.run(main())
    assert len(session.events) == 5  # both turns kept, and the rewind's own event
    assert session.events[-1].actions.rewind_before_invocation_id
    assert "last" in session.state and session.state["last"] is None  # as before turn one


def test_two_workers_resume_one_session_and_only_the_owner_writes(
    running: DaemonProcess,
) -> None:
    """Worker a runs the session; worker b resumes it (a redeploy) and takes it over;
    a's next turn is refused with StaleOwner and writes nothing."""

    async def main() -> Any:
        first = SessionStoreSessionService(running.socket_path, owner="worker-a")
        second = SessionStoreSessionService(running.socket_path, owner="worker-b")
        model_a, model_b = ScriptedLlm(replies=["a1", "a2"]), ScriptedLlm(replies=["b1"])
        runner_a = Runner(app_name=APP, agent=LlmAgent(name="assistant", model=model_a),
                          session_service=first)  # fmt: skip
        runner_b = Runner(app_name=APP, agent=LlmAgent(name="assistant", model=model_b),
                          session_service=second)  # fmt: skip

        async def turn(runner: Runner, said: str) -> None:
            message = types.Content(role="user", parts=[types.Part(text=said)])
            async for _ in runner.run_async(user_id=USER, session_id="s", new_message=message):
                pass

        try:
            await first.create_session(app_name=APP, user_id=USER, session_id="s")
            await turn(runner_a, "one")
            with pytest.raises(StaleOwner):  # b may not write while a owns it
                await turn(runner_b, "from b, too early")
            await second.take_over(app_name=APP, user_id=USER, session_id="s")
            await turn(runner_b, "two")
            with pytest.raises(StaleOwner):  # a was fenced
                await turn(runner_a, "from a, fenced")
            with pytest.raises(StaleOwner):  # from deleting it too
                await first.delete_session(app_name=APP, user_id=USER, session_id="s")
            return await second.get_session(app_name=APP, user_id=USER, session_id="s")
        finally:
            for runner in (runner_a, runner_b):
                await runner.close()
            await first.close()
            await second.close()

    session = asyncio.run(main())
    said = [e.content.parts[0].text for e in session.events if e.author == "user"]
    assert said == ["one", "two"]  # neither refused turn left anything
    assert [e.content.parts[0].text for e in session.events if e.author != "user"] == [
        "a1", "b1",
    ]  # fmt: skip


def test_a_lapsed_owner_is_taken_over_without_an_operator(running: DaemonProcess) -> None:
    async def main() -> Any:
        dead = SessionStoreSessionService(running.socket_path, owner="dead")
        alive = SessionStoreSessionService(running.socket_path, owner="alive")
        try:
            await dead.create_session(app_name=APP, user_id=USER, session_id="s")
            # its lease lapses: the daemon removes the owner document when its lease_ttl_s
            # passes (expiry is the daemon's, tested on its own); here, at once
            with Client(running.socket_path) as client:
                client.txn([{"op": "delete", "kind": "kv", "key": dead._owner_key(APP, USER, "s")}])
            session = await alive.get_session(app_name=APP, user_id=USER, session_id="s")
            await alive.append_event(session, Event(author="user", invocation_id="i"))
            stale = await dead.get_session(app_name=APP, user_id=USER, session_id="s")
            with pytest.raises(StaleOwner):
                await dead.append_event(stale, Event(author="user", invocation_id="j"))
            return await alive.get_session(app_name=APP, user_id=USER, session_id="s")
        finally:
            await dead.close()
            await alive.close()

    assert [e.invocation_id for e in asyncio.run(main()).events] == ["i"]
