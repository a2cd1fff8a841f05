# A run of a tool with a visible effect (it appends a line to a file) under the
# effects ledger, which kills itself with SIGKILL at the point it is told:
#   python -m tests.effects_child SOCKET SESSION KEY FILE KILL_AT
# KILL_AT: before-effect (intended, the line not written), after-effect (written,
# not recorded), after-done (recorded), or never. Prints the tool's result, or
# "unresolved" when an earlier run left the effect intended.
from __future__ import annotations

import os
import signal
import sys

from sessionstore.effects import Ledger, UnresolvedEffect


def main() -> None:
    socket_path, session, key, path, kill_at = sys.argv[1:6]
    ledger = Ledger(session, socket_path)

    def die_at(point: str) -> None:
        if kill_at == point:
            os.kill(os.getpid(), signal.SIGKILL)

    @ledger.once(key)
    def refund() -> dict[str, str]:
        die_at("before-effect")
        with open(path, "a") as out:
            out.write("refunded\n")
            out.flush()
            os.fsync(out.fileno())
        die_at("after-effect")
        return {"refund": "r-1"}

    try:
        result = refund()
    except UnresolvedEffect:
        print("unresolved", flush=True)
        return
    die_at("after-done")
    print(result["refund"], flush=True)


if __name__ == "__main__":
    main()
