# The snapshot document rules of the wire contract ("invalid_snapshot when ...")
# and the id rules shared by every op that names a session. The rules read a
# decoded snapshot, or one kept as its canonical bytes (validate_snapshot_bytes):
# then only the parts they read are decoded, and the same rules give the same
# messages.
from __future__ import annotations

from typing import Any, TypeGuard

import cbor2

from sessionstore.wire import cbor_bytes
from sessionstore.wire.byte_path import (
    ARRAY,
    MAP,
    decode_span,
    major_type,
    map_fields,
    raw_entries,
    raw_map,
)
from sessionstore.wire.canonical import canonical_dumps
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal

SCHEMA_VERSION = 1
MAX_ID_BYTES = 1024
COMPONENTS = (
    "artifacts",
    "retained_artifact_uris",
    "trace_events",
    "run_records",
    "verification_reports",
    "subagent_tasks",
)


def invalid_snapshot(message: str) -> Refusal:
    """A snapshot that breaks the document rules above."""
    return Refusal(ErrorCode.INVALID_SNAPSHOT, message)


def id_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return "must be non-empty text"
    if "\0" in value:
        return "must not contain NUL"
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid UTF-8 text"
    if len(encoded) > MAX_ID_BYTES:
        return f"must be at most {MAX_ID_BYTES} UTF-8 bytes"
    return None


def is_int(value: Any) -> TypeGuard[int]:
    """An integer as the wire has it: Python's bool is an int, a CBOR true is not."""
    return isinstance(value, int) and not isinstance(value, bool)


def validate_component(name: str, value: Any, session_id: str) -> None:
    if not isinstance(value, list):
        raise invalid_snapshot(f"{name} must be an array")
    if name == "retained_artifact_uris":
        if not all(isinstance(uri, str) for uri in value):
            raise invalid_snapshot("retained_artifact_uris must hold text only")
    elif name == "run_records":
        _validate_run_records(value, session_id)
    elif name == "subagent_tasks":
        for position, task in enumerate(value):
            if not isinstance(task, dict):
                raise invalid_snapshot(f"subagent_tasks[{position}] must be a map")
            parent = task.get("parent_session_id")
            if parent not in (None, "") and parent != session_id:
                raise invalid_snapshot(
                    f"subagent_tasks[{position}].parent_session_id {parent!r} is not session.id"
                )


def _validate_run_records(records: list[Any], session_id: str) -> None:
    seen_ids: set[Any] = set()
    for position, record in enumerate(records):
        where = f"run_records[{position}]"
        if not isinstance(record, dict):
            raise invalid_snapshot(f"{where} must be a map")
        snapshot = record.get("snapshot")
        if not isinstance(snapshot, dict):
            raise invalid_snapshot(f"{where}.snapshot must be a map")
        if "session_id" in snapshot and snapshot["session_id"] != session_id:
            raise invalid_snapshot(f"{where}.snapshot.session_id is not session.id")
        run_id = snapshot.get("id")
        if run_id is not None:
            if not isinstance(run_id, (str, int, bytes)):
                raise invalid_snapshot(f"{where}.snapshot.id must be text")
            if run_id in seen_ids:
                raise invalid_snapshot(f"{where}.snapshot.id {run_id!r} appears twice")
            seen_ids.add(run_id)
        events = record.get("events", [])
        if not isinstance(events, list):
            raise invalid_snapshot(f"{where}.events must be an array")
        largest = -1
        for event_position, event in enumerate(events):
            sequence = event.get("sequence") if isinstance(event, dict) else None
            if not is_int(sequence):
                raise invalid_snapshot(
                    f"{where}.events[{event_position}].sequence must be an integer"
                )
            if sequence <= largest:
                raise invalid_snapshot(f"{where}.events[].sequence is not strictly increasing")
            largest = sequence
        event_count = snapshot.get("event_count")
        if event_count is not None:
            if not is_int(event_count):
                raise invalid_snapshot(f"{where}.snapshot.event_count must be an integer")
            if event_count < largest + 1:
                raise invalid_snapshot(
                    f"{where}.snapshot.event_count {event_count} is below the largest "
                    f"retained sequence + 1 ({largest + 1})"
                )


def validate_session(session: Any) -> str:
    if not isinstance(session, dict):
        raise invalid_snapshot("session must be a map")
    problem = id_problem(session.get("id"))
    if problem:
        raise invalid_snapshot(f"session.id {problem}")
    session_id: str = session["id"]
    return session_id


def validate_snapshot(snapshot: Any) -> str:
    """Check a whole snapshot; return its session id."""
    if not isinstance(snapshot, dict):
        raise invalid_snapshot("snapshot must be a map")
    version = snapshot.get("schema_version")
    if not is_int(version) or version != SCHEMA_VERSION:
        raise invalid_snapshot(f"schema_version must be {SCHEMA_VERSION}, got {version!r}")
    if "session" not in snapshot:
        raise invalid_snapshot("session is missing")
    session_id = validate_session(snapshot["session"])
    for name in COMPONENTS:
        if name in snapshot:
            validate_component(name, snapshot[name], session_id)
    return session_id


# components whose rule is "must be an array" alone: their bytes are never decoded
_ARRAYS_ONLY = frozenset({"artifacts", "trace_events", "verification_reports"})


def validate_snapshot_bytes(data: bytes) -> str:
    """validate_snapshot for the canonical bytes of a map (a CanonicalItem's). The
    usual snapshot is read by the compiled helper in one pass (every rule holds, no
    run records); any other is read here, and a broken rule named."""
    outline = cbor_bytes.snapshot_outline(data)
    if outline is not None:
        try:
            return data[outline[0] : outline[1]].decode()
        except UnicodeDecodeError:  # bytes not walked as canonical: the rules below say
            pass
    fields = map_fields(data)
    version = decode_span(data, fields["schema_version"]) if "schema_version" in fields else None
    if not is_int(version) or version != SCHEMA_VERSION:
        raise invalid_snapshot(f"schema_version must be {SCHEMA_VERSION}, got {version!r}")
    if "session" not in fields:
        raise invalid_snapshot("session is missing")
    session_at, session_end = fields["session"]
    if major_type(data, session_at) != MAP:
        raise invalid_snapshot("session must be a map")
    id_span = map_fields(data, session_at, session_end).get("id")
    session_id = decode_span(data, id_span) if id_span else None
    problem = id_problem(session_id)
    if problem:
        raise invalid_snapshot(f"session.id {problem}")
    assert isinstance(session_id, str)
    for name in COMPONENTS:
        if name not in fields:
            continue
        span = fields[name]
        if name in _ARRAYS_ONLY:
            if major_type(data, span[0]) != ARRAY:
                raise invalid_snapshot(f"{name} must be an array")
        else:
            validate_component(name, decode_span(data, span), session_id)
    return session_id


UPDATABLE = ("session", *COMPONENTS)


def with_component(
    current: dict[str, Any] | None, session_id: str, component: str, value: Any
) -> dict[str, Any]:
    """The snapshot after `update`; raises the invalid_snapshot refusal, or LookupError
    when it is missing."""
    if current is None:
        if component != "session":
            raise LookupError(session_id)
        document: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
    else:
        document = dict(current)
    document[component] = value
    if component == "session" and isinstance(value, dict) and value.get("id") != session_id:
        raise invalid_snapshot(f"session.id {value.get('id')!r} is not the session being updated")
    validate_snapshot(document)
    return document


def forked(source: dict[str, Any], new_id: Any, workspace: Any) -> dict[str, Any]:
    """A copy of source owned by new_id: session.id, config.workspace, run and subagent owners."""
    document = dict(source)
    session = dict(document.get("session") or {})
    old_id = session.get("id")
    session["id"] = new_id
    config = session.get("config")
    session["config"] = {**(config if isinstance(config, dict) else {}), "workspace": workspace}
    document["session"] = session
    if isinstance(document.get("run_records"), list):
        document["run_records"] = [
            {**record, "snapshot": {**record["snapshot"], "session_id": new_id}}
            if isinstance(record, dict) and isinstance(record.get("snapshot"), dict)
            else record
            for record in document["run_records"]
        ]
    if isinstance(document.get("subagent_tasks"), list):
        document["subagent_tasks"] = [
            {**task, "parent_session_id": new_id}
            if isinstance(task, dict) and task.get("parent_session_id") not in (None, "")
            else task
            for task in document["subagent_tasks"]
        ]
    if old_id == new_id:
        raise invalid_snapshot("new_session_id is the source session")
    validate_snapshot(document)
    return document


# -- update and fork on bytes: the parts they change decoded, the rest spliced ------


def with_component_bytes(
    current: bytes | None, session_id: str, component: str, value: bytes
) -> bytes:
    """with_component on canonical bytes (value: the component's canonical bytes), encoded."""
    if current is None:
        if component != "session":
            raise LookupError(session_id)
        entries = {cbor2.dumps("schema_version"): cbor2.dumps(SCHEMA_VERSION)}
    else:
        entries = raw_entries(current)
    entries[cbor2.dumps(component)] = value
    if component == "session" and major_type(value) == MAP:
        id_span = map_fields(value).get("id")
        found = decode_span(value, id_span) if id_span else None
        if found != session_id:
            raise invalid_snapshot(f"session.id {found!r} is not the session being updated")
    document = raw_map(entries)
    validate_snapshot_bytes(document)
    return document


_FORK_CHANGES = ("session", "run_records", "subagent_tasks")


def forked_bytes(source: bytes, new_id: Any, workspace: Any) -> bytes:
    """forked on the canonical bytes of a stored (so valid) snapshot, encoded: only the
    parts a fork changes are decoded and checked again."""
    entries = raw_entries(source)
    read = ("schema_version", *_FORK_CHANGES)
    keys = {name: cbor2.dumps(name) for name in read}
    partial = {name: cbor2.loads(entries[key]) for name, key in keys.items() if key in entries}
    document = forked(partial, new_id, workspace)
    for name in _FORK_CHANGES:
        if name in document:
            entries[keys[name]] = canonical_dumps(document[name])
    return raw_map(entries)
