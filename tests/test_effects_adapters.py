# Each adapter's tool-effect ledger (saver.effects(thread), session.effects(), ...)
# keeps a session's effects among the session's own documents, and each of its
# records is the adapter's write to the session: under the adapter's owner (a
# superseded owner's tool is refused before it is called), removed with the
# session, copied with a LangGraph thread, expiring with a session that has a
# ttl. And real framework runs (ADK's Runner, Strands' Agent) call a tool under
# it once however often the run is repeated; on both engines.
from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypedDict

import pytest

from sessionstore import Client, StaleOwner
from sessionstore.effects import AsyncLedger, Ledger

from .conftest import DaemonProcess


@dataclass
class Worker:
    """One worker's view of the session "s" through an adapter, with owner=."""

    ledger: Ledger | AsyncLedger
    take_over: Callable[[], Awaitable[None]]
    remove: Callable[[], Awaitable[None]]  # delete (or clear) the session
    close: Callable[[], Awaitable[None]]


def _blocking(call: Callable[[], Any]) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        call()

    return run


def _saver(socket_path: str, owner: str, asynchronous: bool = False) -> Worker:
    from sessionstore.langgraph import SessionStoreSaver

    saver = SessionStoreSaver(socket_path, owner=owner)
    if asynchronous:
        return Worker(saver.aeffects("s"), lambda: saver.atake_over("s"),
                      lambda: saver.adelete_thread("s"), saver.aclose)  # fmt: skip
    return Worker(saver.effects("s"), _blocking(lambda: saver.take_over("s")),
                  _blocking(lambda: saver.delete_thread("s")), _blocking(saver.close))  # fmt: skip


def _agents_session(socket_path: str, owner: str) -> Worker:
    from sessionstore.agents import SessionStoreSession

    session = SessionStoreSession("s", socket_path, owner=owner)
    return Worker(session.effects(), session.take_over, session.clear_session, session.close)


def _advanced_session(socket_path: str, owner: str) -> Worker:
    from sessionstore.agents import AdvancedSessionStoreSession

    session = AdvancedSessionStoreSession(session_id="s", socket_path=socket_path, owner=owner)
    return Worker(session.effects(), session.take_over, session.clear_session, session.close)


def _adk_service(socket_path: str, owner: str) -> Worker:
    from sessionstore.adk import SessionStoreSessionService

    service = SessionStoreSessionService(socket_path, owner=owner)
    where = {"app_name": "app", "user_id": "u", "session_id": "s"}
    return Worker(service.effects(**where), lambda: service.take_over(**where),
                  lambda: service.delete_session(**where), service.close)  # fmt: skip


def _strands_repository(socket_path: str, owner: str, asynchronous: bool = False) -> Worker:
    from strands.types.session import Session, SessionType

    from sessionstore.strands import SessionStoreSessionRepository

    repository = SessionStoreSessionRepository(socket_path, owner=owner)
    if repository.read_session("s") is None:
        repository.create_session(Session(session_id="s", session_type=SessionType.AGENT))
    ledger = repository.aeffects("s") if asynchronous else repository.effects("s")
    return Worker(ledger, _blocking(lambda: repository.take_over("s")),
                  _blocking(lambda: repository.delete_session("s")),
                  _blocking(repository.close))  # fmt: skip


ADAPTERS: dict[str, Callable[[str, str], Worker]] = {
    "langgraph saver": _saver,
    "langgraph saver, async": functools.partial(_saver, asynchronous=True),
    "agents session": _agents_session,
    "agents advanced session": _advanced_session,
    "adk service": _adk_service,
    "strands repository": _strands_repository,
    "strands repository, async": functools.partial(_strands_repository, asynchronous=True),
}


async def _once(ledger: Ledger | AsyncLedger, key: str, tool: Callable[[], str]) -> str:
    if isinstance(ledger, AsyncLedger):

        async def run_async() -> str:
            return tool()

        result: str = await ledger.once(key)(run_async)()
        return result
    return ledger.once(key)(tool)()


@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_an_adapters_effects_are_owned_and_go_with_its_session(
    running: DaemonProcess, adapter: str
) -> None:
    calls: list[str] = []

    def refund() -> str:
        calls.append("refund")
        return "r-1"

    async def main() -> None:
        first = ADAPTERS[adapter](running.socket_path, "worker-a")
        second = ADAPTERS[adapter](running.socket_path, "worker-b")
        try:
            assert await _once(first.ledger, "refund/1", refund) == "r-1"
            assert await _once(first.ledger, "refund/1", refund) == "r-1"
            with pytest.raises(StaleOwner):  # b may not record an effect while a owns it
                await _once(second.ledger, "refund/2", refund)
            await second.take_over()
            assert await _once(second.ledger, "refund/1", refund) == "r-1"  # a's record
            with pytest.raises(StaleOwner):  # a was fenced: its tool is never called
                await _once(first.ledger, "refund/3", refund)
            assert calls == ["refund"]
            await second.remove()  # the session's history goes, its effects with it
            assert await _once(second.ledger, "refund/1", refund) == "r-1"
            assert calls == ["refund", "refund"]
        finally:
            await first.close()
            await second.close()

    asyncio.run(main())


def test_a_copied_thread_keeps_the_effects_its_runs_had(running: DaemonProcess) -> None:
    from langchain_core.runnables import RunnableConfig
    from langgraph.graph import END, START, StateGraph

    from sessionstore.langgraph import SessionStoreSaver

    saver = SessionStoreSaver(running.socket_path)
    refunds: list[str] = []

    class Order(TypedDict):
        refund: str

    def refund_node(state: Order, config: RunnableConfig) -> dict[str, Any]:
        thread = config["configurable"]["thread_id"]

        @saver.effects(thread).once("refund/1")
        def refund() -> str:
            refunds.append(thread)
            return "r-1"

        return {"refund": refund()}

    graph = StateGraph(Order)
    graph.add_node("refund", refund_node)
    graph.add_edge(START, "refund")
    graph.add_edge("refund", END)
    app = graph.compile(checkpointer=saver)
    app.invoke({"refund": ""}, {"configurable": {"thread_id": "a"}})
    saver.copy_thread("a", "b")
    fork = app.invoke({"refund": ""}, {"configurable": {"thread_id": "b"}})  # the copy runs on
    assert fork["refund"] == "r-1" and refunds == ["a"]
    app.invoke({"refund": ""}, {"configurable": {"thread_id": "c"}})  # a thread of its own
    assert refunds == ["a", "c"]
    saver.close()


def test_an_effect_expires_with_its_thread(running: DaemonProcess) -> None:
    """With a ttl the effects are the thread's documents, expiring with it: once its
    lifetime lapses (here the lifetime document is removed, as its expiry would), an
    effect it left is gone for the ledger, listed nowhere and run again."""
    from sessionstore.langgraph import SessionStoreSaver

    saver = SessionStoreSaver(running.socket_path, ttl={"default_ttl": 10})
    ledger = saver.effects("timed")
    calls: list[int] = []

    @ledger.once("charge/1")
    def charge() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("no answer")
        return "charged"

    with pytest.raises(TimeoutError):
        charge()
    assert [u.key for u in ledger.unresolved()] == ["charge/1"]
    with Client(running.socket_path) as client:
        (stored,) = client.checkpoint_scan("kv", "langgraph/e/timed/")["items"]
        assert "expires_at_ms" in stored  # it lives as long as the thread does
        client.txn([{"op": "delete", "kind": "kv", "key": "langgraph/l/timed"}])
    assert ledger.unresolved() == []
    assert charge() == "charged" and len(calls) == 2  # the expired intent did not stand
    assert [u.key for u in ledger.unresolved()] == []
    saver.close()


def test_an_adk_tool_under_the_sessions_ledger_runs_once_however_often_the_run_repeats(
    running: DaemonProcess,
) -> None:
    from google.adk.agents import LlmAgent
    from google.adk.runners import Runner
    from google.genai import types

    from sessionstore.adk import SessionStoreSessionService

    from .refunding_llm import RefundingLlm

    refunds: list[str] = []

    async def main() -> list[str]:
        service = SessionStoreSessionService(running.socket_path, owner="worker")
        ledger = service.effects(app_name="shop", user_id="u", session_id="s")

        @ledger.once(lambda order: f"refund/{order}")
        async def refund_order(order: str) -> str:
            """Refund an order."""
            refunds.append(order)
            return f"r-{order}"

        agent = LlmAgent(name="assistant", model=RefundingLlm(), tools=[refund_order])
        runner = Runner(app_name="shop", agent=agent, session_service=service)
        answers = []
        try:
            await service.create_session(app_name="shop", user_id="u", session_id="s")
            for _attempt in range(2):  # the run, then the same run again (a retried worker)
                message = types.Content(role="user", parts=[types.Part(text="refund 1001")])
                async for event in runner.run_async(user_id="u", session_id="s",
                                                    new_message=message):  # fmt: skip
                    if event.content and event.content.parts and event.content.parts[0].text:
                        answers.append(event.content.parts[0].text)
            return answers
        finally:
            await runner.close()
            await service.close()

    assert asyncio.run(main()) == ["done: {'result': 'r-1001'}"] * 2
    assert refunds == ["1001"]


def test_a_strands_tool_under_the_sessions_ledger_runs_once_however_often_the_run_repeats(
    running: DaemonProcess,
) -> None:
    from strands import Agent, tool
    from strands.models import Model

    from sessionstore.strands import SessionStoreSessionManager

    class RefundingModel(Model):
        """Asks for the refund of order 1001, then answers with what the tool said."""

        def update_config(self, **model_config: Any) -> None:
            pass

        def get_config(self) -> Any:
            return {}

        async def structured_output(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError
            yield  # pragma: no cover

        async def stream(self, messages: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            results = [b["toolResult"] for b in messages[-1]["content"] if "toolResult" in b]
            yield {"messageStart": {"role": "assistant"}}
            if results:
                said = results[0]["content"][0]["text"]
                yield {"contentBlockStart": {"start": {}}}
                yield {"contentBlockDelta": {"delta": {"text": f"done: {said}"}}}
                yield {"contentBlockStop": {}}
                yield {"messageStop": {"stopReason": "end_turn"}}
                return
            use = {"toolUseId": f"t{len(messages)}", "name": "refund_order"}
            yield {"contentBlockStart": {"start": {"toolUse": use}}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": '{"order": "1001"}'}}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}

    refunds: list[str] = []
    answers = []
    for _attempt in range(2):  # the run, then the same run again in a new process's objects
        manager = SessionStoreSessionManager("shop", running.socket_path, owner="worker")
        ledger = manager.effects()

        @tool
        @ledger.once(lambda order: f"refund/{order}")
        def refund_order(order: str) -> str:
            """Refund an order.

            Args:
                order: the order's number
            """
            refunds.append(order)
            return f"r-{order}"

        agent = Agent(model=RefundingModel(), tools=[refund_order], session_manager=manager,
                      callback_handler=None)  # fmt: skip
        answers.append(str(agent("refund 1001")).strip())
        manager.close()
    assert answers == ["done: r-1001"] * 2
    assert refunds == ["1001"]
