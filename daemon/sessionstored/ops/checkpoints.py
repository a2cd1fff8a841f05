# Keyed documents: loop and workflow checkpoints and free-form `kv` documents,
# one per (kind, key), overwritten whole; ranges of them read in key order
# (checkpoint_scan); and transactions over several of them (txn).
from __future__ import annotations

from typing import Any

import trio

from sessionstore.wire.canonical import digest_text
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import RawCBOR, Request, ok_response
from sessionstore.wire.shared import CanonicalItem, Refusal

from ..storage.documents import NEVER, Document, Entry, KeyRange
from ..storage.mutations import Put, Remove, Txn
from ..workers.offload import OFFLOAD_ABOVE_BYTES
from .args import (
    checkpoint_kind,
    expires_field,
    id_arg,
    lease_arg,
    prefix_arg,
    refresh_arg,
    ttl_arg,
)
from .context import OpContext
from .document_arguments import prepared_txn
from .prepare import checkpoint_document, prepare_checkpoint, prepare_txn
from .registry import Op
from .snapshot import is_int
from .steps import Read, ReadInThread, Response, Step

SCAN_DEFAULT_LIMIT = 100
SCAN_MAX_LIMIT = 1000
SCAN_REPLY_BYTES = 8 * 1024 * 1024  # values per reply; the rest is a `next` away
# A txn larger than this is read in a thread (steps.ReadInThread): reading 10,000 ops took
# 70 ms of the event loop, measured with py-spy in bench/loop_stall.py's 10,000 puts.
PREPARE_OFF_LOOP_BYTES = 64 * 1024
PREPARE_OFF_LOOP_OPS = 1000


def checkpoint_put(ops: OpContext, request: Request) -> Step:
    args = request.args
    kind, id_field = checkpoint_kind(args)
    key = id_arg(args, "key")
    document = checkpoint_document(
        args, id_field, key, ops.max_snapshot_bytes, request.canonical_hint
    )
    expires = ttl_arg(args) or NEVER
    put = Put(
        kind, key, document.body, document.digest, fence=lease_arg(args), expires_at_ms=expires
    )
    return ops.mutation(request, put, lambda o: ok_response(request, seq=o.seq))


def checkpoint_get(ops: OpContext, request: Request) -> Step:
    kind, _ = checkpoint_kind(request.args)
    key = id_arg(request.args, "key")
    read = ops.read_document(kind, key)
    refresh = refresh_arg(request.args)

    async def produce() -> Response:
        doc = await read()
        if doc is None:
            return ok_response(request, value=None)
        expires = doc.expires_at_ms
        if refresh is not None and expires and await ops.refresh_expiry(kind, [key], refresh()):
            expires = refresh.expires_at_ms
        return ok_response(request, value=RawCBOR(doc.body), **expires_field(expires))

    return Read(request, lambda: ops.guarded_read(request, produce))


def checkpoint_delete(ops: OpContext, request: Request) -> Step:
    kind, _ = checkpoint_kind(request.args)
    remove = Remove(kind, id_arg(request.args, "key"), fence=lease_arg(request.args))
    return ops.mutation(request, remove, lambda o: ok_response(request, deleted=o.existed))


def _optional_key(args: dict[str, Any], name: str) -> str | None:
    return None if args.get(name) is None else id_arg(args, name)


def _flag(args: dict[str, Any], name: str, default: bool) -> bool:
    value = args.get(name, default)
    if not isinstance(value, bool):
        raise Refusal(ErrorCode.BAD_REQUEST, f"{name} must be true or false")
    return value


def checkpoint_scan(ops: OpContext, request: Request) -> Step:
    args = request.args
    kind, _ = checkpoint_kind(args)
    prefix = prefix_arg(args)
    after, before = _optional_key(args, "after"), _optional_key(args, "before")
    limit = args.get("limit", SCAN_DEFAULT_LIMIT)
    if not is_int(limit) or not 1 <= limit <= SCAN_MAX_LIMIT:
        message = f"limit must be an integer from 1 to {SCAN_MAX_LIMIT}"
        raise Refusal(ErrorCode.BAD_REQUEST, message)
    reverse, values = _flag(args, "reverse", False), _flag(args, "values", True)
    refresh = refresh_arg(args)

    def read_values(found: list[tuple[str, Entry]]) -> list[dict[str, Any]]:
        docs = ops.store.reads.read_entries(kind, found)
        return [
            {**item_of(doc.id, doc), "value": RawCBOR(doc.body)} for doc in docs if doc is not None
        ]

    async def read() -> Response:
        wanted = KeyRange(kind, prefix, after, before, limit, reverse)
        found, more = await ops.query(ops.store.reads.scan, wanted)
        if values:
            total = 0
            for count, (_, entry) in enumerate(found):
                total += entry.size
                if total > SCAN_REPLY_BYTES and count > 0:
                    found, more = found[:count], True
                    break
            if ops.store.blocking_reads:
                items = await trio.to_thread.run_sync(read_values, found)
            elif total > OFFLOAD_ABOVE_BYTES:
                entries = [entry for _, entry in found]
                items = await ops.read_off_loop(entries, read_values, found)
            else:
                items = read_values(found)
        else:
            items = [item_of(key, entry) for key, entry in found]
        expiring = [item["key"] for item in items if "expires_at_ms" in item]
        if refresh is not None and expiring:
            refreshed = await ops.refresh_expiry(kind, expiring, refresh())
            for item in items:
                if item["key"] in refreshed:
                    item["expires_at_ms"] = refresh.expires_at_ms
        cursor = found[-1][0] if more and found else None
        return ok_response(request, items=items, next=cursor)

    return Read(request, lambda: ops.guarded_read(request, read))


def item_of(key: str, generation: Entry | Document) -> dict[str, Any]:
    digest, seq = digest_text(generation.digest), generation.seq
    return {"key": key, "seq": seq, "digest": digest, **expires_field(generation.expires_at_ms)}


def txn(ops: OpContext, request: Request) -> Step:
    raw = request.args.get("ops")
    if (isinstance(raw, CanonicalItem) and len(raw.data) > PREPARE_OFF_LOOP_BYTES) or (
        isinstance(raw, list) and len(raw) > PREPARE_OFF_LOOP_OPS
    ):
        return ReadInThread(request, lambda: ops.handled(request, lambda: _txn_step(ops, request)))
    return _txn_step(ops, request)


def _txn_step(ops: OpContext, request: Request) -> Step:
    prepared = prepared_txn(request.args, ops.max_snapshot_bytes, request.canonical_hint)
    mutation = Txn(prepared.requires, prepared.ops, fence=lease_arg(request.args))
    return ops.mutation(
        request,
        mutation,
        lambda o: ok_response(request, seq=o.seq, results=o.results),
    )


OPS = (
    Op(
        "checkpoint_put",
        checkpoint_put,
        {"kind", "key", "value", "lease", "ttl_s"},
        documents=frozenset({"value"}),
        prepare=prepare_checkpoint,
    ),
    Op(
        "checkpoint_get",
        checkpoint_get,
        {"kind", "key", "refresh_ttl_s"},
        read_only=True,
        writes_with=frozenset({"refresh_ttl_s"}),
    ),
    Op("checkpoint_delete", checkpoint_delete, {"kind", "key", "lease"}),
    Op(
        "checkpoint_scan",
        checkpoint_scan,
        {"kind", "prefix", "after", "before", "limit", "reverse", "values", "refresh_ttl_s"},
        read_only=True,
        writes_with=frozenset({"refresh_ttl_s"}),
    ),
    Op("txn", txn, {"require", "ops", "lease"}, documents=frozenset({"ops"}), prepare=prepare_txn),
)
