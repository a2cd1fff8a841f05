# storage/decide.py: a batch decided against the log's committed state, in commit
# order, before anything is written: the fence, expect, Rewrites and txns, and
# the seqs the accepted changes take; an expired generation is absent to every
# decision but the sweep's.
from __future__ import annotations

import cbor2

from sessionstore.wire.canonical import canonical_dumps, digest_bytes_of_canonical, digest_text
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal
from sessionstored.storage.decide import decide_all, fence_refusal
from sessionstored.storage.log.store_reads import LogCommittedState
from sessionstored.storage.mutations import (
    ANY,
    LEASE,
    LEASE_ID,
    Expire,
    Mutation,
    Put,
    Remove,
    Rewrite,
    Sweep,
    Txn,
)
from sessionstored.storage.txn import Require, TxnDelete

from .storage_helpers import body_for, new_fs, open_store, put, remove

NOW_MS = 1_900_000_000_000  # the batch's clock in these decisions


def test_accepted_changes_take_consecutive_seqs_in_commit_order() -> None:
    store = open_store(new_fs())
    store.commit([put("a", 1)])  # seq 1
    first = store.seq + 1
    batch: list[Mutation] = [put("b", 1), remove("never"), put("a", 2), remove("a")]
    outcomes, accepted, _ = decide_all(
        LogCommittedState(store.reads, store.max_document_bytes),
        batch,
        first,
        full=False,
        now_ms=NOW_MS,
    )
    assert [(position, change.id, seq) for position, change, seq in accepted] == [
        (0, "b", first),
        (2, "a", first + 1),
        (3, "a", first + 2),
    ]
    absent = outcomes[1]
    assert absent is not None and absent.ok and not absent.changed and not absent.existed
    assert store.seq == first - 1  # deciding writes nothing


def test_a_failed_expect_says_what_is_current() -> None:
    store = open_store(new_fs())
    store.commit([put("a", 1)])
    entry = store.reads.head("s", "a")
    assert entry is not None
    outcomes, accepted, _ = decide_all(
        LogCommittedState(store.reads, store.max_document_bytes),
        [put("a", 2, expect=b"\1" * 16), put("new", 1, expect=None), put("a", 3, expect=None)],
        store.seq + 1,
        full=False,
        now_ms=NOW_MS,
    )
    stale, created, exists = outcomes
    assert stale is not None and stale.refused is not None
    assert stale.code is ErrorCode.CONFLICT
    assert stale.refused.details == {"current": digest_text(entry.digest)}
    assert created is None and [change.id for _, change, _ in accepted] == ["new"]
    assert exists is not None and exists.code is ErrorCode.CONFLICT
    assert "already exists" in exists.refused.message  # type: ignore[union-attr]


def test_the_fence_holds_writes_to_the_current_lease() -> None:
    lease = {"holder": "agent", "epoch": 3}
    assert fence_refusal(None, ANY) is None
    assert fence_refusal(lease, ("agent", 3)) is None
    for fence in (ANY, ("agent", 2), ("other", 3)):
        outcome = fence_refusal(lease, fence)
        assert outcome is not None and outcome.code is ErrorCode.FENCED
        assert outcome.refused is not None
        assert outcome.refused.details == {"epoch": 3, "holder": "agent"}


def test_a_lease_change_decides_for_itself_and_a_rewrite_sees_committed_bytes() -> None:
    store = open_store(new_fs())
    held = canonical_dumps({"holder": "h", "epoch": 1})
    store.commit([Put(LEASE, LEASE_ID, held, digest_bytes_of_canonical(held))])
    seen: list[bytes | None] = []

    def take_over(current: bytes | None, _source: bytes | None) -> bytes:
        seen.append(current)
        return cbor2.dumps({"holder": "me", "epoch": 2})

    def refuse(_current: bytes | None, _source: bytes | None) -> bytes:
        raise Refusal(ErrorCode.NOT_FOUND, "no such thing", why="test")

    state = LogCommittedState(store.reads, store.max_document_bytes)
    outcomes, accepted, _ = decide_all(
        state,
        [
            Rewrite(LEASE, LEASE_ID, take_over, decides_lease=True),
            Rewrite("s", "x", refuse, decides_lease=True),
            put("fenced", 1),  # no lease named: the committed lease still fences it
        ],
        store.seq + 1,
        full=False,
        now_ms=NOW_MS,
    )
    assert seen == [held]
    assert [change.kind for _, change, _ in accepted] == [LEASE]
    refused, fenced = outcomes[1], outcomes[2]
    assert refused is not None and refused.refused is not None
    assert (refused.code, refused.refused.details) == (ErrorCode.NOT_FOUND, {"why": "test"})
    assert fenced is not None and fenced.code is ErrorCode.FENCED


def test_a_full_disk_takes_only_removals() -> None:
    store = open_store(new_fs())
    store.commit([put("a", 1), put("b", 1)])
    state = LogCommittedState(store.reads, store.max_document_bytes)
    batch: list[Mutation] = [put("c", 1), remove("a"), Txn((), (TxnDelete("s", "b"),))]
    outcomes, accepted, results = decide_all(state, batch, store.seq + 1, full=True, now_ms=NOW_MS)
    assert outcomes[0] is not None and outcomes[0].code is ErrorCode.NO_SPACE
    assert [change.id for _, change, _ in accepted] == ["a", "b"]
    assert results == {2: [{"deleted": True}]}
    assert body_for("c", 1) not in [getattr(change, "body", None) for _, change, _ in accepted]


def _expiring(doc_id: str, n: int, expires_at_ms: int) -> Put:
    plain = put(doc_id, n)
    return Put(plain.kind, plain.id, plain.body, plain.digest, expires_at_ms=expires_at_ms)


def test_an_expired_generation_is_absent_to_every_decision_but_the_sweeps() -> None:
    store = open_store(new_fs())
    store.commit([_expiring("gone", 1, NOW_MS), _expiring("alive", 1, NOW_MS + 1)])
    gone, alive = store.reads.head("s", "gone"), store.reads.head("s", "alive")
    assert gone is not None and alive is not None and gone.expires_at_ms == NOW_MS

    def keep(current: bytes | None, _source: bytes | None) -> bytes:
        assert current is not None
        return current

    batch: list[Mutation] = [
        put("gone", 2, expect=None),  # create-only: the expired one is not there
        Txn(((Require("s", "alive", exists=True)),), ()),
        Rewrite("s", "alive", keep),  # keeps its expiry
        remove("never"),
    ]
    outcomes, accepted, _ = decide_all(
        LogCommittedState(store.reads, store.max_document_bytes),
        batch,
        store.seq + 1,
        full=False,
        now_ms=NOW_MS,
    )
    assert outcomes[0] is None and outcomes[1] is not None and outcomes[1].ok
    created, rewritten = (change for _, change, _ in accepted)
    assert isinstance(created, Put) and created.expires_at_ms == 0
    assert isinstance(rewritten, Put) and rewritten.expires_at_ms == NOW_MS + 1
    stale = decide_all(
        LogCommittedState(store.reads, store.max_document_bytes),
        [put("gone", 3, expect=gone.digest), Txn((Require("s", "gone", exists=True),), ())],
        store.seq + 1, full=False, now_ms=NOW_MS,
    )[0]  # fmt: skip
    assert all(o is not None and o.code is ErrorCode.CONFLICT for o in stale)


def test_the_sweep_removes_only_the_generation_that_expired() -> None:
    store = open_store(new_fs())
    store.commit([_expiring("a", 1, NOW_MS), _expiring("b", 1, NOW_MS + 5), put("c", 1)])
    due = (
        Expire("s", "a", NOW_MS),  # expired: removed
        Expire("s", "b", NOW_MS + 5),  # not yet
        Expire("s", "c", NOW_MS),  # written again without expiry since
        Expire("s", "never", NOW_MS),
    )
    _, accepted, results = decide_all(
        LogCommittedState(store.reads, store.max_document_bytes),
        [Sweep(due)],
        store.seq + 1,
        full=True,
        now_ms=NOW_MS,
    )
    [(position, removal, _)] = accepted
    assert position == 0 and isinstance(removal, Remove) and removal.expired
    assert results == {0: [{"expired": 1}]}
    nothing, _, _ = decide_all(
        LogCommittedState(store.reads, store.max_document_bytes),
        [Sweep(due[1:])],
        store.seq + 1,
        full=False,
        now_ms=NOW_MS,
    )
    assert nothing[0] is not None and nothing[0].ok and not nothing[0].changed
