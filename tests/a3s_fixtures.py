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
import os
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

WAL_SCHEMA = "a3s.code.session-store-wal-entry.v1"
WAL_DOMAIN = "a3s.code.session-store-wal-entry.identity.v1"
SNAPSHOT_DOMAIN = "a3s.code.session-store-snapshot.identity.v1"


def digest_json(domain: str, value: Any) -> str:
    """content_digest.rs: sha256 of domain, a NUL byte, serde_json::to_vec(value)."""
    data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return "sha256:" + hashlib.sha256(domain.encode() + b"\0" + data).hexdigest()


def storage_name(doc_id: str) -> str:
    return "id_" + base64.urlsafe_b64encode(doc_id.encode()).rstrip(b"=").decode() + ".json"


def snapshot(session_id: str, generation: str = "g1", **extra: Any) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "session": {
            "id": session_id,
            "config": {"name": generation, "workspace": "/work"},
            "messages": [{"role": "user", "content": f"hello from {generation}"}],
        },
        "artifacts": [],
        "trace_events": [{"kind": "start", "at_ms": 1}],
        "run_records": [],
        "verification_reports": [],
        "subagent_tasks": [],
        **extra,
    }


def as_upstream_reads(session: dict[str, Any]) -> dict[str, Any]:
    """An old SessionData with what serde fills in for its missing fields
    (session_data.rs: #[serde(default)] on total_cost, cost_records, tasks; in
    SessionConfig default_auto_compact_threshold() = 0.80, StorageBackend::File
    ("file"), PlanningMode::Auto ("Auto"), goal_tracking false)."""
    read = {"total_cost": 0.0, "cost_records": [], "tasks": [], **session}
    config = read.get("config")
    if isinstance(config, dict):
        read["config"] = {
            "auto_compact_threshold": 0.8,
            "storage_type": "file",
            "planning_mode": "Auto",
            "goal_tracking": False,
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
        data = json.dumps(value, indent=2, ensure_ascii=False).encode()  # to_vec_pretty
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
        with wal.open("a") as handle:
            handle.write(json.dumps(entry, separators=(",", ":")) + "\n")

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
    legacy = {"id": "legacy/1", "config": {"name": "old"}, "messages": []}  # before v1
    (root / "legacy_1.json").write_bytes(store._bytes(legacy))
    traces = [{"kind": "old-trace", "at_ms": 5}]
    (root / "traces").mkdir()
    (root / "traces" / "legacy_1.json").write_bytes(store._bytes(traces))
    (root / "artifacts" / "legacy_1").mkdir(parents=True)
    manifest = {"artifacts": [{"uri": "file:///report.md", "kind": "file"}]}
    (root / "artifacts" / "legacy_1" / "artifacts.json").write_bytes(store._bytes(manifest))
    expected["sessions"]["legacy/1"] = assembled(
        legacy, trace_events=traces, artifacts=manifest["artifacts"]
    )
    bare = {"id": "bare-in-v1", "config": {"name": "saved by a legacy caller"}}
    store.write("sessions", "bare-in-v1", bare)
    runs: list[Any] = []
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
