# Deciding a batch against the committed state, for every backend: the lease
# fence, CAS (`expect`), Rewrites (update, fork, lease changes) and txns, in
# commit order; the accepted changes take consecutive seqs from first_seq.
# Nothing is applied here. A backend hands in its committed state through
# CommittedState: the log engine from its index, PostgreSQL from the rows it
# reads inside the batch's transaction. Every decision sees that state as of
# the batch's clock (now_ms): an expired generation is absent to CAS,
# create-only, requirements, updates and forks, and only the sweep's Expire
# looks at it, to remove it if it is still that generation.
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sessionstore.wire.canonical import digest_bytes_of_canonical, digest_text
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal

from .documents import NEVER, Entry, Found, KeyRange, RangeReader, expired
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
    Sweep,
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
    # the body of the generation current at seq `at` (generations.py); None: no session
    def body_at(self, kind: str, doc_id: str, at: int) -> bytes | None: ...


class LiveView:
    """A CommittedState as the batch's clock sees it: expired generations absent."""

    def __init__(self, state: CommittedState, now_ms: int) -> None:
        self.state = state
        self.now_ms = now_ms
        self.lease = state.lease
        self.max_document_bytes = state.max_document_bytes

    def stored(self, kind: str, doc_id: str) -> Entry | None:
        return self.state.get(kind, doc_id)

    def get(self, kind: str, doc_id: str) -> Entry | None:
        entry = self.state.get(kind, doc_id)
        return None if entry is None or expired(entry.expires_at_ms, self.now_ms) else entry

    def scan(self, wanted: KeyRange) -> Found:
        found, more = self.state.scan(wanted)
        return [(i, e) for i, e in found if not expired(e.expires_at_ms, self.now_ms)], more

    def damaged(self, kind: str, doc_id: str) -> bool:
        return self.state.damaged(kind, doc_id)

    def body(self, kind: str, doc_id: str) -> bytes | None:
        return self.state.body(kind, doc_id) if self.get(kind, doc_id) else None

    def source_body(self, mutation: Rewrite) -> bytes | None:
        if mutation.source is None:
            return None
        if mutation.source_at is None or not self.get(*mutation.source):
            return self.body(*mutation.source)
        return self.state.body_at(*mutation.source, mutation.source_at)


def conflict_message(mutation: Put | Remove | Rewrite, current: bytes | None) -> str:
    what = "session" if mutation.kind == SESSION else "document"
    forked = isinstance(mutation, Rewrite) and mutation.source not in (
        None,
        (mutation.kind, mutation.id),
    )
    if forked:
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


def _decide_sweep(state: LiveView, sweep: Sweep) -> list[Put | Remove]:
    removals: list[Put | Remove] = []
    for kind, doc_id, expires_at_ms in sweep.due:
        entry = state.stored(kind, doc_id)
        if (
            entry is not None
            and entry.expires_at_ms == expires_at_ms
            and expired(expires_at_ms, state.now_ms)
        ):
            removals.append(Remove(kind, doc_id, expired=True))
    return removals


def _decide(
    state: LiveView, mutation: Put | Remove | Rewrite, next_seq: int, *, full: bool
) -> Put | Remove | Outcome:
    """The concrete change a mutation makes now, or the outcome that refuses it.
    full: the disk has no room for a new generation, only for removals."""
    unfenced = isinstance(mutation, Rewrite) and (mutation.decides_lease or mutation.refresh)
    fenced_out = None if unfenced else fence_refusal(state.lease, mutation.fence)
    if fenced_out is not None:
        return fenced_out
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
    if (
        isinstance(mutation, Rewrite)
        and mutation.refresh
        and (entry is None or not entry.expires_at_ms)
    ):
        return Outcome(seq=next_seq - 1, existed=entry is not None, changed=False)
    if full:
        return refused(ErrorCode.NO_SPACE, "disk full: only removals fit")
    if isinstance(mutation, Put):
        return mutation
    try:
        source = state.source_body(mutation)
        body = mutation.apply(state.body(mutation.kind, mutation.id), source)
    except Refusal as refusal:
        return Outcome(refused=refusal)
    except (CorruptRecord, OSError) as error:
        return refused(ErrorCode.IO_ERROR, str(error))
    if body is None:
        return Outcome(seq=next_seq - 1, existed=entry is not None, changed=False)
    if len(body) > state.max_document_bytes:
        return refused(ErrorCode.TOO_LARGE, f"result is {len(body)} bytes")
    expires = mutation.expires_at_ms
    if expires is None:  # keeps the current generation's expiry
        expires = entry.expires_at_ms if entry is not None else NEVER
    digest = digest_bytes_of_canonical(body)
    return Put(mutation.kind, mutation.id, body, digest, expires_at_ms=expires)


def _decide_txn(
    state: LiveView, txn: Txn, next_seq: int, *, full: bool
) -> tuple[list[Put | Remove], list[dict[str, Any]]] | Outcome:
    fenced_out = fence_refusal(state.lease, txn.fence)
    if fenced_out is not None:
        return fenced_out
    try:
        changes, results = decide_txn(txn.requires, txn.ops, state, next_seq)
    except Refusal as refusal:
        return Outcome(refused=refusal)
    except (CorruptRecord, OSError) as error:  # a body a put's `keep` read
        return refused(ErrorCode.IO_ERROR, str(error))
    if full and any(change.body is not None for change in changes):
        return refused(ErrorCode.NO_SPACE, "disk full: only removals fit")
    concrete: list[Put | Remove] = [
        Remove(c.kind, c.id)
        if c.body is None or c.digest is None
        else Put(c.kind, c.id, c.body, c.digest, expires_at_ms=c.expires_at_ms)
        for c in changes
    ]
    return concrete, results


def decide_all(
    committed: CommittedState,
    mutations: Sequence[Mutation],
    first_seq: int,
    *,
    full: bool,
    now_ms: int,
) -> tuple[list[Outcome | None], list[Accepted], TxnResults]:
    """Each mutation's refusal (in outcomes) or its concrete changes (in accepted), as
    of now_ms (the batch's clock)."""
    state = LiveView(committed, now_ms)
    outcomes: list[Outcome | None] = [None] * len(mutations)
    accepted: list[Accepted] = []
    txn_results: TxnResults = {}
    next_seq = first_seq
    for position, mutation in enumerate(mutations):
        if isinstance(mutation, Txn | Sweep):
            if isinstance(mutation, Sweep):  # no fence: expiry is not a client's write
                removals = _decide_sweep(state, mutation)
                planned: Any = (removals, [{"expired": len(removals)}])
            else:
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
        batch.committed.append(
            Committed(seq, change.kind, change.id, None, committed_at_ms, expired=change.expired)
        )
    batch.last_seq = seq


def fold_txn_results(outcomes: list[Outcome | None], txn_results: TxnResults) -> list[Outcome]:
    """Each written txn's outcome carries its ops' results; the batch's outcomes in order."""
    for position, results in txn_results.items():
        written = outcomes[position]
        if written is not None and written.ok:  # the seq of its last change
            outcomes[position] = Outcome(seq=written.seq, results=results)
    return [o for o in outcomes if o is not None]
