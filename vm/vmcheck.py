# Runs inside the test VM with the installed client: writes sessions and checks
# them later. Prints one JSON line; exits 1 when a check fails.
from __future__ import annotations

import json
import sys
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
    raise SystemExit(f"vmcheck: unknown command {command!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
