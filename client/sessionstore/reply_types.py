# What each op method returns, as the daemon sends it (docs/protocol.md, "Ops"), so
# that an editor and mypy know that `save` gives `digest` and `seq`. A test runs every
# op on both engines and holds each reply to its type here.
# (no `from __future__ import annotations`: TypedDict reads NotRequired at run time)
from typing import Any, NotRequired, TypedDict


class HelloReply(TypedDict):
    protocol: int
    server: str
    capabilities: dict[str, bool]
    limits: dict[str, int]
    cbor_helper: str
    build: str


class Written(TypedDict):
    """save, update, fork, revert: the new generation's digest and the change's seq."""

    digest: str
    seq: int


class Loaded(TypedDict):
    """load_with_meta; a missing session has None for all three."""

    snapshot: dict[str, Any] | None
    digest: str | None
    seq: int | None
    expires_at_ms: NotRequired[int]
    committed_at_ms: NotRequired[int]  # with at


class Generation(TypedDict):
    seq: int
    digest: str
    size: int
    committed_at_ms: int


class Head(TypedDict):
    found: bool
    digest: str | None
    seq: int | None
    size: int | None  # bytes of the stored canonical form
    expires_at_ms: NotRequired[int]


class IdPage(TypedDict):
    ids: list[str]
    next: str | None  # pass as `after`; None at the end


class Deleted(TypedDict):
    deleted: bool
    seq: int


class CheckpointPut(TypedDict):
    seq: int


class Expiry(TypedDict):
    found: bool
    seq: int
    expires_at_ms: NotRequired[int]


class KeyedDocument(TypedDict):
    key: str
    seq: int
    digest: str
    value: NotRequired[dict[str, Any]]  # unless values=False
    expires_at_ms: NotRequired[int]


class KeyPage(TypedDict):
    items: list[KeyedDocument]
    next: str | None


class Ranked(TypedDict):
    key: str
    score: float


class Ranking(TypedDict):
    items: list[Ranked]
    ranked: int
    scanned: int


class TxnResult(TypedDict):
    seq: int
    results: list[dict[str, Any]]  # per op: {written}, {deleted} or {key}


class Lease(TypedDict):
    holder: str
    epoch: int
    acquired_at_ms: int


class Stats(TypedDict):
    """The fields every engine reports; each engine adds its own (read those with
    .get(), or call("stats") for a plain dict)."""

    sessions: int
    seq: int
    wal_bytes: int
    uptime_s: float
    connections: int
    recovery: dict[str, Any]
    internal_errors: int
    cbor_helper: str
    build: str
    keep_generations: int
    requests: dict[str, Any]


class Verified(TypedDict):
    checked: int
    problems: list[dict[str, Any]]


class Compaction(TypedDict):
    seq: int
    wal_bytes_before: int
    wal_bytes_after: int
    segments_replaced: NotRequired[int]


# A session's snapshot document: a map with schema_version (1), session (a map with a
# non-empty text id) and, optionally, the component arrays (artifacts, trace_events,
# run_records, ...); anything else is stored as given (docs/protocol.md, "The snapshot
# document"), so it is a map of text keys, not a closed TypedDict.
Snapshot = dict[str, Any]


class WatchEvent(TypedDict):
    """One durable change, as watch() yields it, in seq order. event: "commit" (a session
    saved: session_id, digest), "delete" (session_id), "checkpoint" (kind, key, deleted),
    "lease", or "change" (kind). expired: the expiry sweep removed it."""

    event: str
    seq: int
    committed_at_ms: int
    session_id: NotRequired[str]
    digest: NotRequired[str]
    kind: NotRequired[str]
    key: NotRequired[str]
    deleted: NotRequired[bool]
    expired: NotRequired[bool]
