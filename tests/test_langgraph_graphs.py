# Real StateGraphs on SessionStoreSaver across real processes: a run killed
# with SIGKILL in the middle of a node resumes in a new process from the last
# checkpoint, and eight processes running graphs at once lose nothing.
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from sessionstore.client import Client
from sessionstore.langgraph import CorruptCheckpoint, DeletedCheckpoint, SessionStoreSaver

from . import graph_child
from .conftest import DaemonProcess

REPO = Path(__file__).resolve().parent.parent


def child(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.graph_child", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def one_run(socket_path: str, thread: str) -> tuple[SessionStoreSaver, Any, Any]:
    """A saver, the graph run once on a thread, and that thread's newest checkpoint."""
    saver = SessionStoreSaver(socket_path)
    graph = graph_child.build(saver)
    graph.invoke({"steps": []}, {"configurable": {"thread_id": thread}})  # type: ignore[arg-type]
    head = saver.get_tuple({"configurable": {"thread_id": thread}})
    assert head is not None
    return saver, graph, head


def test_a_graph_killed_mid_node_resumes_in_a_new_process(
    running: DaemonProcess, tmp_path: Path
) -> None:
    mark = tmp_path / "reached-c"
    doomed = child(
        running.socket_path, "t-crash", "crash-at-c", env={"GRAPH_CHILD_MARK": str(mark)}
    )
    deadline = time.monotonic() + 60
    while not mark.exists():
        assert doomed.poll() is None, doomed.communicate()
        assert time.monotonic() < deadline, "node c never ran"
        time.sleep(0.05)
    doomed.kill()
    doomed.wait(10)
    saver = SessionStoreSaver(running.socket_path)
    last = saver.get_tuple({"configurable": {"thread_id": "t-crash"}})
    assert last is not None
    assert last.checkpoint["channel_values"]["steps"] == ["a", "b"]
    resumed = child(running.socket_path, "t-crash", "resume")
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert out.strip() == "a,b,c,d1,d2,e"  # c ran once to completion, nothing twice
    final = saver.get_tuple({"configurable": {"thread_id": "t-crash"}})
    assert final is not None and final.checkpoint["channel_values"]["steps"][-1] == "e"


def test_eight_processes_run_graphs_at_once_without_loss(running: DaemonProcess) -> None:
    runs_each = 6
    workers = [child(running.socket_path, f"p{n}", "run", str(runs_each)) for n in range(8)]
    for worker in workers:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0 and out.strip() == "done", err
    # the same graph on LangGraph's in-memory saver gives the expected history
    memory = InMemorySaver()
    graph_child.build(memory).invoke({"steps": []}, {"configurable": {"thread_id": "x"}})  # type: ignore[arg-type]
    expected = [
        (t.config["configurable"]["checkpoint_ns"] != "", t.metadata["step"])
        for t in memory.list({"configurable": {"thread_id": "x"}})
    ]
    saver = SessionStoreSaver(running.socket_path)
    for n in range(8):
        for number in range(runs_each):
            config = {"configurable": {"thread_id": f"p{n}-{number}"}}
            history = [
                (t.config["configurable"]["checkpoint_ns"] != "", t.metadata["step"])
                for t in saver.list(config)
            ]
            assert sorted(history) == sorted(expected), (n, number)


def test_writes_after_delete_thread_are_refused_and_the_thread_stays_deleted(
    running: DaemonProcess,
) -> None:
    saver, graph, head = one_run(running.socket_path, "gone")
    config: Any = {"configurable": {"thread_id": "gone"}}
    saver.delete_thread("gone")
    late = {**head.checkpoint, "id": "1f0ffff0-0000-6000-8000-000000000000"}
    with pytest.raises(DeletedCheckpoint):  # the run's next checkpoint: refused
        saver.put(head.config, late, {"step": 99}, {})  # type: ignore[arg-type,typeddict-item]
    saver.put_writes(head.config, [("steps", ["late"])], "task-1")  # stored, never read
    assert saver.get_tuple(config) is None
    assert saver.get_tuple(head.config) is None
    assert list(saver.list(config)) == []
    assert all(t.config["configurable"]["thread_id"] != "gone" for t in saver.list(None))
    graph.invoke({"steps": []}, config)  # a new run on the same id starts afresh
    fresh = saver.get_tuple(config)
    assert fresh is not None and fresh.checkpoint["channel_values"]["steps"][0] == "a"


def test_put_writes_is_idempotent_and_special_channels_overwrite(running: DaemonProcess) -> None:
    saver, _, head = one_run(running.socket_path, "idem")
    before = len(head.pending_writes or [])
    saver.put_writes(head.config, [("x", 1), ("y", 2)], "task-9", "p")
    saver.put_writes(head.config, [("x", 100), ("y", 200)], "task-9", "p")  # a retry
    saver.put_writes(head.config, [("__error__", "first")], "task-9", "p")
    saver.put_writes(head.config, [("__error__", "second")], "task-9", "p")
    again = saver.get_tuple(head.config)
    assert again is not None
    mine = [(c, v) for t, c, v in again.pending_writes or [] if t == "task-9"]
    assert mine == [("__error__", "second"), ("x", 1), ("y", 2)]
    assert len(again.pending_writes or []) == before + 3


def test_a_value_that_does_not_deserialise_is_an_error_not_none(running: DaemonProcess) -> None:
    saver, _, head = one_run(running.socket_path, "rot")
    config: Any = {"configurable": {"thread_id": "rot"}}
    key = saver.keys.checkpoint("rot", "", head.config["configurable"]["checkpoint_id"])
    with Client(running.socket_path) as client:
        stored = client.checkpoint_get("kv", key)
        client.checkpoint_put("kv", key, {**stored, "checkpoint": b"\xc1 not msgpack"})
    with pytest.raises(CorruptCheckpoint, match="cannot deserialise the checkpoint"):
        saver.get_tuple(config)
    with pytest.raises(CorruptCheckpoint):
        list(saver.list(config))
    assert JsonPlusSerializer().loads_typed(("msgpack", stored["checkpoint"])) is not None


def test_writes_copies_and_prunes_of_any_size_succeed(running: DaemonProcess) -> None:
    """put_writes of more writes than one txn holds (10,000 ops), copy_thread and prune of
    a thread of 5,002 checkpoints of one run (two documents each): split, and whole."""
    saver, _, head = one_run(running.socket_path, "huge")
    saver.put_writes(head.config, [(f"ch{n}", n) for n in range(10_001)], "task-big", "p")
    stored = saver.get_tuple(head.config)
    assert stored is not None
    assert len([w for w in stored.pending_writes or [] if w[0] == "task-big"]) == 10_001
    config: Any = {"configurable": {"thread_id": "long", "checkpoint_ns": ""}}
    for step in range(5_002):
        checkpoint = {**empty_checkpoint(), "id": str(uuid6(clock_seq=step))}
        metadata: Any = {"source": "loop", "step": step, "run_id": "run-1"}
        config = saver.put(config, checkpoint, metadata, {})  # type: ignore[arg-type]
    saver.copy_thread("long", "long-copy")
    copies = list(saver.list({"configurable": {"thread_id": "long-copy"}}))
    assert len(copies) == 5_002
    saver.prune(["long-copy"], strategy="keep_latest")
    kept = list(saver.list({"configurable": {"thread_id": "long-copy"}}))
    assert [t.checkpoint["id"] for t in kept] == [copies[0].checkpoint["id"]]
    assert len(list(saver.list({"configurable": {"thread_id": "long"}}))) == 5_002
