# The bytes every contender stores: the canonical CBOR of one agent-session
# snapshot, padded with trace events to about the requested size.
from __future__ import annotations

from typing import Any

from sessionstore.canonical import canonical_dumps


def make_snapshot(session_id: str, target_bytes: int, generation: int = 0) -> dict[str, Any]:
    snap: dict[str, Any] = {
        "schema_version": 1,
        "session": {
            "id": session_id,
            "config": {"name": f"gen-{generation}", "model": "agent-large", "workspace": "/w"},
            "messages": [{"role": "user", "content": "refactor the parser"}],
        },
        "artifacts": [],
        "trace_events": [],
        "run_records": [],
    }
    n = 0
    while len(canonical_dumps(snap)) < target_bytes:
        snap["trace_events"].append(
            {"seq": n, "kind": "tool_call", "tool": "edit_file", "detail": "x" * 48}
        )
        n += 1
    return snap


def snapshot_bytes(session_id: str, target_bytes: int, generation: int = 0) -> bytes:
    return canonical_dumps(make_snapshot(session_id, target_bytes, generation))
