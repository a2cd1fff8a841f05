# a3s-code-core FileSessionStore directories, written the way that code
# writes them (A3S-Lab/Code, core/src/store/: file_store.rs, wal.rs,
# encryption.rs, content_digest.rs): pretty JSON per document under
# v1/<category>/id_<base64url>.json, optionally sealed in an "A3SE" envelope
# (AES-256-GCM, 12-byte nonce, no associated data), and the NDJSON WAL of
# digest-only intents and commits. Also what a crash leaves: an intent whose
# rename happened, an intent whose rename did not (its temp file still there),
# a corrupt file.
from __future__ import annotations

import base64
import hashlib
import json
import math
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

WAL_SCHEMA = "a3s.code.session-store-wal-entry.v1"
WAL_DOMAIN = "a3s.code.session-store-wal-entry.identity.v1"
SNAPSHOT_DOMAIN = "a3s.code.session-store-snapshot.identity.v1"


def serde_float(number: float) -> str:
    """How serde_json writes an f64 (ryu's shortest digits; decimal from 1e-5 up
    to below 1e16, else d.ddde<n> with no plus sign and no padding)."""
    if number == 0:
        return "-0.0" if math.copysign(1.0, number) < 0 else "0.0"
    sign, digits, exponent = Decimal(repr(number)).normalize().as_tuple()
    figures = "".join(map(str, digits))
    point = len(figures) + int(exponent)  # where the decimal point falls
    text = (
        figures + "0" * (point - len(figures)) + ".0" if len(figures) <= point <= 16
        else figures[:point] + "." + figures[point:] if 0 < point <= 16
        else "0." + "0" * -point + figures if -5 < point <= 0
        else figures[0] + ("." + figures[1:] if len(figures) > 1 else "") + f"e{point - 1}"
    )  # fmt: skip
    return ("-" if sign else "") + text


def serde_json(value: Any, indent: int | None = None, depth: int = 0) -> str:
    """serde_json::to_vec (indent None) or to_vec_pretty (indent 2): fields in the
    order given, raw UTF-8, [] and {} for empty containers."""
    if isinstance(value, float):
        return serde_float(value)
    if not isinstance(value, (dict, list)) or not value:
        return json.dumps(value, ensure_ascii=False)
    items = (
        [json.dumps(k, ensure_ascii=False) + (": " if indent else ":")
         + serde_json(v, indent, depth + 1) for k, v in value.items()]
        if isinstance(value, dict)
        else [serde_json(v, indent, depth + 1) for v in value]
    )  # fmt: skip
    opening, closing = "{}" if isinstance(value, dict) else "[]"
    if indent is None:
        return opening + ",".join(items) + closing
    inner, outer = "\n" + " " * indent * (depth + 1), "\n" + " " * indent * depth
    return opening + inner + ("," + inner).join(items) + outer + closing


def digest_json(domain: str, value: Any) -> str:
    """content_digest.rs: sha256 of domain, a NUL byte, serde_json::to_vec(value)."""
    data = serde_json(value).encode()
    return "sha256:" + hashlib.sha256(domain.encode() + b"\0" + data).hexdigest()


def storage_name(doc_id: str) -> str:
    return "id_" + base64.urlsafe_b64encode(doc_id.encode()).rstrip(b"=").decode() + ".json"


# ToolPresentationProfileV1::default() (tools/presentation.rs): the adaptive profile,
# what SessionConfig's #[serde(default)] gives; written by 8.x and 9.0 always
PRESENTATION_PROFILE = {"schema": "a3s.code.tool-presentation-profile.v1", "mode": "adaptive"}
# ToolResultTransformPolicyV1::conservative() (tools/result_transform.rs; MAX_OUTPUT_SIZE
# is 100 KiB in tools/mod.rs), what SessionConfig's #[serde(default)] gives
TRANSFORM_POLICY = {
    "schema": "a3s.code.tool-result-transform-policy.v1",
    "max_output_bytes": 102400,
    "head_bytes": 102400,
    "tail_bytes": 0,
    "fold_repeated_lines": False,
    "repeated_line_threshold": 3,
    "structured_sample_items": 0,
}


def session_data(session_id: str, generation: str = "g1", **fields: Any) -> dict[str, Any]:
    """A SessionData as upstream serialises it (store/session_data.rs, llm/types.rs):
    struct field order, Options skipped where serde skips them and null where it
    does not, Message content as tagged blocks, f32 and f64 fields."""
    return {
        "id": session_id,
        "config": {
            "name": generation,
            "workspace": "/home/dev/project",
            "system_prompt": None,
            "max_context_length": 200000,
            "auto_compact": True,
            "auto_compact_threshold": 0.8,
            "storage_type": "file",
            "planning_mode": "Auto",
            "goal_tracking": False,
            "tool_result_transform_policy": TRANSFORM_POLICY,
            "tool_presentation_profile": PRESENTATION_PROFILE,
        },
        "state": "Active",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": f"fix the tests ({generation})"}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Running them first."},
                    {
                        "type": "tool_use",
                        "id": "toolu_01",
                        "name": "bash",
                        "input": {"command": "make test", "timeout": 600},
                    },
                ],
                "reasoning_content": "The failures name two modules; run them before editing.",
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": "2 failed, 40 passed",
                        "is_error": False,
                    }
                ],
            },
        ],
        "context_usage": {"used_tokens": 1843, "max_tokens": 200000, "percent": 0.92, "turns": 2},
        "total_usage": {
            "prompt_tokens": 1500,
            "completion_tokens": 343,
            "total_tokens": 1843,
            "cache_read_tokens": None,
            "cache_write_tokens": 1024,
        },
        "total_cost": 0.0123,
        "model_name": "claude-sonnet-4",
        "cost_records": [],
        "tool_names": ["read", "write", "edit", "bash", "grep"],
        "thinking_enabled": False,
        "thinking_budget": None,
        "created_at": 1700000000,
        "updated_at": 1700000060,
        "tasks": [],
        **fields,
    }


def legacy_session_data(session_id: str, name: str = "old") -> dict[str, Any]:
    """A SessionData from before total_cost, cost_records, tasks (it was "todos"),
    auto_compact_threshold, storage_type, planning_mode, goal_tracking and the
    tool-result transform policy and the tool presentation profile existed."""
    session = session_data(session_id, name)
    for field in ("total_cost", "cost_records", "tasks"):
        del session[field]
    session["todos"] = []
    session["config"] = {
        k: v for k, v in session["config"].items()
        if k not in ("auto_compact_threshold", "storage_type", "planning_mode", "goal_tracking",
                     "tool_result_transform_policy", "tool_presentation_profile")
    }  # fmt: skip
    return session


def tool_artifact(tool: str, content: str, shown: int) -> dict[str, Any]:
    """tools/artifacts.rs ToolArtifact, named as tool_output_artifact names it."""
    digest = hashlib.sha256(content.encode()).hexdigest()
    return {
        "artifact_id": f"tool-output:{tool}:{digest}",
        "artifact_uri": f"a3s://tool-output/{tool}/{digest}",
        "tool_name": tool,
        "content": content,
        "original_bytes": len(content.encode()),
        "shown_bytes": shown,
    }


def trace_event(name: str, artifact_uris: list[str]) -> dict[str, Any]:
    """trace.rs TraceEvent::tool_execution (empty lists and None details skipped)."""
    event: dict[str, Any] = {
        "schema": "a3s.trace_event.v1",
        "kind": "tool_execution",
        "name": name,
        "success": True,
        "exit_code": 0,
        "duration_ms": 1520,
        "output_bytes": 19,
    }
    if artifact_uris:
        event["metadata_keys"] = ["artifact"]
        event["artifact_uris"] = artifact_uris
    return event


def run_record(session_id: str, run_id: str = "run-1") -> dict[str, Any]:
    """run.rs RunRecord: a completed RunSnapshot (no bindings) and no retained events."""
    return {
        "snapshot": {
            "id": run_id,
            "session_id": session_id,
            "status": "completed",
            "prompt": "fix the tests",
            "created_at_ms": 1700000000000,
            "updated_at_ms": 1700000059000,
            "result_text": "Both failures fixed.",
            "event_count": 0,
        },
        "events": [],
    }


def snapshot(session_id: str, generation: str = "g1", **extra: Any) -> dict[str, Any]:
    """A SessionSnapshotV1 as save_snapshot writes it, with a tool artifact that is
    also a retention root, its trace event and one run."""
    artifact = tool_artifact("bash", f"2 failed, 40 passed\n{generation}\n", 19)
    return {
        "schema_version": 1,
        "session": session_data(session_id, generation),
        "artifacts": [artifact],
        "retained_artifact_uris": [artifact["artifact_uri"]],
        "trace_events": [trace_event("bash", [artifact["artifact_uri"]])],
        "run_records": [run_record(session_id)],
        "verification_reports": [],
        "subagent_tasks": [],
        **extra,
    }


def as_upstream_reads(session: dict[str, Any]) -> dict[str, Any]:
    """An old SessionData with what serde fills in for its missing fields
    (session_data.rs: #[serde(default)] on total_cost, cost_records, tasks, alias
    "todos"; in SessionConfig default_auto_compact_threshold() = 0.80,
    StorageBackend::File ("file"), PlanningMode::Auto ("Auto"), goal_tracking
    false, the conservative transform policy; Options without a skip read as None
    and are written as null)."""
    read = {"total_cost": 0.0, "cost_records": [], "thinking_budget": None, **session}
    read["tasks"] = read.pop("todos", read.get("tasks", []))
    config = read.get("config")
    if isinstance(config, dict):
        read["config"] = {
            "system_prompt": None,
            "auto_compact_threshold": 0.8,
            "storage_type": "file",
            "planning_mode": "Auto",
            "goal_tracking": False,
            "tool_result_transform_policy": TRANSFORM_POLICY,
            "tool_presentation_profile": PRESENTATION_PROFILE,
            **config,
        }
    return read


def assembled(session: dict[str, Any], **components: Any) -> dict[str, Any]:
    """What upstream's load_snapshot returns for a bare SessionData: SessionSnapshotV1
    with the session as serde reads it and every component, [] where no fragment was
    stored."""
    empty = ("artifacts", "retained_artifact_uris", "trace_events", "run_records",
             "verification_reports", "subagent_tasks")  # fmt: skip
    return {
        "schema_version": 1,
        "session": as_upstream_reads(session),
        **{key: [] for key in empty},
        **components,
    }


class UpstreamStore:
    def __init__(self, root: Path, key: bytes | None = None) -> None:
        self.root = root
        self.key = key
        self.sequence = 0
        self.clock_ms = 1_700_000_000_000

    def _bytes(self, value: Any) -> bytes:
        data = serde_json(value, indent=2).encode()  # to_vec_pretty
        if self.key is None:
            return data
        nonce = os.urandom(12)
        return b"A3SE" + bytes([1]) + nonce + AESGCM(self.key).encrypt(nonce, data, None)

    def path(self, category: str, doc_id: str) -> Path:
        return self.root / "v1" / category / storage_name(doc_id)

    def write(self, category: str, doc_id: str, value: Any) -> Path:
        path = self.path(category, doc_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self._bytes(value))
        return path

    def _wal(self, session_id: str, digest: str, phase: str, sequence: int) -> None:
        self.clock_ms += 1
        identity = {
            "schema": WAL_SCHEMA,
            "sequence": sequence,
            "session_id": session_id,
            "snapshot_digest": digest,
            "phase": phase,
            "recorded_at_ms": self.clock_ms,
        }
        entry = {
            "schema": WAL_SCHEMA,
            "sequence": sequence,
            "sessionId": session_id,
            "snapshotDigest": digest,
            "phase": phase,
            "recordedAtMs": self.clock_ms,
            "entryDigest": digest_json(WAL_DOMAIN, identity),
        }
        wal = self.root / "v1" / "wal" / "session-store.ndjson"
        wal.parent.mkdir(parents=True, exist_ok=True)
        with wal.open("a", encoding="utf-8") as handle:
            handle.write(serde_json(entry) + "\n")  # raw UTF-8, as serde_json writes

    def save_snapshot(self, value: dict[str, Any]) -> None:
        """commit_snapshot_under_lock: intent, atomic replace, commit."""
        self.sequence += 1
        digest = digest_json(SNAPSHOT_DOMAIN, value)
        self._wal(value["session"]["id"], digest, "intent", self.sequence)
        self.write("sessions", value["session"]["id"], value)
        self._wal(value["session"]["id"], digest, "committed", self.sequence)

    def crash_after_rename(self, value: dict[str, Any]) -> None:
        """The new generation was renamed in; the process died before the commit record."""
        self.sequence += 1
        self._wal(
            value["session"]["id"], digest_json(SNAPSHOT_DOMAIN, value), "intent", self.sequence
        )
        self.write("sessions", value["session"]["id"], value)

    def crash_before_rename(self, value: dict[str, Any]) -> Path:
        """The intent and the temp file were written; the rename never happened."""
        self.sequence += 1
        self._wal(
            value["session"]["id"], digest_json(SNAPSHOT_DOMAIN, value), "intent", self.sequence
        )
        final = self.path("sessions", value["session"]["id"])
        temp = final.with_name(final.name + f".{self.clock_ms}000000.4242.0.tmp")
        temp.write_bytes(self._bytes(value))
        return temp


def build(root: Path, key: bytes | None = None, *, damaged: bool = True) -> dict[str, Any]:
    """A store with every case; returns what a faithful import must yield."""
    store = UpstreamStore(root, key)
    expected: dict[str, Any] = {"sessions": {}, "loop": {}, "workflow": {}}
    for session_id in ("../../etc/passwd", "tenant/session", "tenant_session", "plain-1"):
        value = snapshot(session_id)
        store.save_snapshot(value)
        expected["sessions"][session_id] = value
    sealed_on_reopen = snapshot("tenant/session", "g2")
    store.crash_after_rename(sealed_on_reopen)
    expected["sessions"]["tenant/session"] = sealed_on_reopen
    expected["temp"] = store.crash_before_rename(snapshot("plain-1", "torn"))  # g1 stands
    store.write("loop_checkpoints", "run-1", {"run_id": "run-1", "step": 3, "messages": []})
    expected["loop"]["run-1"] = {"run_id": "run-1", "step": 3, "messages": []}
    store.write("workflow_checkpoints", "wf/1", {"workflow_id": "wf/1", "state": "waiting"})
    expected["workflow"]["wf/1"] = {"workflow_id": "wf/1", "state": "waiting"}
    legacy = legacy_session_data("legacy/1")  # before v1
    (root / "legacy_1.json").write_bytes(store._bytes(legacy))
    artifact = tool_artifact("read", "a file longer than the model was shown\n", 12)
    traces = [trace_event("read", [artifact["artifact_uri"]])]
    (root / "traces").mkdir()
    (root / "traces" / "legacy_1.json").write_bytes(store._bytes(traces))
    (root / "artifacts" / "legacy_1").mkdir(parents=True)
    manifest = {"artifacts": [artifact], "retained_uris": [artifact["artifact_uri"]]}
    (root / "artifacts" / "legacy_1" / "artifacts.json").write_bytes(store._bytes(manifest))
    expected["sessions"]["legacy/1"] = assembled(
        legacy, trace_events=traces, artifacts=[artifact],
        retained_artifact_uris=[artifact["artifact_uri"]],
    )  # fmt: skip
    bare = legacy_session_data("bare-in-v1", "saved by a legacy caller")
    store.write("sessions", "bare-in-v1", bare)
    runs = [run_record("bare-in-v1")]
    store.write("runs", "bare-in-v1", runs)
    expected["sessions"]["bare-in-v1"] = assembled(bare, run_records=runs)
    if damaged:
        corrupt = store.path("sessions", "corrupt")
        corrupt.write_bytes(b'{"schema_version": 1, "session": {"id": "corr')
        expected["corrupt"] = corrupt
        bad = snapshot(
            "breaks-rules", run_records=[{"snapshot": {"id": "r", "session_id": "other"}}]
        )
        store.save_snapshot(bad)
        expected["breaks_rules"] = store.path("sessions", "breaks-rules")
    return expected
