# OpenAI Agents SDK work on SessionStoreSession in a child process, for
# test_agents_session.py: `python -m tests.agents_child SOCKET SESSION MODE [TAG]`.
# MODE "turn1"/"turn2": one Runner.run turn with the SDK's offline ScriptedModel
# (turn2 prints what the model was given); "add": four concurrent callers
# append 25 numbered items each, in calls of one to three items.
from __future__ import annotations

import asyncio
import json
import os
import sys

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from agents import Agent, Runner
from agents.testing import ScriptedModel, assistant_message

from sessionstore.agents import SessionStoreSession

ITEMS_PER_CALLER = 25
CALLERS = 4


async def turn(session: SessionStoreSession, question: str, answer: str) -> ScriptedModel:
    model = ScriptedModel([[assistant_message(answer)]])
    agent = Agent(name="assistant", instructions="Answer briefly.", model=model)
    result = await Runner.run(agent, question, session=session)
    assert result.final_output == answer, result.final_output
    return model


async def add(session: SessionStoreSession, tag: str) -> None:
    async def caller(number: int) -> None:
        done = 0
        while done < ITEMS_PER_CALLER:
            size = min(1 + (done + number) % 3, ITEMS_PER_CALLER - done)
            batch = [{"role": "user", "content": f"{tag}.{number}.{done + i}"} for i in range(size)]
            await session.add_items(batch)  # type: ignore[arg-type]
            done += size

    await asyncio.gather(*(caller(number) for number in range(CALLERS)))


async def main() -> None:
    socket_path, session_id, mode = sys.argv[1:4]
    session = SessionStoreSession(session_id, socket_path)
    if mode == "turn1":
        await turn(session, "My name is Ada.", "Hello, Ada.")
    elif mode == "turn2":
        model = await turn(session, "What is my name?", "Your name is Ada.")
        print(json.dumps(model.calls[0].input, default=str))
    else:
        await add(session, sys.argv[4])
    await session.close()


if __name__ == "__main__":
    asyncio.run(main())
