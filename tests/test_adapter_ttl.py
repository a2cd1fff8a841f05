# Expiry through the frameworks' own packages, on both engines: a LangGraph
# thread run by a real StateGraph on SessionStoreSaver(ttl=...), and an Agents
# session run by the SDK's Runner on SessionStoreSession(ttl=...), each gone
# whole ttl after its last write (or read, with refresh_on_read), never half:
# while the thread's lifetime lives every document of it does, reads racing
# the expiry see a checkpoint with all of its writes or nothing, and the
# daemon's sweep then removes every document, which watchers see.
from __future__ import annotations

import asyncio
import math
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from agents import Agent, Runner
from agents.testing import ScriptedModel, assistant_message
from langgraph.checkpoint.base import empty_checkpoint

from sessionstore.adapters import langgraph_saver_core, lifetime
from sessionstore.agents import SessionStoreSession
from sessionstore.client import Client
from sessionstore.langgraph import SessionStoreSaver

from . import graph_child
from .conftest import DaemonProcess, restored_client, take_backup
from .waiting import until
from .wall_clock import advance_past, daemon_now_ms

TTL_MINUTES = 0.02  # 1.2 s
STEP_MS = 300  # the time that passes between two writes (or reads) of a lifetime's tests
PREFIX = "langgraph/"


@pytest.fixture
def clocks(running: DaemonProcess, monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """Time passing, for the daemon's expiry clock and the adapters' own (lifetime.py's
    now_ms) together: moves both forward by so many ms."""
    ahead = [0]
    system = lifetime.now_ms
    for module in (lifetime, langgraph_saver_core):
        monkeypatch.setattr(module, "now_ms", lambda: system() + ahead[0])

    def advance(by_ms: int) -> None:
        with running.client() as client:
            client.call("advance_clock", by_ms=by_ms)
        ahead[0] += by_ms

    return advance


def _config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def _scan(client: Client, prefix: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after = None
    while True:
        page = client.checkpoint_scan("kv", prefix, after=after, limit=1000)
        items += page["items"]
        after = page["next"]
        if after is None:
            return items


def _documents(client: Client, thread: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The thread's lifetime document (with its expiry) and every other document of it,
    as the daemon holds them."""
    life_key = f"{PREFIX}l/{thread}"
    life = [i for i in _scan(client, life_key) if i["key"] == life_key]
    members = []
    for part in ("c", "w", "t"):
        members += _scan(client, f"{PREFIX}{part}/{thread}/")
    for run in _scan(client, f"{PREFIX}t/{thread}/"):
        run_id = run["key"].rsplit("/", 1)[1]
        members += _scan(client, f"{PREFIX}r/{run_id}/{thread}/")
    return (life[0] if life else None), members


def _assert_whole(client: Client, thread: str) -> dict[str, Any]:
    """While the lifetime lives, every document of the thread outlives it."""
    life, members = _documents(client, thread)
    assert life is not None and members
    assert all(m["expires_at_ms"] >= life["value"]["horizon"] for m in members)
    assert life["expires_at_ms"] < life["value"]["horizon"]
    return life


def test_a_thread_lives_while_it_is_written_and_goes_whole_after(
    running: DaemonProcess, clocks: Callable[[int], None]
) -> None:
    saver = SessionStoreSaver(running.socket_path, ttl={"default_ttl": TTL_MINUTES})
    plain = SessionStoreSaver(running.socket_path)  # no ttl: its threads stay, and it
    graph = graph_child.build(saver)  # sees expiring threads expire too
    graph_child.build(plain).invoke({"steps": []}, _config("kept"))
    graph.invoke({"steps": []}, _config("t"))
    first = saver.get_tuple(_config("t"))
    assert first is not None and first.pending_writes is not None
    with running.client() as client:
        start_seq = client.stats()["seq"]
        life = _assert_whole(client, "t")
        first_horizon = life["value"]["horizon"]
        # written again and again past the first horizon's renewal point: the oldest
        # checkpoint stays, with its writes, and the thread stays whole throughout
        while _documents(client, "t")[0]["value"]["horizon"] == first_horizon:  # type: ignore[index]
            clocks(STEP_MS)
            graph.invoke({"steps": []}, _config("t"))
            _assert_whole(client, "t")
        again = saver.get_tuple(first.config)
        assert again is not None and again.pending_writes == first.pending_writes
        life = _assert_whole(client, "t")
        advance_past(client, life["expires_at_ms"])
        # gone for every read at once, though the daemon still holds the documents
        assert saver.get_tuple(_config("t")) is None
        assert saver.get_tuple(first.config) is None
        assert list(saver.list(_config("t"))) == []
        assert plain.get_tuple(first.config) is None
        assert {c.config["configurable"]["thread_id"] for c in saver.list(None)} == {"kept"}
        assert graph.get_state(_config("t")).values == {}
        life, members = _documents(client, "t")
        assert life is None and members
        # the sweep removes every document of it, as watchers see
        advance_past(client, max(m["expires_at_ms"] for m in members))
        keys = {m["key"] for m in members} | {f"{PREFIX}l/t"}
        expired = set()
        for event in client.watch(since=start_seq):
            if event.get("expired"):
                expired.add(event["key"])
                if {m["key"] for m in members} <= expired:
                    break
        assert expired <= keys
        assert _documents(client, "t") == (None, [])
    assert plain.get_tuple(_config("kept")) is not None  # a thread without a ttl stays


def test_a_write_after_expiry_starts_the_thread_afresh(running: DaemonProcess) -> None:
    saver = SessionStoreSaver(running.socket_path, ttl={"default_ttl": TTL_MINUTES})
    graph = graph_child.build(saver)
    graph.invoke({"steps": []}, _config("again"))
    old = saver.get_tuple(_config("again"))
    assert old is not None
    with running.client() as client:
        advance_past(client, _documents(client, "again")[0]["expires_at_ms"])  # type: ignore[index]
        graph.invoke({"steps": []}, _config("again"))
        assert saver.get_tuple(old.config) is None  # what expired stays gone
        head = saver.get_tuple(_config("again"))
        steps = head.checkpoint["channel_values"]["steps"] if head else None
        assert steps == ["a", "b", "c", "d1", "d2", "e"]  # the new run saw no old state
        ids = {c.checkpoint["id"] for c in saver.list(_config("again"))}
        assert old.checkpoint["id"] not in ids
        _assert_whole(client, "again")  # the old documents were removed, not adopted


def test_a_write_without_a_ttl_after_expiry_is_read_at_once(running: DaemonProcess) -> None:
    """What a saver without a ttl writes on a thread whose lifetime expired is read at
    once, by either saver, before the sweep: reads show what the sweep will leave,
    the new documents and none of the expired ones."""
    saver = SessionStoreSaver(running.socket_path, ttl={"default_ttl": TTL_MINUTES})
    plain = SessionStoreSaver(running.socket_path)
    graph_child.build(saver).invoke({"steps": []}, _config("late"))
    expired = list(saver.list(_config("late")))
    with_writes = next(c for c in expired if c.pending_writes)
    with running.client() as client:
        advance_past(client, _documents(client, "late")[0]["expires_at_ms"])  # type: ignore[index]
        graph_child.build(plain).invoke({"steps": []}, _config("late"))
        # a checkpoint put again at the id of an expired one with writes: without them
        again = plain.put(
            {"configurable": {**with_writes.config["configurable"], "checkpoint_id": None}},
            with_writes.checkpoint,
            with_writes.metadata,
            {},
        )
        # the oldest checkpoint of a subgraph's namespace put again: the newest there
        # once the newer expired ones are left out
        oldest = [c for c in expired if c.config["configurable"]["checkpoint_ns"]][-1]
        namespace = oldest.config["configurable"]["checkpoint_ns"]
        plain.put(
            {"configurable": {"thread_id": "late", "checkpoint_ns": namespace}},
            oldest.checkpoint,
            oldest.metadata,
            {},
        )
        for reader in (plain, saver):
            in_namespace = {"configurable": {"thread_id": "late", "checkpoint_ns": namespace}}
            newest = reader.get_tuple(in_namespace)
            assert newest is not None and newest.checkpoint["id"] == oldest.checkpoint["id"]
            head = reader.get_tuple(_config("late"))
            assert head is not None
            assert head.checkpoint["channel_values"]["steps"] == ["a", "b", "c", "d1", "d2", "e"]
            put_again = reader.get_tuple(again)
            assert put_again is not None and put_again.pending_writes == []
            listed = {c.checkpoint["id"]: c.pending_writes for c in reader.list(_config("late"))}
            assert head.checkpoint["id"] in listed and listed[with_writes.checkpoint["id"]] == []
            put_again_ids = {with_writes.checkpoint["id"], oldest.checkpoint["id"]}
            assert not set(listed) & {c.checkpoint["id"] for c in expired} - put_again_ids
        life, members = _documents(client, "late")
        assert life is None and any("expires_at_ms" in m for m in members)  # not swept yet
        # a saver with a ttl that writes on it removes the leftovers and adopts the rest
        saver.put(
            {"configurable": {"thread_id": "late", "checkpoint_ns": "other"}},
            empty_checkpoint(),
            {},
            {},
        )
        for reader in (plain, saver):
            assert reader.get_tuple(_config("late")) == head
            assert reader.get_tuple(again) == put_again
        _assert_whole(client, "late")
        assert not {m["key"] for m in members if "expires_at_ms" in m} & {
            m["key"] for m in _documents(client, "late")[1]
        }


def test_refresh_on_read_keeps_a_read_thread_and_only_then(
    running: DaemonProcess, clocks: Callable[[int], None]
) -> None:
    ttl = {"default_ttl": TTL_MINUTES, "refresh_on_read": True}
    reader = SessionStoreSaver(running.socket_path, ttl=ttl)
    writer = SessionStoreSaver(running.socket_path, ttl={"default_ttl": TTL_MINUTES})
    graph = graph_child.build(writer)
    for thread in ("read", "unread"):
        graph.invoke({"steps": []}, _config(thread))
    with running.client() as client:
        unread = _documents(client, "unread")[0]
        assert unread is not None
        first_horizon = _documents(client, "read")[0]["value"]["horizon"]  # type: ignore[index]
        # read past the horizon's renewal point: each read renews the lifetime, and
        # the renewal extends every document
        while _documents(client, "read")[0]["value"]["horizon"] == first_horizon:  # type: ignore[index]
            clocks(STEP_MS)
            assert reader.get_tuple(_config("read")) is not None
            assert len(list(reader.list(_config("read")))) > 1
            _assert_whole(client, "read")
        assert daemon_now_ms(client) > unread["expires_at_ms"]
        assert writer.get_tuple(_config("unread")) is None
        assert writer.get_tuple(_config("read")) is not None  # without refresh: a plain read
        life = _assert_whole(client, "read")
        assert writer.get_tuple(_config("read")) is not None
        assert _documents(client, "read")[0]["seq"] == life["seq"]  # type: ignore[index]


def test_reads_racing_the_expiry_see_a_checkpoint_with_all_its_writes_or_nothing(
    running: DaemonProcess,
) -> None:
    saver = SessionStoreSaver(running.socket_path, ttl={"default_ttl": 0.01})
    graph = graph_child.build(saver)
    graph.invoke({"steps": []}, _config("race"))
    history = list(saver.list(_config("race")))
    expected = {c.checkpoint["id"]: c.pending_writes for c in history}
    assert len(expected) > 3 and any(expected.values())
    seen: dict[int, str] = {}
    wrong: list[Any] = []
    stop = threading.Event()

    def read() -> None:
        reader = SessionStoreSaver(running.socket_path)
        me = threading.get_ident()
        seen[me] = ""
        while not stop.is_set():
            for checkpoint in reader.list(_config("race")):
                if checkpoint.pending_writes != expected[checkpoint.checkpoint["id"]]:
                    wrong.append(checkpoint)
            found = [reader.get_tuple(c.config) for c in history]
            seen[me] += "".join("x" if f is None else "o" for f in found)
            wrong.extend(f for f in found if f and f.pending_writes != expected[f.checkpoint["id"]])

    readers = [threading.Thread(target=read) for _ in range(3)]
    for thread in readers:
        thread.start()
    with running.client() as client:
        life, members = _documents(client, "race")
        assert life is not None
        since = client.stats()["seq"]
        until(lambda: len(seen) == len(readers) and all("o" in r for r in seen.values()),
              "every reader finding the thread")  # fmt: skip
        advance_past(client, life["expires_at_ms"])  # the thread goes; its documents stay
        until(lambda: all(r.endswith("x") for r in seen.values()), "every reader finding none")
        stop.set()
        for thread in readers:
            thread.join()
        advance_past(client, max(m["expires_at_ms"] for m in members))  # then the sweep
        unswept = {m["key"] for m in members}
        for event in client.watch(since=since):
            if event.get("expired"):
                unswept.discard(event["key"])
            if not unswept:
                break
    assert not wrong
    # each reader found every checkpoint until the thread went, then none, never one again
    for reads in seen.values():
        assert re.fullmatch(r"o+x+", reads), reads


def test_a_thread_with_a_ttl_survives_kill_9_compaction_and_a_restore_whole(
    running: DaemonProcess, tmp_path: Path
) -> None:
    """Its lifetime and every document keep their expiry (that they then expire, as
    any expiring document does after these, test_expiry.py shows)."""
    saver = SessionStoreSaver(running.socket_path, ttl={"default_ttl": 10})
    graph_child.build(saver).invoke({"steps": []}, _config("durable"))
    head = saver.get_tuple(_config("durable"))
    assert head is not None
    with running.client() as client:
        before = _documents(client, "durable")
    saver.close()
    running.kill9()
    running.start()
    with running.client() as client:
        client.compact()
        assert saver.get_tuple(_config("durable")) == head
        assert _documents(client, "durable") == before
        _assert_whole(client, "durable")
    backup = take_backup(running, tmp_path / "store.bak")
    with restored_client(backup) as restored:
        elsewhere = SessionStoreSaver(restored.socket_path, ttl={"default_ttl": 10})
        assert elsewhere.get_tuple(_config("durable")) == head
        life, members = _documents(restored, "durable")
        assert life is not None and before[0] is not None
        assert life["expires_at_ms"] == before[0]["expires_at_ms"]
        assert life["value"] == before[0]["value"]
        assert sorted((m["key"], m["expires_at_ms"]) for m in members) == sorted(
            (m["key"], m["expires_at_ms"]) for m in before[1]
        )


@pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, "5", True, 1e12])
def test_a_hostile_ttl_is_refused_when_the_adapter_is_made(
    running: DaemonProcess, ttl: Any
) -> None:
    with pytest.raises(ValueError, match="ttl"):
        SessionStoreSaver(running.socket_path, ttl={"default_ttl": ttl})
    with pytest.raises(ValueError, match="ttl"):
        SessionStoreSession("s", running.socket_path, ttl=ttl)
    with pytest.raises(ValueError, match="default_ttll"):
        SessionStoreSaver(running.socket_path, ttl={"default_ttll": 5})


def test_an_agents_session_goes_whole_ttl_after_its_last_write(
    running: DaemonProcess, clocks: Callable[[int], None]
) -> None:
    async def turn(session: SessionStoreSession, number: int) -> None:
        model = ScriptedModel([[assistant_message(f"answer {number}")]])
        agent = Agent(name="assistant", instructions="Answer.", model=model)
        result = await Runner.run(agent, f"question {number}", session=session)
        assert result.final_output == f"answer {number}"

    async def main() -> None:
        session = SessionStoreSession("chat", running.socket_path, ttl=1)
        kept = SessionStoreSession("kept", running.socket_path)
        plain = SessionStoreSession("chat", running.socket_path)  # no ttl of its own
        try:
            await kept.add_items([{"role": "user", "content": "stays"}])  # type: ignore[list-item]
            await turn(session, 0)
            number = 1
            while number * STEP_MS < 2500:  # past the first horizon's renewal
                clocks(STEP_MS)
                await turn(session, number)
                number += 1
            items = await session.get_items()
            assert len(items) == 2 * number  # every turn's question and answer
            assert await plain.get_items() == items
            with Client(running.socket_path) as client:
                life = _scan(client, "agents/chat")[0]
                assert life["key"] == "agents/chat"
                members = _scan(client, "agents/chat/")
                assert len(members) == len(items)
                assert all(m["expires_at_ms"] >= life["value"]["horizon"] for m in members)
            with Client(running.socket_path) as client:
                advance_past(client, life["expires_at_ms"])
            assert await session.get_items() == []
            assert await plain.get_items() == []
            assert await session.pop_item() is None
            await turn(session, 100)  # afresh: the expired items are not adopted
            assert [i["content"] for i in await session.get_items() if i.get("role") == "user"] == [
                "question 100"
            ]
            await session.clear_session()
            assert await session.get_items() == []
            assert await kept.get_items() == [{"role": "user", "content": "stays"}]
        finally:
            for each in (session, kept, plain):
                await each.close()

    asyncio.run(main())


def test_an_agents_session_written_without_a_ttl_after_expiry_is_read_at_once(
    running: DaemonProcess,
) -> None:
    """As a LangGraph thread's: what a session without a ttl adds once the session's
    lifetime expired is read at once (get_items and pop_item agree), the expired items
    stay gone, and a session with a ttl that writes next adopts what was added since."""
    old = [{"role": "user", "content": f"old {n}"} for n in range(3)]
    new = [{"role": "user", "content": f"new {n}"} for n in range(3)]

    async def main() -> None:
        session = SessionStoreSession("late", running.socket_path, ttl=1)
        plain = SessionStoreSession("late", running.socket_path)
        try:
            await session.add_items(old)  # type: ignore[arg-type]
            with Client(running.socket_path) as client:
                (life,) = [i for i in _scan(client, "agents/late") if i["key"] == "agents/late"]
                advance_past(client, life["expires_at_ms"])
            await plain.add_items(new[:2])  # type: ignore[arg-type]
            for reader in (plain, session):
                assert await reader.get_items() == new[:2]
                assert await reader.get_items(limit=1) == new[1:2]
                assert await reader.get_items(limit=3) == new[:2]
            assert await plain.pop_item() == new[1]
            await session.add_items(new[2:])  # type: ignore[arg-type]
            for reader in (plain, session):
                assert await reader.get_items() == [new[0], new[2]]
            with Client(running.socket_path) as client:
                items = _scan(client, "agents/late/")
            assert len(items) == 2 and all("expires_at_ms" in i for i in items)  # adopted
        finally:
            for each in (session, plain):
                await each.close()

    asyncio.run(main())


def test_an_agents_session_with_a_ttl_reads_a_limit_of_more_than_one_page(
    running: DaemonProcess,
) -> None:
    items = [{"role": "user", "content": str(n)} for n in range(1005)]  # a page is 1,000

    async def main() -> None:
        session = SessionStoreSession("long", running.socket_path, ttl=60)
        try:
            await session.add_items(items)  # type: ignore[arg-type]
            assert await session.get_items(limit=1003) == items[2:]
        finally:
            await session.close()

    asyncio.run(main())
