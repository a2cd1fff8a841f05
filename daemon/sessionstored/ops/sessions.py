# The session ops: whole snapshots in and out, conditional deletes, component
# updates and forks (both decided in the writer on the committed state).
from __future__ import annotations

from sessionstore.wire.canonical import digest_text
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import RawCBOR, Request, ok_response
from sessionstore.wire.shared import CanonicalItem, Refusal

from ..storage.documents import NEVER
from ..storage.generations import MAX_KEEP_GENERATIONS
from ..storage.mutations import SESSION, Outcome, Put, Remove, Rewrite
from .args import (
    at_arg,
    checkpoint_kind,
    expect_arg,
    expires_field,
    id_arg,
    lease_arg,
    prefix_arg,
    refresh_arg,
    rewritten_reply,
    ttl_arg,
)
from .context import OpContext, same_body
from .prepare import (
    Encoded,
    encoded_argument,
    forked_body,
    prepare_snapshot,
    snapshot_document,
    updated_body,
)
from .registry import Op
from .snapshot import UPDATABLE, is_int
from .steps import Read, Response, Step

LIST_DEFAULT_LIMIT = 1000
LIST_MAX_LIMIT = 10000
HISTORY_MAX_LIMIT = MAX_KEEP_GENERATIONS + 1  # the current generation and every earlier one


def save(ops: OpContext, request: Request) -> Step:
    document = snapshot_document(request.args, ops.max_snapshot_bytes, request.canonical_hint)
    assert document.session_id is not None
    put = Put(
        SESSION,
        document.session_id,
        document.body,
        document.digest,
        expect_arg(request.args),
        lease_arg(request.args),
        ttl_arg(request.args) or NEVER,
    )
    digest = digest_text(document.digest)
    return ops.mutation(request, put, lambda o: ok_response(request, digest=digest, seq=o.seq))


def load(ops: OpContext, request: Request) -> Step:
    session_id = id_arg(request.args, "session_id")
    at = at_arg(request.args)
    if at is not None:
        return _load_at(ops, request, session_id, at)
    read = ops.read_document(SESSION, session_id)
    refresh = refresh_arg(request.args)

    async def produce() -> Response:
        doc = await read()
        if doc is None:
            return ok_response(request, snapshot=None, digest=None, seq=None)
        expires = doc.expires_at_ms
        if refresh is not None and expires:
            refreshed = await ops.refresh_expiry(SESSION, [session_id], refresh())
            expires = refresh.expires_at_ms if refreshed else expires
        return ok_response(
            request,
            snapshot=RawCBOR(doc.body),
            digest=digest_text(doc.digest),
            seq=doc.seq,
            **expires_field(expires),
        )

    return Read(request, lambda: ops.guarded_read(request, produce))


def _load_at(ops: OpContext, request: Request, session_id: str, at: int) -> Step:
    if request.args.get("refresh_ttl_s") is not None:
        raise Refusal(ErrorCode.BAD_REQUEST, "refresh_ttl_s does not go with at")

    async def produce() -> Response:
        doc = await ops.read_at(SESSION, session_id, at)
        if doc is None:
            return ok_response(request, snapshot=None, digest=None, seq=None)
        return ok_response(
            request,
            snapshot=RawCBOR(doc.body),
            digest=digest_text(doc.digest),
            seq=doc.seq,
            committed_at_ms=doc.committed_at_ms or None,
        )

    return Read(request, lambda: ops.guarded_read(request, produce))


def history(ops: OpContext, request: Request) -> Step:
    """A session's generations kept, newest first (the current one, then the earlier
    ones --keep-generations keeps)."""
    session_id = id_arg(request.args, "session_id")
    limit = request.args.get("limit", HISTORY_MAX_LIMIT)
    if not is_int(limit) or not 1 <= limit <= HISTORY_MAX_LIMIT:
        raise Refusal(
            ErrorCode.BAD_REQUEST, f"limit must be an integer from 1 to {HISTORY_MAX_LIMIT}"
        )

    async def read() -> Response:
        entries = await ops.query(ops.store.reads.generations, SESSION, session_id)
        return ok_response(
            request,
            generations=[
                {
                    "seq": entry.seq,
                    "digest": digest_text(entry.digest),
                    "size": entry.size,
                    "committed_at_ms": entry.committed_at_ms or None,
                }
                for entry in entries[:limit]
            ],
        )

    return Read(request, lambda: ops.guarded_read(request, read))


def head(ops: OpContext, request: Request) -> Step:
    session_id = id_arg(request.args, "session_id")

    async def read() -> Response:
        entry = await ops.query(ops.store.reads.head, SESSION, session_id)
        if entry is None:
            return ok_response(request, found=False, digest=None, seq=None, size=None)
        return ok_response(
            request,
            found=True,
            digest=digest_text(entry.digest),
            seq=entry.seq,
            size=entry.size,
            **expires_field(entry.expires_at_ms),
        )

    return Read(request, lambda: ops.guarded_read(request, read))


def exists(ops: OpContext, request: Request) -> Step:
    session_id = id_arg(request.args, "session_id")

    async def read() -> Response:
        found = await ops.query(ops.store.reads.head, SESSION, session_id)
        return ok_response(request, exists=found is not None)

    return Read(request, lambda: ops.guarded_read(request, read))


def list_sessions(ops: OpContext, request: Request) -> Step:
    args = request.args
    prefix = prefix_arg(args)
    after = args.get("after")
    limit = args.get("limit", LIST_DEFAULT_LIMIT)
    if after is not None and not isinstance(after, str):
        raise Refusal(ErrorCode.BAD_REQUEST, "after must be text or null")
    if not is_int(limit) or not 1 <= limit <= LIST_MAX_LIMIT:
        raise Refusal(ErrorCode.BAD_REQUEST, f"limit must be an integer from 1 to {LIST_MAX_LIMIT}")

    async def read() -> Response:
        ids, cursor = await ops.query(ops.store.reads.list_sessions, prefix, after, limit)
        return ok_response(request, ids=ids, next=cursor)

    return Read(request, lambda: ops.guarded_read(request, read))


def delete(ops: OpContext, request: Request) -> Step:
    session_id = id_arg(request.args, "session_id")
    remove = Remove(SESSION, session_id, expect_arg(request.args), lease_arg(request.args))
    return ops.mutation(
        request, remove, lambda o: ok_response(request, deleted=o.existed, seq=o.seq)
    )


def update(ops: OpContext, request: Request) -> Step:
    args = request.args
    session_id = id_arg(args, "session_id")
    component = args.get("component")
    if component not in UPDATABLE:
        raise Refusal(ErrorCode.BAD_REQUEST, f"component must be one of {', '.join(UPDATABLE)}")
    if "value" not in args:
        raise Refusal(ErrorCode.BAD_REQUEST, "value is missing")
    value = args["value"]
    limit = ops.max_snapshot_bytes
    value_size = len(value.data) if isinstance(value, Encoded | CanonicalItem) else 0

    def apply(current: bytes | None, _source: bytes | None) -> bytes:
        size = len(current or b"") + value_size
        return ops.heavy(size, updated_body, current, session_id, component, value, limit)

    rewrite = Rewrite(
        SESSION,
        session_id,
        apply,
        expect_arg(args),
        lease_arg(args),
        expires_at_ms=ttl_arg(args),  # None keeps the current
    )
    return ops.mutation(
        request,
        rewrite,
        rewritten_reply(request),
    )


def revert(ops: OpContext, request: Request) -> Step:
    """The generation that was current at `at`, written back as a new generation (a
    new seq, its old digest), under `expect` and the lease fence like `save`."""
    args = request.args
    session_id = id_arg(args, "session_id")
    at = at_arg(args)
    if at is None:
        raise Refusal(ErrorCode.BAD_REQUEST, "at is missing")

    def apply(_current: bytes | None, earlier: bytes | None) -> bytes:
        if earlier is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"no session {session_id!r}")
        return earlier

    rewrite = Rewrite(
        SESSION,
        session_id,
        apply,
        expect_arg(args),
        lease_arg(args),
        source=(SESSION, session_id),
        source_at=at,
        expires_at_ms=ttl_arg(args),  # None keeps the current
    )
    return ops.mutation(request, rewrite, rewritten_reply(request))


def fork(ops: OpContext, request: Request) -> Step:
    args = request.args
    source_id = id_arg(args, "session_id")
    new_id = id_arg(args, "new_session_id")
    if "workspace" not in args:
        raise Refusal(ErrorCode.BAD_REQUEST, "workspace is missing")
    workspace = args["workspace"]
    at = at_arg(args)

    def apply(_current: bytes | None, source: bytes | None) -> bytes:
        if source is None:
            raise Refusal(ErrorCode.NOT_FOUND, f"no session {source_id!r}")
        return ops.heavy(len(source), forked_body, source, new_id, workspace)

    rewrite = Rewrite(
        SESSION,
        new_id,
        apply,
        expect=None,
        fence=lease_arg(args),
        source=(SESSION, source_id),
        source_at=at,
        expires_at_ms=ttl_arg(args) or NEVER,
    )
    return ops.mutation(
        request,
        rewrite,
        rewritten_reply(request),
    )


def expire(ops: OpContext, request: Request) -> Step:
    """Redis's EXPIRE and PERSIST: a session's, or with kind and key a keyed document's,
    generation written again with a new expiry (ttl_s seconds from now; null: none)."""
    args = request.args
    if "session_id" in args:
        if "kind" in args or "key" in args:
            raise Refusal(ErrorCode.BAD_REQUEST, "give session_id, or kind and key, not both")
        kind, doc_id = SESSION, id_arg(args, "session_id")
    else:
        kind, doc_id = checkpoint_kind(args)[0], id_arg(args, "key")
    if "ttl_s" not in args:
        raise Refusal(ErrorCode.BAD_REQUEST, "ttl_s is missing (null removes the expiry)")
    expires = ttl_arg(args) or NEVER

    rewrite = Rewrite(kind, doc_id, same_body, fence=lease_arg(args), expires_at_ms=expires)

    def reply(outcome: Outcome) -> Response:
        if not outcome.changed:
            return ok_response(request, found=False, seq=outcome.seq)
        return ok_response(request, found=True, seq=outcome.seq, **expires_field(expires))

    return ops.mutation(request, rewrite, reply)


OPS = (
    Op(
        "save",
        save,
        {"snapshot", "expect", "lease", "ttl_s"},
        documents=frozenset({"snapshot"}),
        prepare=prepare_snapshot,
    ),
    Op(
        "load",
        load,
        {"session_id", "refresh_ttl_s", "at"},
        read_only=True,
        writes_with=frozenset({"refresh_ttl_s"}),
    ),
    Op("head", head, {"session_id"}, read_only=True),
    Op("history", history, {"session_id", "limit"}, read_only=True),
    Op("revert", revert, {"session_id", "at", "expect", "lease", "ttl_s"}),
    Op("exists", exists, {"session_id"}, read_only=True),
    Op("list", list_sessions, {"prefix", "after", "limit"}, read_only=True),
    Op("delete", delete, {"session_id", "expect", "lease"}),
    Op("expire", expire, {"session_id", "kind", "key", "ttl_s", "lease"}),
    Op(
        "update",
        update,
        {"session_id", "component", "value", "expect", "lease", "ttl_s"},
        documents=frozenset({"value"}),
        prepare=encoded_argument("value"),
    ),
    Op(
        "fork",
        fork,
        {"session_id", "new_session_id", "workspace", "lease", "ttl_s", "at"},
        prepare=encoded_argument("workspace"),
    ),
)
