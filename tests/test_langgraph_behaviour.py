# What LangGraph's own checkpointer tests expect of any saver, as SqliteSaver and
# PostgresSaver do it, through LangGraph's packages on both backends:
# parent walks that end on a cycle, sequences of ids that refuse a lone string,
# prune that refuses DeltaChannel threads, keeps the head's writes whenever they
# came and makes the head a root, and puts on a never-stored parent taken while
# those on a deleted one are refused.
from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph

from sessionstore import StaleOwner
from sessionstore.langgraph import DeletedCheckpoint, SessionStoreSaver

from .conftest import DaemonProcess


def _config(thread: str, checkpoint_id: str | None = None) -> Any:
    configurable = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def _put(saver: SessionStoreSaver, thread: str, checkpoint_id: str, parent: str | None) -> Any:
    checkpoint = {**empty_checkpoint(), "id": checkpoint_id}
    return saver.put(_config(thread, parent), checkpoint, {"step": 1}, {})  # type: ignore[arg-type,typeddict-item]


def _ids(count: int) -> list[str]:
    return [str(uuid6()) for _ in range(count)]


def test_a_parent_chain_that_comes_back_on_itself_ends(running: DaemonProcess) -> None:
    saver = SessionStoreSaver(running.socket_path)
    a, b = _ids(2)
    _put(saver, "cycle", a, None)
    _put(saver, "cycle", b, a)
    _put(saver, "cycle", a, b)  # a again, now with b as its parent
    history = saver.get_delta_channel_history(config=_config("cycle", b), channels=["x"])
    assert history == {"x": {"writes": []}}
    again = asyncio.run(
        saver.aget_delta_channel_history(config=_config("cycle", b), channels=["x"])
    )
    assert again == history


def test_a_lone_string_is_refused_where_a_sequence_of_ids_is_wanted(
    running: DaemonProcess,
) -> None:
    saver = SessionStoreSaver(running.socket_path)
    for thread in ("a", "b"):
        _put(saver, thread, *_ids(1), None)
    with pytest.raises(TypeError) as postgres_saver:
        PostgresSaver(None).prune("ab")  # type: ignore[arg-type]  # refused before any query
    words = str(postgres_saver.value)
    assert words == "thread_ids must be a sequence of thread IDs, not a str"
    with pytest.raises(TypeError) as refused:
        saver.prune("ab")  # type: ignore[arg-type]
    assert str(refused.value) == words
    with pytest.raises(
        TypeError, match=r"^thread_ids must be a sequence of thread IDs, not a str$"
    ):
        saver.prune("ab", strategy="delete")  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"^thread_ids must be a sequence of thread IDs, not a str$"
    ):
        asyncio.run(saver.aprune("ab"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^run_ids must be a sequence of run IDs, not a str$"):
        saver.delete_for_runs("ab")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^run_ids must be a sequence of run IDs, not a bytes$"):
        saver.delete_for_runs(b"ab")  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"^channels must be a sequence of channel names, not an int$"
    ):
        saver.get_delta_channel_history(config=_config("a"), channels=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        saver.get_delta_channel_history(config=_config("a"), channels="ab")
    with pytest.raises(TypeError):
        saver.put_writes(_config("a", *_ids(1)), "ab", "task")  # type: ignore[arg-type]
    for thread in ("a", "b"):  # nothing was pruned or deleted
        assert saver.get_tuple(_config(thread)) is not None


def _append(state: list[Any], writes: list[Any]) -> list[Any]:
    return [*state, *writes]


class _DeltaState(TypedDict):
    items: Annotated[list[Any], DeltaChannel(_append)]


def test_prune_refuses_a_delta_channel_thread_and_keeps_its_state(
    running: DaemonProcess,
) -> None:
    saver = SessionStoreSaver(running.socket_path)
    builder = StateGraph(_DeltaState)
    builder.add_node("step", lambda state: {"items": [f"v{len(state['items'])}"]})
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    graph = builder.compile(checkpointer=saver)
    config = _config("delta")
    for _ in range(3):
        graph.invoke({"items": []}, config)  # type: ignore[arg-type]
    before = graph.get_state(config).values
    assert any(before["items"])
    with pytest.raises(NotImplementedError):
        saver.prune(["delta"])
    assert graph.get_state(config).values == before


def test_prune_keeps_the_heads_writes_whenever_they_came_and_makes_it_a_root(
    running: DaemonProcess,
) -> None:
    saver = SessionStoreSaver(running.socket_path)
    first, second, third, coming = _ids(4)
    _put(saver, "p", first, None)
    _put(saver, "p", second, first)
    saver.put_writes(_config("p", second), [("x", 1)], "t1")
    _put(saver, "p", third, second)
    saver.put_writes(_config("p", third), [("x", 3)], "t3")
    saver.put_writes(_config("p", coming), [("x", 4)], "t4")  # durability="async": first
    saver.prune(["p"])
    head = saver.get_tuple(_config("p"))
    assert head is not None and head.checkpoint["id"] == third
    assert head.parent_config is None  # its parent is gone
    assert [w[2] for w in head.pending_writes or []] == [3]
    assert saver.get_tuple(_config("p", second)) is None
    _put(saver, "p", coming, third)  # the checkpoint its writes came ahead of
    arrived = saver.get_tuple(_config("p", coming))
    assert arrived is not None and [w[2] for w in arrived.pending_writes or []] == [4]


def test_a_never_stored_parent_is_taken_and_a_deleted_one_refused(
    running: DaemonProcess,
) -> None:
    saver = SessionStoreSaver(running.socket_path)
    never, child, old, head, late = _ids(5)
    _put(saver, "n", child, never)  # LangGraph's own tests put on ids never stored
    assert saver.get_tuple(_config("n", child)) is not None
    _put(saver, "q", old, None)
    _put(saver, "q", head, old)
    saver.prune(["q"])
    with pytest.raises(DeletedCheckpoint):  # a run that went on from a pruned checkpoint
        _put(saver, "q", late, old)
    _put(saver, "q", late, head)  # from the kept head: fine
    run_config = {"configurable": {"thread_id": "r", "checkpoint_ns": ""}}
    checkpoint = {**empty_checkpoint(), "id": _ids(1)[0]}
    stored = saver.put(run_config, checkpoint, {"run_id": "run-1"}, {})  # type: ignore[arg-type,typeddict-item]
    saver.delete_for_runs(["run-1"])
    with pytest.raises(DeletedCheckpoint):
        _put(saver, "r", *_ids(1), stored["configurable"]["checkpoint_id"])
    saver.delete_thread("n")
    with pytest.raises(DeletedCheckpoint):
        _put(saver, "n", *_ids(1), child)


class _Count(TypedDict):
    count: int
    by: Annotated[list[str], lambda a, b: a + b]


def test_two_workers_resume_one_thread_and_only_the_owner_writes(
    running: DaemonProcess,
) -> None:
    """Worker a runs the thread; worker b resumes it and takes it over; a's next run is
    refused with StaleOwner at its first checkpoint, and changes nothing."""

    def app(worker: str, saver: SessionStoreSaver) -> Any:
        graph = StateGraph(_Count)
        graph.add_node("step", lambda s: {"count": s["count"] + 1, "by": [worker]})
        graph.add_edge(START, "step")
        graph.add_edge("step", END)
        return graph.compile(checkpointer=saver)

    config: Any = {"configurable": {"thread_id": "shared"}}
    first = SessionStoreSaver(running.socket_path, owner="worker-a")
    second = SessionStoreSaver(running.socket_path, owner="worker-b")
    app("a", first).invoke({"count": 0, "by": []}, config)
    with pytest.raises(StaleOwner):  # b may not write while a owns the thread
        app("b", second).invoke({"count": 0, "by": []}, config)
    second.take_over("shared")
    after_b = app("b", second).invoke({"count": 10, "by": []}, config)
    assert after_b["by"] == ["a", "b"]
    with pytest.raises(StaleOwner):  # a was fenced
        app("a", first).invoke({"count": 100, "by": []}, config)
    app("a", first).invoke({"count": 0, "by": []}, {"configurable": {"thread_id": "a's"}})
    with pytest.raises(StaleOwner):  # removing and copying into the thread: fenced too
        first.delete_thread("shared")
    with pytest.raises(StaleOwner):
        first.prune(["shared"], strategy="keep_latest")
    with pytest.raises(StaleOwner):
        first.copy_thread("a's", "shared")
    state = app("b", second).get_state(config)
    assert state.values == {"count": 11, "by": ["a", "b"]}  # a's refused writes left nothing
    assert len(list(second.list(config))) == 6  # each run: input, step, end
    second.prune(["shared"], strategy="keep_latest")  # the owner's own are not refused
    assert len(list(second.list(config))) == 1
    first.close(), second.close()


def test_an_owned_thread_with_a_ttl_is_fenced_and_still_expires_whole(
    running: DaemonProcess,
) -> None:
    config: Any = {"configurable": {"thread_id": "timed"}}
    ttl = {"default_ttl": 1}  # minutes

    def saver(owner: str) -> SessionStoreSaver:
        return SessionStoreSaver(running.socket_path, owner=owner, ttl=ttl)

    def run(on: SessionStoreSaver, count: int) -> Any:
        graph = StateGraph(_Count)
        graph.add_node("step", lambda s: {"count": s["count"] + 1})
        graph.add_edge(START, "step")
        graph.add_edge("step", END)
        return graph.compile(checkpointer=on).invoke({"count": count, "by": []}, config)

    first, second = saver("worker-a"), saver("worker-b")
    run(first, 0)
    with pytest.raises(StaleOwner):
        run(second, 10)
    second.take_over("timed")
    assert run(second, 10)["count"] == 11
    with pytest.raises(StaleOwner):
        run(first, 100)
    with running.client() as client:
        stored = client.checkpoint_scan("kv", "langgraph/c/timed/")["items"]
    assert stored and all("expires_at_ms" in item for item in stored)  # in its lifetime
    first.close(), second.close()
