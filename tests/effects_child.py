# A run of a tool with a visible effect (it appends a line to a file) under the
# effects ledger, which kills itself with SIGKILL at the point it is told:
#   python -m tests.effects_child SOCKET KEY FILE KILL_AT
# KILL_AT: before-effect (intended, the line not written), after-effect (written,
# not recorded), after-done (recorded), or never. Prints the tool's result, or
# "unresolved" when an earlier run left the effect intended.
# tests/effects_graph_child.py runs the same tool in a LangGraph node,
# tests/effects_agent_child.py as an Agents SDK or ADK agent's tool.
from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from sessionstore.effects import Key, Ledger, UnresolvedEffect


def die_at(kill_at: str, point: str) -> None:
    if kill_at == point:
        os.kill(os.getpid(), signal.SIGKILL)


def refund_line(path: str, kill_at: str, order: str) -> str:
    """The refund's visible effect: a line appended to path, the process killed at
    kill_at if that is before-effect or after-effect."""
    die_at(kill_at, "before-effect")
    with open(path, "a") as out:
        out.write("refunded\n")
        out.flush()
        os.fsync(out.fileno())
    die_at(kill_at, "after-effect")
    return f"r-{order}"


def killable_refund(ledger: Ledger, key: Key, path: str, kill_at: str) -> Callable[[str], str]:
    """refund(order), once per key: refund_line."""

    @ledger.once(key)
    def refund(order: str) -> str:
        return refund_line(path, kill_at, order)

    return refund


def main() -> None:
    socket_path, key, path, kill_at = sys.argv[1:5]
    refund = killable_refund(Ledger("s", socket_path), key, path, kill_at)
    try:
        result = refund("1")
    except UnresolvedEffect:
        print("unresolved", flush=True)
        return
    die_at(kill_at, "after-done")
    print(result, flush=True)


if __name__ == "__main__":
    main()
