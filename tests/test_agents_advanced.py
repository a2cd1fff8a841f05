# AdvancedSessionStoreSession where the SDK's SQLite tests cannot reach: many
# processes on one session (branching at once, adding at once), a branch made
# whole or not at all through kill -9, and what pops, deletes and clears leave
# behind, read back through the public API. Both engines.
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from agents.result import RunResult
from agents.run_context import RunContextWrapper
from agents.testing import ScriptedModel
from agents.usage import Usage

from sessionstore.agents import AdvancedSessionStoreSession
from sessionstore.errors import ConnectionLost

from .conftest import DaemonProcess

COMMIT_POINTS = ("before-intent", "after-intent", "before-commit-record", "after-commit-record")


def _turns(count: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for n in range(1, count + 1):
        items += [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"}]
    return items


def _session(daemon: DaemonProcess, session_id: str = "shared") -> AdvancedSessionStoreSession:
    return AdvancedSessionStoreSession(session_id=session_id, socket_path=daemon.socket_path)


def _run_result(tokens: int) -> RunResult:
    from agents import Agent

    usage = Usage(requests=1, input_tokens=tokens, output_tokens=1, total_tokens=tokens + 1)
    return RunResult(
        input="x", new_items=[], raw_responses=[], final_output="x",
        input_guardrail_results=[], output_guardrail_results=[],
        tool_input_guardrail_results=[], tool_output_guardrail_results=[],
        context_wrapper=RunContextWrapper(context=None, usage=usage),
        _last_agent=Agent(name="a", model=ScriptedModel()), interruptions=[],
    )  # fmt: skip


CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from sessionstore.agents import AdvancedSessionStoreSession

    async def main():
        session = AdvancedSessionStoreSession(session_id="shared", socket_path=sys.argv[1])
        sys.stdin.readline()  # every child starts together
        made = await session.create_branch_from_turn(3)
        await session.add_items([{"role": "user", "content": f"own {made}"}])
        print(json.dumps(made))
        await session.close()

    asyncio.run(main())
    """
)


def test_processes_branching_at_once_each_get_a_branch_of_their_own(running: DaemonProcess) -> None:
    asyncio.run(_session(running).add_items(_turns(3)))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, running.socket_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    made = [child.communicate(timeout=120)[0].strip() for child in children]
    assert all(child.returncode == 0 for child in children)
    branches = [name.strip('"') for name in made]
    assert len(set(branches)) == 6  # none merged into another's
    main = _turns(3)

    async def check() -> None:
        session = _session(running)
        listed = {b["branch_id"]: b for b in await session.list_branches()}
        assert set(listed) == {"main", *branches}
        for branch in branches:
            items = await session.get_items(branch_id=branch)
            assert items == [*main[:4], {"role": "user", "content": f"own {branch}"}]
            assert listed[branch]["message_count"] == 5 and listed[branch]["user_turns"] == 3
        assert await session.get_items(branch_id="main") == main
        await session.close()

    asyncio.run(check())


def test_one_name_taken_at_once_by_many_goes_to_exactly_one(running: DaemonProcess) -> None:
    async def main() -> None:
        await _session(running).add_items(_turns(2))
        sessions = [_session(running) for _ in range(8)]
        outcomes = await asyncio.gather(
            *(s.create_branch_from_turn(2, "contested") for s in sessions), return_exceptions=True
        )
        won = [o for o in outcomes if o == "contested"]
        lost = [o for o in outcomes if isinstance(o, ValueError)]
        assert len(won) == 1 and len(lost) == 7
        assert all("already been used" in str(error) for error in lost)
        assert await sessions[0].get_items(branch_id="contested") == _turns(2)[:2]

    asyncio.run(main())


def test_writers_adding_at_once_lose_nothing_and_number_every_turn_once(
    running: DaemonProcess,
) -> None:
    async def main() -> None:
        sessions = [_session(running) for _ in range(8)]

        async def writer(number: int, session: AdvancedSessionStoreSession) -> None:
            for turn in range(5):
                await session.add_items(
                    [{"role": "user", "content": f"w{number}-{turn}"},
                     {"role": "assistant", "content": f"r{number}-{turn}"}]
                )  # fmt: skip

        await asyncio.gather(*(writer(n, s) for n, s in enumerate(sessions)))
        turns = await sessions[0].get_conversation_turns()
        assert [t["turn"] for t in turns] == list(range(1, 41))
        items = await sessions[0].get_items()
        assert len(items) == 80
        for n in range(8):  # each call's two items stay together, in order
            mine = [i["content"] for i in items if i["content"][1:].startswith(f"{n}-")]
            assert mine == [f"{p}{n}-{t}" for t in range(5) for p in "wr"]
        by_turn = await sessions[0].get_conversation_by_turns()
        assert all(len(entries) == 2 for entries in by_turn.values())

    asyncio.run(main())


def test_pops_deletes_and_clears_leave_nothing_of_what_they_removed(
    running: DaemonProcess,
) -> None:
    async def main() -> None:
        session = _session(running)
        await session.add_items(_turns(2))
        await session.store_run_usage(_run_result(10))  # turn 2's
        await session.pop_item()  # a2: turn 2 still has q2
        assert (await session.get_turn_usage(2))["input_tokens"] == 10
        await session.pop_item()  # q2: turn 2 is gone, and its usage with it
        assert await session.get_turn_usage(2) == {}
        assert [b["message_count"] for b in await session.list_branches()] == [2]
        await session.add_items([{"role": "user", "content": "again"}])
        assert [t["turn"] for t in await session.get_conversation_turns()] == [1, 2]
        assert await session.get_turn_usage(2) == {}  # the new turn 2 has none

        made = await session.create_branch_from_turn(2, "side")
        await session.add_items([{"role": "user", "content": "side"}])
        await session.store_run_usage(_run_result(7))
        await session.switch_to_branch("main")
        await session.delete_branch(made)
        assert await session.get_items(branch_id="side") == []
        assert await session.get_turn_usage(branch_id="side") == []
        assert [b["branch_id"] for b in await session.list_branches()] == ["main"]
        with pytest.raises(ValueError, match="does not exist"):
            await session.switch_to_branch("side")

        await session.clear_session()
        assert await session.get_items() == [] and await session.list_branches() == []
        assert await session.get_session_usage() is None
        await session.add_items(_turns(1))
        with pytest.raises(ValueError, match="already been used"):
            await session.create_branch_from_turn(1, "side")  # still reserved
        await session.close()

    asyncio.run(main())


@pytest.mark.parametrize("point", COMMIT_POINTS)
def test_a_branch_is_whole_or_absent_after_kill9(daemon: DaemonProcess, point: str) -> None:
    daemon.start(env={"SESSIONSTORED_FAILPOINTS": f"{point}=crash@2"})
    asyncio.run(_session(daemon).add_items(_turns(3)))  # the first write

    async def branch() -> None:
        with pytest.raises(ConnectionLost):
            await _session(daemon).create_branch_from_turn(3, "cut")

    asyncio.run(branch())
    assert daemon.wait_exit() == -9
    daemon.start()

    async def check() -> None:
        session = _session(daemon)
        names = [b["branch_id"] for b in await session.list_branches()]
        if COMMIT_POINTS.index(point) == len(COMMIT_POINTS) - 1:  # durable, unanswered
            assert names == ["main", "cut"]
            assert await session.get_items(branch_id="cut") == _turns(3)[:4]
        else:
            assert names == ["main"] and await session.get_items(branch_id="cut") == []
            assert await session.create_branch_from_turn(3, "cut") == "cut"  # free still
        assert await session.get_items(branch_id="main") == _turns(3)
        await session.close()

    asyncio.run(check())


@pytest.mark.parametrize(
    "name", ["b" * 10_000, "%" * 300, "a/b %2F é"], ids=["long", "percent", "mixed"]
)
def test_a_branch_name_comes_back_as_given_whatever_its_length_or_characters(
    running: DaemonProcess, name: str
) -> None:
    async def main() -> None:
        session = _session(running, "names")
        try:
            await session.add_items(_turns(2))  # type: ignore[arg-type]
            assert await session.create_branch_from_turn(2, name) == name
            await session.add_items([{"role": "user", "content": "on the branch"}])
            listed = [(b["branch_id"], b["is_current"]) for b in await session.list_branches()]
            assert listed == [("main", False), (name, True)]
            await session.switch_to_branch("main")
            await session.switch_to_branch(name)
            await session.delete_branch(name, force=True)
            assert [b["branch_id"] for b in await session.list_branches()] == ["main"]
            with pytest.raises(ValueError, match="already been used"):
                await session.create_branch_from_turn(1, name)
        finally:
            await session.close()

    asyncio.run(main())
