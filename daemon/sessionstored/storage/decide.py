# Deciding a batch against the committed state, for every backend: the lease
# fence, CAS (`expect`), Rewrites (update, fork, lease changes) and txns, in
# commit order; the accepted changes take consecutive seqs from first_seq.
# Nothing is applied here. A backend hands in its committed state through
# CommittedState: the log engine from its index, PostgreSQL from the rows it
# reads inside the batch's transaction.
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sessionstore.wire.canonical import digest_bytes_of_canonical, digest_text
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal

from .documents import RangeReader
from .errors import CorruptRecord
from .mutations import (
    ANY,
    LEASE,
    LEASE_ID,
    SESSION,
    Batch,
    Committed,
    Fence,
    Mutation,
    Outcome,
    Put,
    Remove,
    Rewrite,
    Txn,
    refused,
)
from .txn import decide as decide_txn

Accepted = tuple[int, Put | Remove, int]  # (position in the batch, the change, its seq)
TxnResults = dict[int, list[dict[str, Any]]]  # position of a txn -> its ops' results


class CommittedState(RangeReader, Protocol):
    lease: dict[str, Any] | None
    max_document_bytes: int

    def damaged(self, kind: str, doc_id: str) -> bool: ...
    def body(self, kind: str, doc_id: str) -> bytes | None: ...


def conflict_message(mutation: Put | Remove | Rewrite, current: bytes | None) -> str:
    what = "session" if mutation.kind == SESSION else "document"
    if isinstance(mutation, Rewrite) and mutation.source is not None:
        return f"cannot fork onto {mutation.id!r}: a {what} with that id exists"
    if mutation.expect is None:
        return f"{what} {mutation.id!r} already exists (create-only)"
    if current is None:
        return f"{what} {mutation.id!r} does not exist, so it is not at the expected digest"
    return f"{what} {mutation.id!r} changed: it is no longer at the expected digest"


def fence_refusal(lease: dict[str, Any] | None, fence: Fence) -> Outcome | None:
    holder = lease.get("holder") if lease else None
    epoch = lease.get("epoch") if lease else None
    if fence is ANY:
        if holder is None:
            return None
        message = (
            f"the lease is held by {holder!r} (epoch {epoch}); pass"
            f' lease {{"holder": {holder!r}, "epoch": {epoch}}} with the write'
        )
    elif holder is not None and fence == (holder, epoch):
        return None
    else:
        message = f"lease {fence!r} is not the current one (epoch {epoch})"
    return refused(ErrorCode.FENCED, message, epoch=epoch, holder=holder)


def _decide(
    state: CommittedState, mutation: Put | Remove | Rewrite, next_seq: int, *, full: bool
) -> Put | Remove | Outcome:
    """The concrete change a mutation makes now, or the outcome that refuses it.
    full: the disk has no room for a new generation, only for removals."""
    decides_lease = isinstance(mutation, Rewrite) and mutation.decides_lease
    refusal = None if decides_lease else fence_refusal(state.lease, mutation.fence)
    if refusal is not None:
        return refusal
    if isinstance(mutation, Put) and mutation.expect is ANY:  # needs no current state
        return refused(ErrorCode.NO_SPACE, "disk full: only removals fit") if full else mutation
    entry = state.get(mutation.kind, mutation.id)
    current = entry.digest if entry else None
    if mutation.expect is not ANY and mutation.expect != current:
        message = conflict_message(mutation, current)
        return refused(
            ErrorCode.CONFLICT, message, current=None if current is None else digest_text(current)
        )
    if isinstance(mutation, Remove):
        if entry is None and not state.damaged(mutation.kind, mutation.id):
            return Outcome(seq=next_seq - 1, existed=False, changed=False)
        return mutation
    if full:
        return refused(ErrorCode.NO_SPACE, "disk full: only removals fit")
    if isinstance(mutation, Put):
        return mutation
    try:
        source = state.body(*mutation.source) if mutation.source else None
        body = mutation.apply(state.body(mutation.kind, mutation.id), source)
    except Refusal as refusal:
        return Outcome(refused=refusal)
    except (CorruptRecord, OSError) as error:
        return refused(ErrorCode.IO_ERROR, str(error))
    if body is None:
        return Outcome(seq=next_seq - 1, existed=entry is not None, changed=False)
    if len(body) > state.max_document_bytes:
        return refused(ErrorCode.TOO_LARGE, f"result is {len(body)} bytes")
    return Put(mutation.kind, mutation.id, body, digest_bytes_of_canonical(body))


def _decide_txn(
    state: CommittedState, txn: Txn, next_seq: int, *, full: bool
) -> tuple[list[Put | Remove], list[dict[str, Any]]] | Outcome:
    refusal = fence_refusal(state.lease, txn.fence)
    if refusal is not None:
        return refusal
    try:
        changes, results = decide_txn(txn.requires, txn.ops, state, next_seq)
    except Refusal as refusal:
        return Outcome(refused=refusal)
    if full and any(change.body is not None for change in changes):
        return refused(ErrorCode.NO_SPACE, "disk full: only removals fit")
    concrete: list[Put | Remove] = [
        Remove(c.kind, c.id)
        if c.body is None or c.digest is None
        else Put(c.kind, c.id, c.body, c.digest)
        for c in changes
    ]
    return concrete, results


def decide_all(
    state: CommittedState, mutations: Sequence[Mutation], first_seq: int, *, full: bool
) -> tuple[list[Outcome | None], list[Accepted], TxnResults]:
    """Each mutation's refusal (in outcomes) or its concrete changes (in accepted)."""
    outcomes: list[Outcome | None] = [None] * len(mutations)
    accepted: list[Accepted] = []
    txn_results: TxnResults = {}
    next_seq = first_seq
    for position, mutation in enumerate(mutations):
        if isinstance(mutation, Txn):
            planned = _decide_txn(state, mutation, next_seq, full=full)
            if isinstance(planned, Outcome):
                outcomes[position] = planned
                continue
            changes, results = planned
            if not changes:
                outcomes[position] = Outcome(seq=next_seq - 1, changed=False, results=results)
                continue
            txn_results[position] = results
            for change in changes:
                accepted.append((position, change, next_seq))
                next_seq += 1
            continue
        decided = _decide(state, mutation, next_seq, full=full)
        if isinstance(decided, Outcome):
            outcomes[position] = decided
            continue
        accepted.append((position, decided, next_seq))
        next_seq += 1
    return outcomes, accepted, txn_results


def record_applied(
    batch: Batch,
    outcomes: list[Outcome | None],
    position: int,
    change: Put | Remove,
    seq: int,
    committed_at_ms: int,
) -> None:
    """A durable change as its mutation's outcome and as the event watch reports."""
    if isinstance(change, Put):
        outcomes[position] = Outcome(seq=seq, digest=change.digest)
        size = len(change.body)
        batch.committed.append(
            Committed(seq, change.kind, change.id, change.digest, committed_at_ms, size)
        )
        if change.kind == LEASE and change.id == LEASE_ID:
            batch.lease_body = change.body
    else:
        outcomes[position] = Outcome(seq=seq, existed=True)
        batch.committed.append(Committed(seq, change.kind, change.id, None, committed_at_ms))
    batch.last_seq = seq


def fold_txn_results(outcomes: list[Outcome | None], txn_results: TxnResults) -> list[Outcome]:
    """Each written txn's outcome carries its ops' results; the batch's outcomes in order."""
    for position, results in txn_results.items():
        written = outcomes[position]
        if written is not None and written.ok:  # the seq of its last change
            outcomes[position] = Outcome(seq=written.seq, results=results)
    return [o for o in outcomes if o is not None]
