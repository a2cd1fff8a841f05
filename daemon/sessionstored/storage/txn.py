# A transaction: several document changes that commit together or not at all,
# guarded by requirements on the committed state (etcd's txn, without the else
# branch). It is decided in the writer like a Rewrite, against the committed
# state and in commit order, and its changes take consecutive seqs in one
# batch, so recovery applies all of them or none (the batch's commit record).
#
# Its ops: put (optionally only where the key is absent, or keeping named fields
# of the stored map, read as the txn is decided), delete, delete every key under
# a prefix, and append: a put under `prefix + the change's own seq`
# (20 digits), which orders appends from every client in commit order with no
# coordination among them.
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import cbor2

from sessionstore.wire.canonical import canonical_dumps, digest_bytes_of_canonical, digest_text
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal
from sessionstore.wire.value_class import value_class

from .documents import NEVER, Entry, KeyRange, RangeReader

MAX_TXN_CHANGES = 100_000  # removals a delete_prefix may expand to, with the rest
MAX_KEPT_FIELDS = 16  # names a put's `keep` may give
APPEND_SEQ_DIGITS = 20  # the width of a seq in an appended key: 2**64 has 20 digits


@value_class
class Require:
    kind: str
    id: str
    exists: bool | None = None  # True: must exist; False: must not
    digest: bytes | None = None  # must be this generation


@value_class
class TxnPut:
    kind: str
    id: str
    body: bytes
    digest: bytes
    if_absent: bool = False  # keep the stored one, if any (an idempotent insert)
    expires_at_ms: int = NEVER
    # top-level fields of the stored map that the new one takes as they are (an item's
    # created_at): the body and digest above are the put's as sent
    keep: tuple[str, ...] = ()


@value_class
class TxnDelete:
    kind: str
    id: str


@value_class
class TxnDeletePrefix:
    kind: str
    prefix: str


@value_class
class TxnAppend:
    kind: str
    prefix: str
    body: bytes
    digest: bytes
    expires_at_ms: int = NEVER


TxnOp = TxnPut | TxnDelete | TxnDeletePrefix | TxnAppend


@value_class
class Change:
    """One concrete document change of a decided transaction."""

    kind: str
    id: str
    body: bytes | None  # None: a removal
    digest: bytes | None
    expires_at_ms: int = NEVER


def appended_key(prefix: str, seq: int) -> str:
    return f"{prefix}{seq:0{APPEND_SEQ_DIGITS}d}"


def txn_body_bytes(ops: tuple[TxnOp, ...]) -> int:
    return sum(len(op.body) for op in ops if isinstance(op, TxnPut | TxnAppend))


def check_requires(requires: tuple[Require, ...], get: Callable[[str, str], Entry | None]) -> None:
    for number, require in enumerate(requires):
        entry = get(require.kind, require.id)
        if require.exists is True and entry is None:
            problem = "does not exist"
        elif require.exists is False and entry is not None:
            problem = "exists"
        elif require.digest is not None and (entry is None or entry.digest != require.digest):
            problem = "is not the required generation"
        else:
            continue
        raise Refusal(
            ErrorCode.CONFLICT,
            f"requirement {number} not met: {require.id!r} {problem}",
            failed=number,
            current=digest_text(entry.digest) if entry else None,
        )


class TxnReader(RangeReader, Protocol):
    """What deciding a txn reads: the committed state, bodies for a put's `keep`."""

    max_document_bytes: int

    def body(self, kind: str, doc_id: str) -> bytes | None: ...


def with_kept_fields(put: TxnPut, stored: bytes | None, limit: int) -> tuple[bytes, bytes]:
    """The put's body and digest once it takes its `keep` fields from the stored map
    (unchanged when none is stored, or it has none of them). Refusal: too_large."""
    if stored is None:
        return put.body, put.digest
    before = cbor2.loads(stored)  # every document, stored or put, is a map (document_body)
    kept = {name: before[name] for name in put.keep if name in before}
    if not kept:
        return put.body, put.digest
    value = cbor2.loads(put.body)
    value.update(kept)
    body = canonical_dumps(value)
    if len(body) > limit:
        message = f"{put.id!r} with its kept fields is {len(body)} bytes, over {limit}"
        raise Refusal(ErrorCode.TOO_LARGE, message)
    return body, digest_bytes_of_canonical(body)


def decide(
    requires: tuple[Require, ...], ops: tuple[TxnOp, ...], index: TxnReader, first_seq: int
) -> tuple[list[Change], list[dict[str, Any]]]:
    """The changes a transaction makes now (first_seq is the seq its first one
    takes) and each op's result, or Refusal. Nothing is applied here."""
    named = [(op.kind, op.id) for op in ops if isinstance(op, TxnPut | TxnDelete)]
    if len(set(named)) < len(named):
        raise Refusal(ErrorCode.BAD_REQUEST, "the txn names one key twice")
    check_requires(requires, index.get)
    changes: list[Change] = []
    results: list[dict[str, Any]] = []
    touched: set[tuple[str, str]] = set()

    def change(
        kind: str, doc_id: str, body: bytes | None, digest: bytes | None, expires: int = NEVER
    ) -> None:
        if (kind, doc_id) in touched:
            raise Refusal(ErrorCode.BAD_REQUEST, f"the txn changes {doc_id!r} twice")
        if len(changes) >= MAX_TXN_CHANGES:
            message = f"the txn makes over {MAX_TXN_CHANGES} changes; split it"
            raise Refusal(ErrorCode.TOO_LARGE, message)
        touched.add((kind, doc_id))
        changes.append(Change(kind, doc_id, body, digest, expires))

    for op in ops:
        if isinstance(op, TxnPut):  # only if_absent and keep ask what is stored
            if op.if_absent and index.get(op.kind, op.id) is not None:
                results.append({"written": False})
                continue
            body, digest = op.body, op.digest
            if op.keep:
                stored = index.body(op.kind, op.id)
                body, digest = with_kept_fields(op, stored, index.max_document_bytes)
            change(op.kind, op.id, body, digest, op.expires_at_ms)
            results.append({"written": True})
        elif isinstance(op, TxnDelete):
            present = index.get(op.kind, op.id) is not None
            if present:
                change(op.kind, op.id, None, None)
            results.append({"deleted": present})
        elif isinstance(op, TxnDeletePrefix):
            found, _ = index.scan(KeyRange(op.kind, op.prefix, limit=MAX_TXN_CHANGES + 1))
            for doc_id, _entry in found:
                change(op.kind, doc_id, None, None)
            results.append({"deleted": len(found)})
        else:
            key = appended_key(op.prefix, first_seq + len(changes))
            change(op.kind, key, op.body, op.digest, op.expires_at_ms)
            results.append({"key": key})
    return changes, results
