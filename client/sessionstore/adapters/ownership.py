# Fenced ownership of a thread or session, for the adapters that take owner=.
#
# Each scope (a session, a thread) that an owner writes has an owner document
# beside it: {"owner": NAME, "epoch": N}, expiring LEASE_TTL_S after the last
# write that renewed it. An adapter with an owner puts, in every txn it writes
# to the scope:
#   - a requirement, after its own ones, that the owner document is the one this
#     owner holds (absent, for its first write to a scope nobody holds);
#   - the owner document again, at the end of its ops, which renews its expiry.
# So a write from an owner that another one has taken the scope from changes
# nothing: its txn fails on that requirement, and the adapter raises StaleOwner.
# take_over() moves the scope to this owner at the next epoch, compare-and-swap
# on the document it read: the previous owner's next write is refused. A scope
# whose owner stopped writing for LEASE_TTL_S (it died) has no owner document
# any more, and the next owner to write takes it without an operator.
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import requests as r
from ..errors import Conflict, SessionStoreError, StaleOwner
from .lifetime import required
from .plans import KIND, Plan, put_op

LEASE_TTL_S = 300.0  # a scope's owner keeps it this long after its last write
# how a txn of (ops, require) is committed: one txn, or lifetime.Lifetime's commit,
# which renews the scope's lifetime with it and raises a conflict on require as it came
Commit = Callable[[list[dict[str, Any]], list[dict[str, Any]]], Plan[Any]]


def one_txn(ops: list[dict[str, Any]], require: list[dict[str, Any]]) -> Plan[None]:
    yield [r.txn(ops, require)]


@dataclass
class Owner:
    """One owner's leases, by the key of each scope's owner document."""

    name: str
    lease_ttl_s: float = LEASE_TTL_S
    held: dict[str, dict[str, Any]] = field(default_factory=dict)
    unowned: set[str] = field(default_factory=set)  # held, and to be taken as absent

    def claim(self, document: str) -> Plan[None]:
        """Before a first write to a scope: take it when nobody holds it (or its owner
        is this one, by name); StaleOwner when another does."""
        if document in self.held:
            return
        (current,) = yield [r.checkpoint_get(KIND, document)]
        if current is not None and current.get("owner") != self.name:
            raise StaleOwner(
                f"owned by {current.get('owner')!r} (epoch {current.get('epoch')}); take it"
                " over to write here",
                {"owner": current.get("owner"), "epoch": current.get("epoch")},
            )
        if current is None:
            current = {"owner": self.name, "epoch": 1}
            self.unowned.add(document)
        self.held[document] = current

    def fence(self, document: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The requirement and the renewing op for a write to a claimed scope."""
        held = self.held[document]
        stored = None if document in self.unowned else held
        return required(document, stored), put_op(document, held, ttl_s=self.lease_ttl_s)

    def written(self, document: str) -> None:
        self.unowned.discard(document)

    def refused(self, document: str, error: SessionStoreError) -> Plan[bool]:
        """After a write refused on the owner requirement: True when the lease only
        lapsed (nobody holds the scope: take it again and retry), else StaleOwner."""
        (current,) = yield [r.checkpoint_get(KIND, document)]
        if current is None:
            self.unowned.add(document)
            return True
        self.held.pop(document, None)
        self.unowned.discard(document)
        raise StaleOwner(
            f"this owner ({self.name!r}) was fenced: {current.get('owner')!r} took the scope"
            f" over (epoch {current.get('epoch')})",
            {**error.details, "owner": current.get("owner"), "epoch": current.get("epoch")},
        )

    def take_over(self, document: str) -> Plan[None]:
        """The scope, at the next epoch, whoever held it."""
        (current,) = yield [r.checkpoint_get(KIND, document)]
        epoch = 1 if current is None else int(current.get("epoch", 0)) + 1
        mine = {"owner": self.name, "epoch": epoch}
        renewal = put_op(document, mine, ttl_s=self.lease_ttl_s)
        yield [r.txn([renewal], [required(document, current)])]
        self.held[document] = mine
        self.unowned.discard(document)


def owner_of(name: str | None, lease_ttl_s: float) -> Owner | None:
    """An adapter's owner, from its owner= and lease_ttl_s (None: no owner)."""
    return None if name is None else Owner(name, lease_ttl_s)


def take_over(owner: Owner | None, document: str) -> Plan[None]:
    """The adapter's owner takes the scope (Owner.take_over); TypeError for an adapter
    made without owner=."""
    if owner is None:
        raise TypeError("take_over() needs an adapter made with owner=")
    yield from owner.take_over(document)


def fenced_txn(
    owner: Owner | None,
    scope: str,
    ops: list[dict[str, Any]],
    require: list[dict[str, Any]],
    commit: Commit = one_txn,
) -> Plan[None]:
    """One txn of ops under require (committed by commit) and, with an owner, under its
    lease on the scope (the key of the scope's owner document): StaleOwner when another
    owner has it. With an owner the txn has one op more than ops."""
    if owner is None:
        yield from commit(ops, require)
        return
    yield from owner.claim(scope)
    while True:
        requirement, renewal = owner.fence(scope)
        try:
            yield from commit([*ops, renewal], [*require, requirement])
        except Conflict as conflict:
            if conflict.details.get("failed") != len(require):
                raise
            if (yield from owner.refused(scope, conflict)):
                continue  # the lease lapsed with nobody taking it: taken again
        owner.written(scope)
        return
