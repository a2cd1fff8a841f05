# The bytes every contender stores: the canonical CBOR of one agent-session
# snapshot, padded with trace events to about the requested size.
from __future__ import annotations

from typing import Any

from sessionstore.wire.canonical import canonical_dumps


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
    base = len(canonical_dumps(snap))
    event_bytes = len(canonical_dumps(_event(0)))
    count = max(0, (target_bytes - base) // event_bytes)
    snap["trace_events"] = [_event(n) for n in range(count)]
    while len(canonical_dumps(snap)) < target_bytes:  # a step or two: sizes of seq vary
        snap["trace_events"].append(_event(len(snap["trace_events"])))
    return snap


def _event(n: int) -> dict[str, Any]:
    return {"seq": n, "kind": "tool_call", "tool": "edit_file", "detail": "x" * 48}


def snapshot_bytes(session_id: str, target_bytes: int, generation: int = 0) -> bytes:
    return canonical_dumps(make_snapshot(session_id, target_bytes, generation))
