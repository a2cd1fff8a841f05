# An agent run (the OpenAI Agents SDK's Runner, or ADK's) whose model asks for a
# refund, and whose tool has a visible effect (it appends a line to a file),
# under the session's effects ledger, killing itself with SIGKILL at the point
# it is told:
#   python -m tests.effects_agent_child SOCKET SESSION FILE KILL_AT FRAMEWORK
# KILL_AT: before-effect, after-effect, after-done (the tool's result recorded,
# the framework not yet told), or never; FRAMEWORK: agents or adk. Without a
# kill it runs the turn (again, when an earlier run was killed) and prints the
# tool's result, or "unresolved" when the tool found its effect left intended.
from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from sessionstore.effects import AsyncLedger, UnresolvedEffect

from .effects_child import die_at, refund_line

KEY = "refund/1001"


def killable_tool(
    ledger: AsyncLedger, path: str, kill_at: str
) -> Callable[[str], Coroutine[Any, Any, str]]:
    """refund_order(order), once per key, the process killed after its record at
    after-done."""

    @ledger.once(lambda order: f"refund/{order}")
    async def refund(order: str) -> str:
        return refund_line(path, kill_at, order)

    async def refund_order(order: str) -> str:
        """Refund an order."""
        result = await refund(order)
        die_at(kill_at, "after-done")
        return result

    return refund_order


async def run_agents(socket_path: str, session_id: str, path: str, kill_at: str) -> str:
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    from agents import Agent, Runner, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from sessionstore.agents import SessionStoreSession

    session = SessionStoreSession(session_id, socket_path, owner="worker")
    tool = function_tool(killable_tool(session.effects(), path, kill_at),
                         failure_error_function=None)  # fmt: skip
    model = ScriptedModel([
        [function_call("refund_order", {"order": "1001"}, call_id=f"call-{os.getpid()}")],
        [assistant_message("done")],
    ])  # fmt: skip
    try:
        result = await Runner.run(Agent(name="assistant", model=model, tools=[tool]),
                                  "refund order 1001", session=session)  # fmt: skip
        (output,) = [i.output for i in result.new_items if i.type == "tool_call_output_item"]
        return str(output)
    finally:
        await session.close()


async def run_adk(socket_path: str, session_id: str, path: str, kill_at: str) -> str:
    from google.adk.agents import LlmAgent
    from google.adk.runners import Runner
    from google.genai import types

    from sessionstore.adk import SessionStoreSessionService

    from .refunding_llm import RefundingLlm

    service = SessionStoreSessionService(socket_path, owner="worker")
    ledger = service.effects(app_name="shop", user_id="u", session_id=session_id)
    tool = killable_tool(ledger, path, kill_at)
    runner = Runner(app_name="shop", agent=LlmAgent(name="assistant", model=RefundingLlm(),
                    tools=[tool]), session_service=service)  # fmt: skip
    try:
        if await service.get_session(app_name="shop", user_id="u", session_id=session_id) is None:
            await service.create_session(app_name="shop", user_id="u", session_id=session_id)
        message = types.Content(role="user", parts=[types.Part(text="refund order 1001")])
        outputs = []
        async for event in runner.run_async(user_id="u", session_id=session_id,
                                            new_message=message):  # fmt: skip
            outputs += [r.response for r in event.get_function_responses()]
        (output,) = outputs
        return str((output or {})["result"])
    finally:
        await runner.close()
        await service.close()


def main() -> None:
    socket_path, session_id, path, kill_at, framework = sys.argv[1:6]
    run = {"agents": run_agents, "adk": run_adk}[framework]
    try:
        result = asyncio.run(run(socket_path, session_id, path, kill_at))
    except Exception as error:
        cause: BaseException | None = error
        while cause is not None and not isinstance(cause, UnresolvedEffect):
            cause = cause.__cause__  # the Agents SDK raises it as a UserError's cause
        if cause is None:
            raise
        print("unresolved", flush=True)
        return
    print(result, flush=True)


if __name__ == "__main__":
    main()
