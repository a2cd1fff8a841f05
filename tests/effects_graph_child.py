# A LangGraph run whose node has a visible effect (it appends a line to a file)
# under the thread's effects ledger (saver.effects), checkpointed in sessionstore,
# killing itself with SIGKILL at the point it is told:
#   python -m tests.effects_graph_child SOCKET THREAD FILE KILL_AT
# KILL_AT: before-effect, after-effect, after-done (the node's result recorded,
# its checkpoint not yet written), or never. Without a kill it runs the thread
# to its end (resuming it, when a checkpoint holds it) and prints the state's
# refund, or "unresolved" when the node found its effect left intended.
from __future__ import annotations

import sys
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

from sessionstore.effects import UnresolvedEffect
from sessionstore.langgraph import SessionStoreSaver

from .effects_child import die_at, killable_refund


class State(TypedDict):
    order: str
    refund: str


def main() -> None:
    socket_path, thread, path, kill_at = sys.argv[1:5]
    saver = SessionStoreSaver(socket_path)
    refund = killable_refund(saver.effects(thread), lambda order: f"refund/{order}", path, kill_at)

    def refund_node(state: State) -> dict[str, Any]:
        result = refund(state["order"])
        die_at(kill_at, "after-done")  # recorded; the node's checkpoint comes after it returns
        return {"refund": result}

    graph = StateGraph(State)
    graph.add_node("take_order", lambda state: {"order": state["order"]})
    graph.add_node("refund", refund_node)
    graph.add_edge(START, "take_order")
    graph.add_edge("take_order", "refund")
    graph.add_edge("refund", END)
    app = graph.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": thread}}
    started = app.get_state(config).next  # a checkpoint holds an unfinished run: resume it
    try:
        state = app.invoke(None if started else {"order": "1001", "refund": ""}, config)
    except UnresolvedEffect:
        print("unresolved", flush=True)
        return
    print(state["refund"], flush=True)


if __name__ == "__main__":
    main()
