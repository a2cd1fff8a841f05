# What the writer asks the engine to do, and what it answers.
#
# Put and Remove carry their final bytes. A Rewrite is decided inside the
# writer, in commit order: its apply() gets the committed bytes of its target
# (and of its source, for a fork) and returns the new bytes, None for "no
# change", or raises errors.Refusal. That is what makes `update` free of lost updates
# and lease changes free of races with commits.
from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal
from sessionstore.wire.value_class import value_class

from .documents import NEVER, Entry
from .txn import Require, TxnAppend, TxnDelete, TxnDeletePrefix, TxnOp, TxnPut, txn_body_bytes


class Unconditional(enum.Enum):
    """No condition given: any current digest will do (expect), or no lease was named
    with the write (fence)."""

    ANY = "ANY"

    def __repr__(self) -> str:
        return "ANY"


ANY = Unconditional.ANY

SESSION = "s"
LOOP_CHECKPOINT = "l"
WORKFLOW_CHECKPOINT = "w"
KV_DOCUMENT = "k"  # free-form keyed documents (the framework adapters keep theirs here)
LEASE = "L"
LEASE_ID = "lease"


Fence = Unconditional | tuple[str, int]  # ANY (no lease given) or (holder, epoch)
Expect = Unconditional | bytes | None  # ANY, None (must not exist) or the current digest


@value_class
class Put:
    kind: str
    id: str
    body: bytes
    digest: bytes
    expect: Expect = ANY
    fence: Fence = ANY
    expires_at_ms: int = NEVER


@value_class
class Remove:
    kind: str
    id: str
    expect: Expect = ANY
    fence: Fence = ANY
    expired: bool = False  # the sweep's: its generation expired


@value_class
class Rewrite:
    kind: str
    id: str
    apply: Callable[[bytes | None, bytes | None], bytes | None]
    expect: Expect = ANY
    fence: Fence = ANY
    source: tuple[str, str] | None = None
    # the source's generation that was current at this seq, not its current one (a
    # revert's source is its own target)
    source_at: int | None = None
    decides_lease: bool = False  # a lease change: its apply() decides against the lease
    exclusive: bool = False  # alone in its batch (lease changes move the fence)
    expires_at_ms: int | None = None  # the new generation's expiry; None keeps the current
    # a read's refresh of an expiry: nothing unless the document has one, and no fence
    # (it changes no content)
    refresh: bool = False


class Expire(NamedTuple):
    """A generation the sweep found due: it expired at expires_at_ms."""

    kind: str
    id: str
    expires_at_ms: int


@value_class
class Sweep:
    """The sweep's removal of the documents whose generations expired: each one that
    still holds the generation it was found at (not written again since), and has
    expired by the batch's clock, is removed; the others are left alone."""

    due: tuple[Expire, ...]


@value_class
class Txn:
    """Several changes, all or none, under requirements (txn.py decides it)."""

    requires: tuple[Require, ...]
    ops: tuple[TxnOp, ...]
    fence: Fence = ANY

    @property
    def body_bytes(self) -> int:
        return txn_body_bytes(self.ops)


Mutation = Put | Remove | Rewrite | Txn | Sweep


def mutation_keys(mutation: Mutation) -> frozenset[tuple[str, str]] | None:
    """The documents a mutation reads or writes; None when it must be alone in its batch."""
    if isinstance(mutation, Sweep):
        return frozenset((due.kind, due.id) for due in mutation.due)
    if isinstance(mutation, Txn):
        if any(isinstance(op, TxnDeletePrefix) for op in mutation.ops):
            return None  # the keys it removes are known only when it is decided
        named = {(r.kind, r.id) for r in mutation.requires}
        named |= {(op.kind, op.id) for op in mutation.ops if isinstance(op, TxnPut | TxnDelete)}
        return frozenset(named)
    if isinstance(mutation, Rewrite):
        if mutation.exclusive:
            return None
        if mutation.source is not None:
            return frozenset({(mutation.kind, mutation.id), mutation.source})
    return frozenset({(mutation.kind, mutation.id)})


def needs_whole_store(mutation: Mutation) -> bool:
    """Decided with no other batch in flight: a lease change (it moves the fence), a
    delete_prefix (its keys are known only when it is decided), an append (its key is
    its seq), a write of an earlier generation (PostgreSQL reads it under the lock)."""
    if mutation_keys(mutation) is None:
        return True
    if isinstance(mutation, Rewrite) and (mutation.decides_lease or mutation.source_at is not None):
        return True
    return isinstance(mutation, Txn) and any(isinstance(op, TxnAppend) for op in mutation.ops)


def split_batches(mutations: list[Any], key_of: Callable[[Any], Mutation]) -> list[list[Any]]:
    """Cut a queue into batches in which no document is touched twice, order kept."""
    batches: list[list[Any]] = []
    current: list[Any] = []
    seen: set[tuple[str, str]] = set()
    for item in mutations:
        keys = mutation_keys(key_of(item))
        if keys is None:
            if current:
                batches.append(current)
            batches.append([item])
            current, seen = [], set()
            continue
        if seen & keys:
            batches.append(current)
            current, seen = [], set()
        current.append(item)
        seen |= keys
    if current:
        batches.append(current)
    return batches


@value_class
class Outcome:
    """What a mutation did: the seq and digest it committed, whether its target existed,
    whether anything changed, a txn's results per op; or the refusal that stopped it."""

    seq: int | None = None
    digest: bytes | None = None
    existed: bool = False
    changed: bool = True
    results: list[dict[str, Any]] = field(default_factory=list)
    refused: Refusal | None = None

    @property
    def ok(self) -> bool:
        return self.refused is None

    @property
    def code(self) -> ErrorCode | None:
        return None if self.refused is None else self.refused.code


def refused(code: ErrorCode, message: str, **details: Any) -> Outcome:
    return Outcome(refused=Refusal(code, message, **details))


class Committed(NamedTuple):
    """One committed change, as watch reports it: digest None for a removal."""

    seq: int
    kind: str
    id: str
    digest: bytes | None
    committed_at_ms: int
    size: int = 0
    expired: bool = False  # a removal by the expiry sweep


@dataclass
class Batch:
    """A batch as committed: each mutation's outcome, the index changes, what watch
    reports, the last seq, and the lease's new body if the batch changed it."""

    outcomes: list[Outcome]
    changes: list[tuple[str, str, Entry | None]] = field(default_factory=list)
    committed: list[Committed] = field(default_factory=list)
    last_seq: int = 0
    sync_s: float = 0.0  # the log's fdatasync of this batch (0 on PostgreSQL)
    lease_body: bytes | None = None
