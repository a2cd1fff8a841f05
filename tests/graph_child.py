# A real LangGraph StateGraph on SessionStoreSaver, run in a child process by
# test_langgraph_graphs.py: `python -m tests.graph_child SOCKET THREAD MODE [N]`.
# MODE "crash-at-c": node c announces itself in the file named by
# GRAPH_CHILD_MARK, then waits to be killed; "resume": continue the thread
# from its last checkpoint; "run": N fresh invocations of the graph.
from __future__ import annotations

import operator
import os
import sys
import time
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from sessionstore.langgraph import SessionStoreSaver


class State(TypedDict):
    steps: Annotated[list[str], operator.add]


class InnerState(TypedDict):
    inner: Annotated[list[str], operator.add]


def inner_node(name: str) -> Any:
    return lambda state: {"inner": [name]}


def node(name: str) -> Any:
    def run(state: State) -> dict[str, list[str]]:
        if name == "c" and os.environ.get("GRAPH_CHILD_MODE") == "crash-at-c":
            with open(os.environ["GRAPH_CHILD_MARK"], "w") as mark:
                mark.write(str(len(state["steps"])))
            time.sleep(120)  # killed here with SIGKILL
        return {"steps": [name]}

    return run


def build(saver: SessionStoreSaver) -> Any:
    inner = StateGraph(InnerState)
    inner.add_node("d1", inner_node("d1"))
    inner.add_node("d2", inner_node("d2"))
    inner.add_edge(START, "d1")
    inner.add_edge("d1", "d2")
    inner.add_edge("d2", END)
    subgraph = inner.compile()

    def run_subgraph(state: State) -> dict[str, list[str]]:
        return {"steps": subgraph.invoke({"inner": []})["inner"]}

    graph = StateGraph(State)
    for name in ("a", "b", "c"):
        graph.add_node(name, node(name))
    graph.add_node("d", run_subgraph)  # a subgraph: checkpoints in its own namespace
    graph.add_node("e", node("e"))
    graph.add_edge(START, "a")
    for first, then in (("a", "b"), ("b", "c"), ("c", "d"), ("d", "e")):
        graph.add_edge(first, then)
    graph.add_edge("e", END)
    return graph.compile(checkpointer=saver)


def main() -> None:
    socket_path, thread, mode = sys.argv[1:4]
    os.environ["GRAPH_CHILD_MODE"] = mode
    saver = SessionStoreSaver(socket_path)
    graph = build(saver)
    config = {"configurable": {"thread_id": thread}}
    if mode == "resume":
        result = graph.invoke(None, config)
        print(",".join(result["steps"]))
    elif mode == "crash-at-c":
        # "sync": each step's checkpoint is durable before the next step starts, which is
        # what makes "resume from the last checkpoint" exact (with LangGraph's default,
        # "async", the newest checkpoints may still be on their way when the process dies)
        graph.invoke({"steps": []}, config, durability="sync")
    else:
        for number in range(int(sys.argv[4])):
            run_config = {"configurable": {"thread_id": f"{thread}-{number}"}}
            result = graph.invoke({"steps": []}, run_config)
            assert result["steps"] == ["a", "b", "c", "d1", "d2", "e"], result
        print("done")


if __name__ == "__main__":
    main()
