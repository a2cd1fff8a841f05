# A transaction: several document changes that commit together or not at all,
# guarded by requirements on the committed state (etcd's txn, without the else
# branch). It is decided in the writer like a Rewrite, against the committed
# state and in commit order, and its changes take consecutive seqs in one
# batch, so recovery applies all of them or none (the batch's commit record).
#
# Its ops: put (optionally only where the key is absent), delete, delete every
# key under a prefix, and append: a put under `prefix + the change's own seq`
# (20 digits), which orders appends from every client in commit order with no
# coordination among them.
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sessionstore.wire.canonical import digest_text
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal
from sessionstore.wire.value_class import value_class

from .documents import NEVER, Entry, KeyRange, RangeReader

MAX_TXN_CHANGES = 100_000  # removals a delete_prefix may expand to, with the rest
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


def decide(
    requires: tuple[Require, ...], ops: tuple[TxnOp, ...], index: RangeReader, first_seq: int
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
        if isinstance(op, TxnPut):  # only an insert-if-absent asks what is stored
            if op.if_absent and index.get(op.kind, op.id) is not None:
                results.append({"written": False})
                continue
            change(op.kind, op.id, op.body, op.digest, op.expires_at_ms)
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
