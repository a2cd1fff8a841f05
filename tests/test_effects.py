# sessionstore.effects: a tool runs once per key, ever; a resumed run gets the
# recorded result; an effect whose outcome was never recorded is reported, never
# repeated. Proved with a tool whose effect is visible (a line in a file), its
# process killed with SIGKILL at every point between the intent and the record,
# and with the daemon killed -9 in between; on both engines.
from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sessionstore.effects import AsyncLedger, Ledger, UnresolvedEffect
from sessionstore.errors import ConnectionLost

from .conftest import DaemonProcess

ROOT = Path(__file__).resolve().parent.parent


def test_a_tool_runs_once_per_key_and_a_later_run_gets_its_result(
    running: DaemonProcess,
) -> None:
    calls: list[str] = []
    ledger = Ledger("user-42", running.socket_path)

    @ledger.once(lambda order: f"refund/{order}")
    def refund(order: str) -> dict[str, Any]:
        calls.append(order)
        return {"refund": f"r-{order}", "amount": 12.5}

    assert refund("1") == {"refund": "r-1", "amount": 12.5}
    assert refund("2") == {"refund": "r-2", "amount": 12.5}
    resumed = Ledger("user-42", running.socket_path)  # a later process
    again = resumed.once(lambda order: f"refund/{order}")(refund.__wrapped__)  # type: ignore[attr-defined]
    assert again("1") == {"refund": "r-1", "amount": 12.5}
    assert calls == ["1", "2"]
    other = Ledger("user-43", running.socket_path)  # keys are per session
    assert other.once("refund/1")(lambda: "ran")() == "ran"
    for each in (ledger, resumed, other):
        each.close()


def test_a_block_records_its_effect_once(running: DaemonProcess) -> None:
    ledger = Ledger("blocks", running.socket_path)
    with ledger.once("email/42") as effect:
        assert not effect.done
        effect.record({"message_id": "m-1"})
    with ledger.once("email/42") as again:
        assert again.done and again.result == {"message_id": "m-1"}
    assert ledger.unresolved() == []
    ledger.close()


def test_a_tool_that_raises_leaves_its_effect_unresolved_until_settled(
    running: DaemonProcess,
) -> None:
    ledger = Ledger("failing", running.socket_path)
    attempts: list[int] = []

    @ledger.once("charge/7")
    def charge() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise TimeoutError("the payment service did not answer")
        return "charged"

    with pytest.raises(TimeoutError):
        charge()
    with pytest.raises(UnresolvedEffect, match="did not answer"):
        charge()  # never repeated on its own: it may have charged
    (pending,) = ledger.unresolved()
    assert pending.key == "charge/7" and "TimeoutError" in (pending.error or "")
    ledger.retry("charge/7")  # whoever knows the remote side says: try again
    assert charge() == "charged" and len(attempts) == 2
    assert charge() == "charged" and len(attempts) == 2
    with pytest.raises(TimeoutError):
        ledger.once("charge/8")(lambda: (_ for _ in ()).throw(TimeoutError("again")))()
    ledger.resolve("charge/8", "charged by hand")
    assert ledger.once("charge/8")(lambda: "not called")() == "charged by hand"
    assert ledger.unresolved() == []
    ledger.close()


def test_of_two_runs_racing_on_one_key_one_runs_the_tool(running: DaemonProcess) -> None:
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []
    outcomes: list[Any] = []

    def slow() -> str:
        calls.append(1)
        entered.set()
        release.wait(30)
        return "once"

    def run() -> None:
        ledger = Ledger("race", running.socket_path)
        try:
            outcomes.append(ledger.once("k")(slow)())
        except UnresolvedEffect as error:
            outcomes.append(error)
        finally:
            ledger.close()

    first = threading.Thread(target=run)
    first.start()
    assert entered.wait(30)
    run()  # the second run finds the first one's intent: refused, not repeated
    release.set()
    first.join()
    assert len(calls) == 1
    assert isinstance(outcomes[0], UnresolvedEffect) and outcomes[1] == "once"
    ledger = Ledger("race", running.socket_path)
    assert ledger.once("k")(slow)() == "once" and len(calls) == 1
    ledger.close()


def test_an_async_tool_runs_once_per_key(running: DaemonProcess) -> None:
    calls: list[str] = []

    async def main() -> list[Any]:
        ledger = AsyncLedger("async", running.socket_path)

        @ledger.once(lambda order: f"ship/{order}")
        async def ship(order: str) -> str:
            calls.append(order)
            return f"shipped {order}"

        try:
            results = [await ship("1"), await ship("1")]
            async with ledger.once("note") as effect:
                effect.record("noted")
            async with ledger.once("note") as again:
                results.append(again.result)
            return results
        finally:
            await ledger.aclose()

    assert asyncio.run(main()) == ["shipped 1", "shipped 1", "noted"]
    assert calls == ["1"]


def _child(child: Child, running: DaemonProcess, scope: str, path: Path, kill_at: str
           ) -> tuple[int, str]:  # fmt: skip
    """The child run to its end or to its kill: exit code, and what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", f"tests.{child.module}", running.socket_path, scope, str(path),
         kill_at, *child.arguments],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert not done.returncode or done.returncode == -signal.SIGKILL, done.stderr
    return done.returncode, done.stdout.strip()


def _unresolved_of_s(socket_path: str, _scope: str) -> list[str]:
    ledger = Ledger("s", socket_path)
    try:
        return [u.key for u in ledger.unresolved()]
    finally:
        ledger.close()


def _unresolved_of_thread(socket_path: str, thread: str) -> list[str]:
    from sessionstore.langgraph import SessionStoreSaver

    saver = SessionStoreSaver(socket_path)
    try:
        return [u.key for u in saver.effects(thread).unresolved()]
    finally:
        saver.close()


def _unresolved_of_agents_session(socket_path: str, session_id: str) -> list[str]:
    from sessionstore.agents import SessionStoreSession

    async def unresolved() -> list[str]:
        session = SessionStoreSession(session_id, socket_path)
        try:
            return [u.key for u in await session.effects().unresolved()]
        finally:
            await session.close()

    return asyncio.run(unresolved())


def _unresolved_of_adk_session(socket_path: str, session_id: str) -> list[str]:
    from sessionstore.adk import SessionStoreSessionService

    async def unresolved() -> list[str]:
        service = SessionStoreSessionService(socket_path)
        try:
            ledger = service.effects(app_name="shop", user_id="u", session_id=session_id)
            return [u.key for u in await ledger.unresolved()]
        finally:
            await service.close()

    return asyncio.run(unresolved())


@dataclass(frozen=True)
class Child:
    """A child run (the module of tests/ named by module, given the scope to keep its
    effect in, its file and kill_at, and its arguments after those): the result its
    resumed run prints once the effect is recorded, the unresolved effects of a scope,
    and the key of the effect that a kill before the record leaves there (None: the key
    is the scope)."""

    module: str
    arguments: tuple[str, ...]
    done_result: str
    unresolved: Callable[[str, str], list[str]]
    key: str | None = None


CHILDREN = {
    "a tool": Child("effects_child", (), "r-1", _unresolved_of_s),
    "a langgraph node's tool": Child(
        "effects_graph_child", (), "r-1001", _unresolved_of_thread, "refund/1001"
    ),
    "an agents sdk function tool": Child(
        "effects_agent_child", ("agents",), "r-1001", _unresolved_of_agents_session, "refund/1001"
    ),
    "an adk tool": Child(
        "effects_agent_child", ("adk",), "r-1001", _unresolved_of_adk_session, "refund/1001"
    ),
}


@pytest.mark.parametrize("kill_at", ["before-effect", "after-effect", "after-done"])
@pytest.mark.parametrize("child", list(CHILDREN))
def test_a_run_killed_anywhere_never_repeats_the_effect(
    running: DaemonProcess, tmp_path: Path, child: str, kill_at: str
) -> None:
    """The run killed with SIGKILL between the intent and the record, or after the record
    before its framework was told (for the graph, before the node's checkpoint), then
    resumed: for the graph from its last checkpoint, which runs the node again; for an
    agent, the same turn again."""
    run = CHILDREN[child]
    lines = tmp_path / "refunds.txt"
    lines.touch()
    code, _ = _child(run, running, kill_at, lines, kill_at)
    assert code == -signal.SIGKILL
    written = lines.read_text().count("refunded")
    code, said = _child(run, running, kill_at, lines, "never")  # resumed
    assert code == 0
    assert lines.read_text().count("refunded") == written <= 1  # never repeated
    if kill_at == "after-done":  # recorded: the resumed run gets the result
        assert said == run.done_result
    else:  # intended, outcome unknown: reported, for someone to settle
        assert said == "unresolved"
        assert run.unresolved(running.socket_path, kill_at) == [run.key or kill_at]


def test_a_daemon_killed_between_the_intent_and_the_record_repeats_nothing(
    running: DaemonProcess, tmp_path: Path
) -> None:
    lines = tmp_path / "refunds.txt"
    ledger = Ledger("s", running.socket_path)

    @ledger.once("refund/9")
    def refund() -> str:
        lines.write_text("refunded\n")
        running.kill9()  # the record cannot be written
        return "r-9"

    with pytest.raises(ConnectionLost):
        refund()
    ledger.close()
    running.start()
    resumed = Ledger("s", running.socket_path)
    with pytest.raises(UnresolvedEffect):
        resumed.once("refund/9")(lambda: lines.write_text("refunded\nrefunded\n"))()
    assert lines.read_text() == "refunded\n"
    assert [u.key for u in resumed.unresolved()] == ["refund/9"]
    resumed.close()


def test_a_function_tool_of_a_resumed_agents_run_is_not_called_again(
    running: DaemonProcess,
) -> None:
    """The Agents SDK's function tool under its session's ledger: the run is repeated from
    the start (as a resumed run is), the model asks for the same refund, and the refund
    happens once; the second run gets the first one's result."""
    import os

    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from agents import Agent, Runner, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from sessionstore.agents import SessionStoreSession

    refunds: list[str] = []

    async def main() -> list[str]:
        tools_session = SessionStoreSession("agent-run", running.socket_path)
        ledger = tools_session.effects()

        @function_tool
        @ledger.once(lambda order: f"refund/{order}")
        async def refund(order: str) -> str:
            """Refund an order."""
            refunds.append(order)
            return f"refund r-{order}"

        outputs = []
        try:
            for attempt in range(2):  # the first run, then the same run resumed
                model = ScriptedModel([
                    [function_call("refund", {"order": "1001"}, call_id=f"c{attempt}")],
                    [assistant_message("done")],
                ])  # fmt: skip
                agent = Agent(name="assistant", model=model, tools=[refund])
                session = SessionStoreSession("agent-run", running.socket_path)
                result = await Runner.run(agent, "refund order 1001", session=session)
                await session.close()
                outputs += [
                    item.output for item in result.new_items if item.type == "tool_call_output_item"
                ]
            return outputs
        finally:
            await tools_session.close()

    assert asyncio.run(main()) == ["refund r-1001", "refund r-1001"]
    assert refunds == ["1001"]  # the second run got the recorded result instead
