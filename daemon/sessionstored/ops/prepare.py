# The CPU-heavy steps of a request, as plain functions of bytes and small values,
# so that the daemon runs them inline for ordinary requests and in a worker
# process (offload.py) for large ones: decoding a large item, checking a
# snapshot, encoding it canonically and hashing it; rebuilding a large snapshot
# for `update` and `fork` (a large JSON reply is protocol.encode in a worker). cbor2 holds the GIL
# for the whole of a call (measured: 2.7 s for one canonical encode of a 4 MB
# array of 1,000,000 small maps), so a thread would not keep the event loop
# free; a process does.
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import cbor2

from sessionstore.wire import cbor_bytes
from sessionstore.wire.byte_path import MAP, major_type
from sessionstore.wire.canonical import Hint, canonical_dumps, digest_bytes_of_canonical
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import Connection, Mode, Request, parse_request
from sessionstore.wire.shared import CanonicalItem, Refusal
from sessionstore.wire.value_class import value_class

from .document_arguments import DOCUMENT_KINDS, PreparedTxn, document_body, prepared_txn
from .snapshot import (
    forked,
    forked_bytes,
    invalid_snapshot,
    validate_snapshot,
    validate_snapshot_bytes,
    with_component,
    with_component_bytes,
)


@value_class
class ReadyDocument:
    """A document ready to store: its canonical bytes and their digest."""

    body: bytes
    digest: bytes
    session_id: str | None = None


@value_class
class Encoded:
    """An argument value carried as its CBOR encoding (decoded where it is used)."""

    data: bytes


def encode_document(document: Any, *, hint: Hint = Hint.NONE) -> bytes:
    try:
        return canonical_dumps(document, hint=hint)
    except (ValueError, TypeError, OverflowError) as error:
        raise invalid_snapshot(f"cannot encode: {error}") from None


def snapshot_document(args: dict[str, Any], max_snapshot_bytes: int, hint: Hint) -> ReadyDocument:
    """The `snapshot` argument of a save, checked, canonical and hashed."""
    if "snapshot" not in args:
        raise Refusal(ErrorCode.BAD_REQUEST, "snapshot is missing")
    snapshot = args["snapshot"]
    if isinstance(snapshot, ReadyDocument):
        return snapshot  # prepared in a worker already
    if isinstance(snapshot, CanonicalItem):
        if major_type(snapshot.data) != MAP:
            raise Refusal(ErrorCode.BAD_REQUEST, "snapshot must be a map")
        session_id = validate_snapshot_bytes(snapshot.data)
        body = snapshot.data
    elif not isinstance(snapshot, dict):
        raise Refusal(ErrorCode.BAD_REQUEST, "snapshot must be a map")
    else:
        session_id = validate_snapshot(snapshot)
        body = encode_document(snapshot, hint=hint)
    if len(body) > max_snapshot_bytes:
        raise Refusal(
            ErrorCode.TOO_LARGE,
            f"snapshot is {len(body)} bytes, over max_snapshot_bytes={max_snapshot_bytes}",
        )
    return ReadyDocument(body, digest_bytes_of_canonical(body), session_id)


def checkpoint_document(
    args: dict[str, Any],
    id_field: str | None,
    key: str,
    max_snapshot_bytes: int,
    hint: Hint = Hint.NONE,
) -> ReadyDocument:
    """The `value` argument of checkpoint_put, checked, canonical and hashed."""
    value = args.get("value")
    if isinstance(value, ReadyDocument):
        return value
    body, digest = document_body(value, id_field, key, max_snapshot_bytes, hint)
    return ReadyDocument(body, digest)


def decoded(value: Any) -> Any:
    return cbor2.loads(value.data) if isinstance(value, Encoded) else value


def updated_body(
    current: bytes | None, session_id: str, component: str, value: Any, max_snapshot_bytes: int
) -> bytes:
    """The stored snapshot after `update`, canonical; Refusal when it cannot be. Where the
    compiled helper runs, spliced: the current snapshot is not decoded."""
    try:
        if cbor_bytes.compiled:
            body = with_component_bytes(current, session_id, component, _canonical(value))
        else:
            document = with_component(
                cbor2.loads(current) if current is not None else None,
                session_id,
                component,
                decoded(value),
            )
            body = encode_document(document)
    except LookupError:
        raise Refusal(ErrorCode.NOT_FOUND, f"no session {session_id!r}") from None
    if len(body) > max_snapshot_bytes:
        raise Refusal(ErrorCode.TOO_LARGE, f"the updated snapshot is {len(body)} bytes")
    return body


def _canonical(value: Any) -> bytes:
    if isinstance(value, CanonicalItem):
        return value.data
    return encode_document(decoded(value))


def forked_body(source: bytes, new_id: str, workspace: Any) -> bytes:
    if cbor_bytes.compiled:
        return forked_bytes(source, new_id, decoded(workspace))
    return encode_document(forked(cbor2.loads(source), new_id, decoded(workspace)))


# -- a large request, whole, in a worker ------------------------------------------

# The heavy part of an op's arguments, done to them in place (in a worker process for a
# large item): each op names its own in the registry (ops/registry.py).
Preparer = Callable[[dict[str, Any], int, Hint], None]


def prepare_snapshot(args: dict[str, Any], max_snapshot_bytes: int, hint: Hint) -> None:
    args["snapshot"] = snapshot_document(args, max_snapshot_bytes, hint)


def prepare_checkpoint(args: dict[str, Any], max_snapshot_bytes: int, hint: Hint) -> None:
    if args.get("kind") not in DOCUMENT_KINDS or not isinstance(args.get("key"), str):
        return  # the op refuses it, with the reason
    _, id_field = DOCUMENT_KINDS[args["kind"]]
    args["value"] = checkpoint_document(args, id_field, args["key"], max_snapshot_bytes, hint)


def prepare_txn(args: dict[str, Any], max_snapshot_bytes: int, hint: Hint) -> None:
    args["ops"] = prepared_txn(args, max_snapshot_bytes, hint)
    args.pop("require", None)  # inside the prepared ops


def encoded_argument(name: str) -> Preparer:
    """A value decoded only where it is used (update's value, fork's workspace): kept
    as its CBOR encoding, so no large object tree crosses between processes."""
    return functools.partial(_encode_argument, name)


def _encode_argument(name: str, args: dict[str, Any], _limit: int, _hint: Hint) -> None:
    if name in args and not isinstance(args[name], CanonicalItem):
        args[name] = Encoded(cbor2.dumps(args[name]))


def prepare_large(
    data: bytes,
    mode: Mode,
    *,
    max_request_bytes: int,
    max_snapshot_bytes: int,
    small_argument_bytes: int,
    arguments: Mapping[str, frozenset[str]],
    documents: Mapping[str, frozenset[str]],
    preparers: Mapping[str, Preparer],
) -> Request | Refusal:
    """Decode one large item and do the heavy part of its op. What comes back is small
    or bytes: the caller's process never builds the large value's objects. arguments:
    what each op reads, preparers: the heavy part of those that have one (both from the
    ops registry); any other key of the request is dropped."""
    decoded = _decode_one(data, mode, max_request_bytes, documents)
    if isinstance(decoded, Refusal):
        return decoded
    request = decoded
    args = dict(request.args)
    try:
        prepare = preparers.get(request.op)
        if prepare is not None:
            prepare(args, max_snapshot_bytes, request.canonical_hint)
    except Refusal as refusal:
        return refusal
    except MemoryError:
        return Refusal(ErrorCode.TOO_LARGE, "the request needs more memory than allowed")
    return _small_reply(request, args, arguments, small_argument_bytes)


def _decode_one(
    data: bytes, mode: Mode, max_request_bytes: int, documents: Mapping[str, frozenset[str]]
) -> Request | Refusal:
    conn = Connection(
        max_message_bytes=max_request_bytes,
        mode=mode,
        received="request",
        order_maps=True,
        documents=documents,
    )
    conn.receive_data(data)
    conn.receive_eof()
    try:
        return parse_request(conn.next_message(), canonical_hint=conn.last_hint)
    except Refusal as refusal:
        return refusal
    except MemoryError:
        return Refusal(ErrorCode.TOO_LARGE, "the request needs more memory to decode than allowed")


def _small_reply(
    request: Request,
    args: dict[str, Any],
    arguments: Mapping[str, frozenset[str]],
    small_argument_bytes: int,
) -> Request | Refusal:
    """Only what the op reads goes back, and only small values or prepared bytes, so the
    daemon's process unpickles no large object tree."""
    read = arguments.get(request.op, frozenset()) | {"op", "rid"}
    kept = {name: value for name, value in args.items() if name in read}
    oversized = [
        name
        for name, value in kept.items()
        if not isinstance(value, ReadyDocument | Encoded | PreparedTxn | CanonicalItem)
        and len(cbor2.dumps(value)) > small_argument_bytes
    ]
    if oversized:
        message = f"{', '.join(sorted(oversized))} too large for {request.op}"
        return Refusal(ErrorCode.BAD_REQUEST, message)
    return Request(request.op, kept, request.rid, request.has_rid, Hint.NONE)
