# `sessionstore import-a3s DIR`: bring an a3s-code-core FileSessionStore
# across, as that code lays it out (A3S-Lab/Code, core/src/store/):
#
#   DIR/v1/sessions/id_<base64url id>.json          session snapshots (pretty JSON)
#   DIR/v1/loop_checkpoints/id_<base64url>.json      loop checkpoints
#   DIR/v1/workflow_checkpoints/id_<base64url>.json  workflow checkpoints
#   DIR/v1/wal/session-store.ndjson                  intents and commits (digests only)
#   DIR/<legacy id>.json                             bare SessionData, before v1
#   DIR/{v1/<cat>/id_<b64>,<cat>/<legacy id>}.json   its components: traces, runs, ...
#   ...json.<nanos>.<pid>.<n>.tmp                    an atomic write in progress
#
# A document file may be sealed under the host key: "A3SE", version 1, a
# 12-byte nonce, then AES-256-GCM ciphertext and tag, no associated data.
#
# Upstream's own recovery comes first. Files are replaced by rename, so a
# durable file is always one whole generation, and a temp file is never
# imported. An intent without a commit is sealed when the durable snapshot's
# digest matches it. Otherwise the previous generation stands: the intent's
# write never reached its rename. Either way the durable file is what is
# imported, and the report says which rule applied. A digest is SHA-256 over a
# domain string, a NUL and the compact JSON of the snapshot (serde's, in the
# file's field order).
#
# Every document is checked by the daemon's rules on the way in. A file that
# is not JSON or not a document, a sealed file without the key or with
# another one, and an id that does not match its file name are reported by
# name, and the rest is still imported. A rerun skips what is already there
# unchanged, and reports what changed since instead of overwriting it (unless
# told to). --dry-run writes nothing.
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..client import Client
from ..errors import Conflict, SessionStoreError
from .a3s_serde import Unreadable, artifact_store, check_session, compact_json, session_as_read

ENVELOPE_MAGIC = b"A3SE"
ENVELOPE_VERSION = 1
NONCE_BYTES = 12
ENVELOPE_HEAD_BYTES = len(ENVELOPE_MAGIC) + 1 + NONCE_BYTES
MAX_DOCUMENT_BYTES = 256 * 1024 * 1024  # upstream's MAX_FILE_STORE_JSON_BYTES
WAL_SCHEMA = "a3s.code.session-store-wal-entry.v1"
WAL_ENTRY_DOMAIN = "a3s.code.session-store-wal-entry.identity.v1"
SNAPSHOT_DOMAIN = "a3s.code.session-store-snapshot.identity.v1"
CATEGORIES = (
    ("sessions", "session"),
    ("loop_checkpoints", "loop"),
    ("workflow_checkpoints", "workflow"),
)
CHECKPOINT_ID_FIELD = {"loop": "run_id", "workflow": "workflow_id"}
# what SessionSnapshotV1 holds beside the session: load_snapshot returns them all
LOADED_COMPONENTS = (
    "artifacts",
    "retained_artifact_uris",
    "trace_events",
    "run_records",
    "verification_reports",
    "subagent_tasks",
)
# where a bare SessionData's components live (file_store.rs), and the snapshot field each fills
FRAGMENTS = (
    ("traces", "trace_events"),
    ("runs", "run_records"),
    ("verification", "verification_reports"),
    ("subagent_tasks", "subagent_tasks"),
)


def upstream_digest(domain: str, value: Any) -> str:
    """content_digest::digest_json: SHA-256 of domain, NUL, serde_json::to_vec(value)."""
    compact = compact_json(value).encode()
    return "sha256:" + hashlib.sha256(domain.encode() + b"\0" + compact).hexdigest()


def decode_name(file_name: str) -> str | None:
    """`id_<base64url, no padding>.json` -> the id, or None for any other name."""
    if not file_name.startswith("id_") or not file_name.endswith(".json"):
        return None
    encoded = file_name[3:-5]
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != encoded:
            return None
        return raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def is_temp_file(name: str) -> bool:
    return ".json." in name and name.endswith(".tmp")


def read_key(path: str) -> bytes:
    """The host key; ValueError naming the file, in one line, if it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such key file") from None
    except OSError as error:
        raise ValueError(f"{path}: cannot read the key file ({error.strerror})") from None
    if len(data) == 32:
        return data
    text = data.strip()
    if len(text) == 64:
        try:
            return binascii.unhexlify(text)
        except binascii.Error:
            pass
    raise ValueError(f"{path}: the host key must be 32 raw bytes or 64 hex digits")


def open_document(data: bytes, key: bytes | None, path: Path) -> bytes:
    if not (data.startswith(ENVELOPE_MAGIC) and len(data) > ENVELOPE_HEAD_BYTES):
        return data  # plaintext (upstream reads plaintext under a key too, for migration)
    if data[4] != ENVELOPE_VERSION:
        raise ImportProblem(path, f"sealed with envelope version {data[4]}, not 1")
    if key is None:
        raise ImportProblem(path, "sealed under a host key: give it with --key-file")
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = data[5:ENVELOPE_HEAD_BYTES]
    try:
        return AESGCM(key).decrypt(nonce, data[ENVELOPE_HEAD_BYTES:], None)
    except InvalidTag:
        raise ImportProblem(path, "does not open with this key (another key, or damaged)") from None


class ImportProblem(Exception):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass
class UpstreamDocument:
    kind: str  # session, loop, workflow
    id: str
    path: Path
    value: dict[str, Any]
    legacy: bool = False


@dataclass
class Report:
    imported: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # already there, unchanged
    changed: list[str] = field(default_factory=list)  # there, different, left alone
    refused: list[tuple[str, str]] = field(default_factory=list)  # (what, why)
    ignored: list[str] = field(default_factory=list)  # temp files
    recovery: list[str] = field(default_factory=list)  # what upstream's rules decided

    @property
    def complete(self) -> bool:
        return not self.refused and not self.changed

    def as_dict(self) -> dict[str, Any]:
        return {
            "imported": len(self.imported),
            "skipped": len(self.skipped),
            "changed_not_overwritten": self.changed,
            "refused": [{"what": what, "why": why} for what, why in self.refused],
            "temp_files_ignored": self.ignored,
            "recovery": self.recovery,
            "complete": self.complete,
        }


def _read_json(path: Path, key: bytes | None) -> Any:
    size = path.stat().st_size
    if size > MAX_DOCUMENT_BYTES:
        raise ImportProblem(path, f"{size} bytes, over upstream's {MAX_DOCUMENT_BYTES}-byte limit")
    data = open_document(path.read_bytes(), key, path)
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as error:
        raise ImportProblem(path, f"not JSON: {error}") from None


def _session_document(path: Path, file_id: str | None, value: Any) -> UpstreamDocument:
    if not isinstance(value, dict):
        raise ImportProblem(path, "not a JSON object")
    try:
        if "schema_version" in value or "session" in value:  # a SessionSnapshotV1 envelope
            session = value.get("session")
            check_session(session)
            legacy = False
            document = value  # as written: its digest is what the WAL names
        else:  # a bare SessionData of before v1, as serde reads it
            legacy = True
            session = session_as_read(value)
            document = {"schema_version": 1, "session": session}
    except Unreadable as error:
        raise ImportProblem(path, f"upstream cannot read it: {error}") from None
    stored_id = session.get("id") if isinstance(session, dict) else None
    if not isinstance(stored_id, str):
        raise ImportProblem(path, "holds no session id")
    if file_id is not None and stored_id != file_id:
        raise ImportProblem(
            path, f"key collision: the file is named for {file_id!r} but holds {stored_id!r}"
        )
    return UpstreamDocument("session", stored_id, path, document, legacy)


def legacy_safe_id(doc_id: str) -> str:
    return doc_id.replace("/", "_").replace("\\", "_").replace("..", "_")


def storage_name(doc_id: str) -> str:
    return "id_" + base64.urlsafe_b64encode(doc_id.encode()).rstrip(b"=").decode()


def _legacy_owned(root: Path, doc_id: str, key: bytes | None) -> bool:
    """Upstream's legacy_session_belongs_to: the root session file at the id's lossy
    safe name holds exactly this id. Path equality is not ownership: "tenant/session"
    and "tenant_session" share the safe name "tenant_session"."""
    path = root / f"{legacy_safe_id(doc_id)}.json"
    if not path.exists():
        return False
    return _session_document(path, None, _read_json(path, key)).id == doc_id


def _fragment(root: Path, category: str, doc_id: str, owned: bool) -> Path | None:
    """Upstream's readable_component_path: the v1 component, else the root one only
    when the root session file belongs to this id."""
    current = root / "v1" / category / f"{storage_name(doc_id)}.json"
    if current.exists():
        return current
    legacy = root / category / f"{legacy_safe_id(doc_id)}.json"
    return legacy if owned and legacy.exists() else None


def merge_fragments(root: Path, doc: UpstreamDocument, key: bytes | None) -> None:
    """A bare SessionData's components, as upstream's load_snapshot assembles them:
    traces, runs, verification, subagent tasks and the artifact manifest (its
    artifacts and its retained URIs, sorted, as save_artifacts sorts them), every
    component present, [] where none was stored."""
    owned = _legacy_owned(root, doc.id, key)
    for category, field_name in FRAGMENTS:
        path = _fragment(root, category, doc.id, owned)
        if path is None:
            continue
        value = _read_json(path, key)
        if not isinstance(value, list):
            raise ImportProblem(path, f"{category} must be a JSON array")
        doc.value[field_name] = value
    current = root / "v1" / "artifacts" / storage_name(doc.id)
    legacy = root / "artifacts" / legacy_safe_id(doc.id)
    directory = current if current.exists() else legacy if owned and legacy.exists() else None
    manifest = directory / "artifacts.json" if directory is not None else None
    if manifest is not None and manifest.exists():
        try:
            artifacts, retained = artifact_store(_read_json(manifest, key))
        except Unreadable as error:
            raise ImportProblem(manifest, str(error)) from None
        doc.value["artifacts"] = artifacts
        doc.value["retained_artifact_uris"] = retained
    for field_name in LOADED_COMPONENTS:
        doc.value.setdefault(field_name, [])


def find_documents(root: Path, key: bytes | None, report: Report) -> list[UpstreamDocument]:
    found: list[UpstreamDocument] = []
    v1 = root / "v1"
    for category, kind in CATEGORIES:
        directory = v1 / category
        if not directory.is_dir():
            continue
        for path in sorted(directory.iterdir()):
            if is_temp_file(path.name):
                report.ignored.append(str(path))
                continue
            if not path.is_file():
                continue
            file_id = decode_name(path.name)
            if file_id is None:
                report.refused.append(
                    (str(path), "not an upstream document name (id_<base64url>.json)")
                )
                continue
            try:
                value = _read_json(path, key)
                if kind == "session":
                    found.append(_session_document(path, file_id, value))
                else:
                    if not isinstance(value, dict):
                        raise ImportProblem(path, "not a JSON object")
                    stored = value.get(CHECKPOINT_ID_FIELD[kind])
                    if stored is not None and stored != file_id:
                        raise ImportProblem(
                            path, f"key collision: named {file_id!r}, holds {stored!r}"
                        )
                    found.append(UpstreamDocument(kind, file_id, path, value))
            except ImportProblem as problem:
                report.refused.append((str(problem.path), problem.reason))
            except OSError as error:
                report.refused.append((str(path), f"cannot read: {error.strerror}"))
    # a session with a v1 file is that file's, readable or not: upstream reads the v1
    # file whenever it exists and never falls back to an older root copy
    in_v1 = {
        file_id
        for path in ((v1 / "sessions").iterdir() if (v1 / "sessions").is_dir() else ())
        if not is_temp_file(path.name) and (file_id := decode_name(path.name)) is not None
    }
    for path in sorted(root.glob("*.json")):  # sessions from before v1, where v1 has none
        try:
            document = _session_document(path, None, _read_json(path, key))
        except ImportProblem as problem:
            report.refused.append((str(problem.path), problem.reason))
            continue
        if document.id not in in_v1:
            found.append(document)
    for path in sorted(root.glob("*.tmp")):
        report.ignored.append(str(path))
    for doc in [d for d in found if d.legacy]:
        try:
            merge_fragments(root, doc, key)
        except ImportProblem as problem:
            found.remove(doc)
            report.refused.append((str(problem.path), problem.reason))
    return found


def apply_wal_recovery(root: Path, documents: list[UpstreamDocument], report: Report) -> None:
    """Upstream's reopen: an open intent is sealed when the durable snapshot matches it."""
    wal = root / "v1" / "wal" / "session-store.ndjson"
    if not wal.is_file():
        return
    open_intents: dict[int, dict[str, Any]] = {}
    lines = wal.read_text(encoding="utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            _check_wal_entry(entry)
        except (ValueError, KeyError, TypeError) as error:
            where = f"{wal} line {number}"
            report.refused.append(
                (where, f"not a WAL entry ({error}); the WAL is set aside, files stand")
            )
            return
        if entry["phase"] == "intent":
            open_intents[entry["sequence"]] = entry
        else:
            open_intents.pop(entry["sequence"], None)
    durable = {doc.id: doc for doc in documents if doc.kind == "session"}
    for sequence, intent in sorted(open_intents.items()):
        session_id = intent["sessionId"]
        doc = durable.get(session_id)
        if (
            doc is not None
            and upstream_digest(SNAPSHOT_DOMAIN, doc.value) == intent["snapshotDigest"]
        ):
            report.recovery.append(
                f"intent {sequence} for {session_id!r}: sealed (the durable file matches)"
            )
        else:
            report.recovery.append(
                f"intent {sequence} for {session_id!r}: not sealed; the previous generation stands"
            )


def _check_wal_entry(entry: Any) -> None:
    if entry.get("schema") != WAL_SCHEMA:
        raise ValueError("unknown schema")
    if entry.get("phase") not in ("intent", "committed") or entry.get("sequence", 0) < 1:
        raise ValueError("bad phase or sequence")
    identity = {
        "schema": entry["schema"],
        "sequence": entry["sequence"],
        "session_id": entry["sessionId"],
        "snapshot_digest": entry["snapshotDigest"],
        "phase": entry["phase"],
        "recorded_at_ms": entry["recordedAtMs"],
    }
    if upstream_digest(WAL_ENTRY_DOMAIN, identity) != entry["entryDigest"]:
        raise ValueError("entryDigest does not match its contents")


def _stored(client: Client, doc: UpstreamDocument) -> Any:
    if doc.kind == "session":
        return client.load(doc.id)
    return client.checkpoint_get(doc.kind, doc.id)


def _write(client: Client, doc: UpstreamDocument, *, create_only: bool) -> None:
    if doc.kind == "session":
        if create_only:
            client.save(doc.value, expect=None)
        else:
            client.save(doc.value)
    else:
        client.checkpoint_put(doc.kind, doc.id, doc.value)


def import_store(
    client: Client,
    root: Path,
    *,
    key: bytes | None,
    dry_run: bool,
    overwrite: bool,
    progress: Callable[
        [Iterator[UpstreamDocument], int], Iterator[UpstreamDocument]
    ] = lambda items, _: items,
) -> Report:
    report = Report()
    if not root.is_dir():
        raise ImportProblem(root, "no such directory" if not root.exists() else "not a directory")
    if not (root / "v1").is_dir() and not any(root.glob("*.json")):
        raise ImportProblem(
            root, "not an a3s-code-core session store (no v1/ and no session files)"
        )
    documents = find_documents(root, key, report)
    apply_wal_recovery(root, documents, report)
    for doc in progress(iter(documents), len(documents)):
        what = f"{doc.kind} {doc.id!r} ({doc.path})"
        try:
            stored = _stored(client, doc)
            if stored is not None and _same(stored, doc.value):
                report.skipped.append(what)
                continue
            if stored is not None and not overwrite:
                report.changed.append(what)
                continue
            if not dry_run:
                _write(client, doc, create_only=stored is None)
            report.imported.append(what)
        except Conflict:
            report.changed.append(what)  # written meanwhile by someone else
        except SessionStoreError as error:
            report.refused.append((what, f"{error.code}: {error.message}"))
    return report


def _same(stored: Any, value: Any) -> bool:
    return json.dumps(stored, sort_keys=True, default=repr) == json.dumps(
        value, sort_keys=True, default=repr
    )


def tty_progress(items: Iterator[UpstreamDocument], total: int) -> Iterator[UpstreamDocument]:
    if not sys.stderr.isatty():
        return items
    from tqdm import tqdm

    return iter(tqdm(items, total=total, desc="importing", unit=" documents", file=sys.stderr))
