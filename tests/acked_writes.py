# Writers that save and delete in a loop through real daemons, keeping every
# acknowledgement (seq, id, digest or None for a delete), and the state those
# acknowledgements say the store holds: what a backup, a restore or a key
# rotation under load is checked against.
from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .conftest import DaemonProcess

Ack = tuple[int, str, str | None]
SessionId = Callable[[int, int], str]  # (writer number, its n-th write) -> id
Snapshot = Callable[[str, int], dict[str, Any]]
CLI = [sys.executable, "-m", "sessionstore.tools.cli"]


def exported_digests(daemon: DaemonProcess) -> dict[tuple[str, str], str]:
    """Every document's digest, as `export` lists them (the lease is not exported)."""
    result = subprocess.run(
        [*CLI, "--socket", daemon.socket_path, "export"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    lines = map(json.loads, result.stdout.splitlines())
    return {(line["kind"], line["id"]): line["digest"] for line in lines}


@contextmanager
def acked_writes(
    daemons: Sequence[DaemonProcess],
    writers: int,
    session_id: SessionId,
    snapshot: Snapshot,
    *,
    delete_every: int,
) -> Iterator[list[Ack]]:
    """Writer k goes through daemons[k % len(daemons)]; its n-th write is a delete when
    n % delete_every is delete_every - 1. They stop when the block ends."""
    acks: list[Ack] = []
    stop, lock = threading.Event(), threading.Lock()

    def writer(number: int) -> None:
        with daemons[number % len(daemons)].client() as client:
            n = 0
            while not stop.is_set():
                name = session_id(number, n)
                if n % delete_every == delete_every - 1:
                    ack: Ack = (client.delete(name)["seq"], name, None)
                else:
                    reply = client.save(snapshot(name, n))
                    ack = (reply["seq"], name, reply["digest"])
                with lock:
                    acks.append(ack)
                n += 1

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    try:
        yield acks
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def acked_state(
    acks: Sequence[Ack], base: dict[tuple[str, str], str] | None = None, upto: int | None = None
) -> dict[tuple[str, str], str]:
    """Each session's digest after base and the acknowledgements up to seq upto, as
    `export` lists them."""
    state = dict(base or {})
    for seq, session_id, digest in sorted(acks):
        if upto is not None and seq > upto:
            continue
        if digest is None:
            state.pop(("session", session_id), None)
        else:
            state[("session", session_id)] = digest
    return state
