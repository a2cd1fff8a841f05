# Runs inside the test VM with the installed client: writes sessions and checks
# them later. Prints one JSON line; exits 1 when a check fails. For the power
# cuts, power-load writes until the VM is killed, one line per request before it
# is sent (VMTRY) and per acknowledgement (VMACK), and power-dump reports what
# the daemon serves; the host judges the two against each other.
from __future__ import annotations

import contextlib
import itertools
import json
import random
import secrets
import sys
import termios
import threading
from typing import Any

from sessionstore import snapshot_digest
from sessionstore.client import Client

SOCKET = "/run/sessionstored/sessionstored.sock"
SECRET = "vm-secret-prompt-3c9d1e"


def _snapshot(session_id: str, generation: int) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "session": {"id": session_id},
        "messages": [{"role": "user", "content": f"{SECRET} #{generation}"}],
    }


def save(count: int, out: str) -> None:
    expected: dict[str, Any] = {}
    with Client(SOCKET, timeout=120) as client:
        for generation in range(3):
            for n in range(count):
                session_id = f"vm-{n}"
                client.save(_snapshot(session_id, generation))
        for n in range(count):
            session_id = f"vm-{n}"
            expected[session_id] = {
                "snapshot": client.load(session_id),
                "digest": client.head(session_id)["digest"],
            }
    with open(out, "w") as handle:
        json.dump(expected, handle)
    print(json.dumps({"saved": count}))


def check(path: str) -> int:
    with open(path) as handle:
        expected = json.load(handle)
    wrong = []
    with Client(SOCKET, timeout=120) as client:
        for session_id, want in expected.items():
            digest = client.head(session_id)["digest"]
            if client.load(session_id) != want["snapshot"] or digest != want["digest"]:
                wrong.append(session_id)
        problems = client.verify()["problems"]
    print(json.dumps({"checked": len(expected), "wrong": wrong, "problems": problems}))
    return 1 if wrong or problems else 0


def save_one(session_id: str) -> int:
    try:
        with Client(SOCKET, timeout=300) as client:
            client.save(_snapshot(session_id, 0))
    except Exception as error:  # the daemon is killed under this request: any failure is the point
        print(json.dumps({"acknowledged": False, "error": type(error).__name__}))
        return 0
    print(json.dumps({"acknowledged": True}))
    return 0


def large() -> int:
    """A save over the daemon's offload threshold: decoded in a worker process, which
    must start and work under the unit's sandbox."""
    snapshot = {
        "schema_version": 1,
        "session": {"id": "vm-large"},
        "trace_events": [{"seq": n, "detail": "x" * 40, "weight": 0.5} for n in range(20_000)],
    }
    with Client(SOCKET, timeout=300) as client:
        saved = client.save(snapshot)
        same = client.load("vm-large") == snapshot
    ok = same and saved["digest"] == snapshot_digest(snapshot)
    print(json.dumps({"large_saved": ok}))
    return 0 if ok else 1


POWER_WORKERS = 4
POWER_KEYS = 10  # per worker, of each kind: a worker alone writes its own keys
_print_lock = threading.Lock()


def _line(tag: str, record: dict[str, Any]) -> None:
    """One record on the serial console, all of it out of the guest before this returns:
    a VMTRY is on the host before its request is sent."""
    with _print_lock:
        print(f"{tag} {json.dumps(record, sort_keys=True)}", flush=True)
        with contextlib.suppress(termios.error, OSError):  # not a terminal: nothing to wait for
            termios.tcdrain(sys.stdout.fileno())


def _power_worker(worker: int, run: str) -> None:
    rng = random.Random(f"{run}-{worker}")
    with Client(SOCKET, timeout=300) as client:
        for number in itertools.count():
            token = f"{run}:{worker}:{number}"
            roll = rng.random()
            effects: dict[str, str | None]
            if roll < 0.5:
                session_id = f"pc-{worker}-{rng.randrange(POWER_KEYS)}"
                snapshot = _snapshot(session_id, number) | {"token": token}
                effects = {f"s:{session_id}": snapshot_digest(snapshot)}
                _line("VMTRY", {"w": worker, "n": number, "effects": effects})
                seq = client.save(snapshot)["seq"]
            elif roll < 0.85:
                puts, gone = rng.sample(range(POWER_KEYS), 3), rng.randrange(POWER_KEYS)
                ops: list[dict[str, Any]] = [
                    {"op": "put", "kind": "kv", "key": f"pc/{worker}/{k}", "value": {"t": token}}
                    for k in puts
                ]
                effects = {f"kv:pc/{worker}/{k}": token for k in puts}
                if gone not in puts:
                    ops.append({"op": "delete", "kind": "kv", "key": f"pc/{worker}/{gone}"})
                    effects[f"kv:pc/{worker}/{gone}"] = None
                _line("VMTRY", {"w": worker, "n": number, "effects": effects})
                seq = client.txn(ops)["seq"]
            else:
                session_id = f"pc-{worker}-{rng.randrange(POWER_KEYS)}"
                effects = {f"s:{session_id}": None}
                _line("VMTRY", {"w": worker, "n": number, "effects": effects})
                seq = client.delete(session_id)["seq"]
            _line("VMACK", {"w": worker, "n": number, "seq": seq, "effects": effects})


def power_load() -> int:
    """Saves, txns and deletes from POWER_WORKERS clients at once, until the VM dies."""
    run = secrets.token_hex(4)
    threads = [
        threading.Thread(target=_power_worker, args=(worker, run), daemon=True)
        for worker in range(POWER_WORKERS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 1  # a worker failed: the daemon should have answered every request


def power_dump() -> None:
    served: dict[str, str | None] = {}
    with Client(SOCKET, timeout=300) as client:
        for session_id in client.iter_ids("pc-"):
            served[f"s:{session_id}"] = client.head(session_id)["digest"]
        after = None
        while True:
            page = client.checkpoint_scan("kv", "pc/", after=after, limit=1000)
            for item in page["items"]:
                served[f"kv:{item['key']}"] = item["value"]["t"]
            if page["next"] is None:
                break
            after = page["next"]
        stats, problems = client.stats(), client.verify()["problems"]
    print(json.dumps({"seq": stats["seq"], "served": served, "problems": problems}))


def hello() -> None:
    with Client(SOCKET, timeout=120) as client:
        print(json.dumps(client.hello()["capabilities"]))


def main(argv: list[str]) -> int:
    command = argv[0]
    if command == "save":
        save(int(argv[1]), argv[2])
        return 0
    if command == "check":
        return check(argv[1])
    if command == "save-one":
        return save_one(argv[1])
    if command == "large":
        return large()
    if command == "hello":
        hello()
        return 0
    if command == "power-load":
        return power_load()
    if command == "power-dump":
        power_dump()
        return 0
    raise SystemExit(f"vmcheck: unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
