# Crash at every syscall, over the simulated filesystem.
#
# A workload of batches runs against the store; the filesystem stops it at step
# k, for every k, and then forgets what was not synced ("drop": power loss) or
# keeps everything ("keep": only the process died). Recovery must then give:
# every acknowledged mutation (or, for an id of the interrupted batch, possibly
# that batch's value), no torn document, a clean check, no temp files, a seq
# that did not go back, and the same store when recovered a second time, also
# when recovery itself is crashed at each of its own steps first.
from __future__ import annotations

import contextlib
from typing import Any

import cbor2
import pytest

from sessionstore.canonical import canonical_dumps, digest_bytes_of_canonical
from sessionstored.storage.mutations import LEASE, LEASE_ID, Mutation, Put, Remove, Rewrite
from sessionstored.storage.sealing import Key
from sessionstored.storage.store import Store

from .simfs import SimulatedCrash
from .storage_helpers import (
    ROOT,
    all_documents,
    assert_clean,
    body_for,
    new_fs,
    open_store,
    put,
    remove,
    snapshot_of,
)

SEALING_KEY = Key.from_material(b"\x5a" * 32)

WORKLOAD: list[list[Mutation]] = [
    [put("a", 1), put("b", 1), put("c", "x" * 5000)],
    [put("a", 2), remove("b")],
    [put("b", 3, expect=None), put("d", 1)],
    [remove("c"), put("a", 3), put("long/" + "z" * 600, 1)],
    [put("d", 2), remove("nope")],
    [put("c", 4), put("a", 4), remove("d")],
]


def _apply(model: dict[str, Any], mutation: Mutation) -> None:
    if isinstance(mutation, Put):
        model[mutation.id] = mutation.body
    else:
        model.pop(mutation.id, None)


def _run(store: Store, model: dict[str, Any], inflight: dict[str, list[Any]]) -> int:
    """Run the workload; record acknowledged effects in model. Returns the last acked seq."""
    last_seq = store.seq
    for batch in WORKLOAD:
        inflight.clear()
        for mutation in batch:
            inflight[mutation.id] = [
                mutation.body if isinstance(mutation, Put) else None,
                model.get(mutation.id),
            ]
        result = store.commit_durably(batch)
        store.publish(result)
        for mutation, outcome in zip(batch, result.outcomes, strict=True):
            assert outcome.ok, outcome
            _apply(model, mutation)
        last_seq = store.seq
    inflight.clear()
    return last_seq


def _total_steps() -> int:
    fs = new_fs()
    store = open_store(fs)
    before = fs.steps
    _run(store, {}, {})
    return fs.steps - before


def _check_recovered(
    store: Store, model: dict[str, Any], inflight: dict[str, list[Any]], acked_seq: int
) -> None:
    assert_clean(store)
    assert store.fs.listdir(f"{store.root}/tmp") == []
    assert store.seq >= acked_seq
    recovered = {doc_id: body for doc_id, (_seq, body) in snapshot_of(store).items()}
    for doc_id in set(model) | set(recovered) | set(inflight):
        allowed = inflight.get(doc_id, [model.get(doc_id)])
        assert recovered.get(doc_id) in allowed, (doc_id, recovered.get(doc_id), allowed)


def _recover_cleanly(fs: Any, key: Key | None = None) -> Store:
    """A crash, even power loss, must never look like corruption."""
    store = Store(fs, ROOT, key=key)
    report = store.open()
    assert report.wal_corruption is None, report.wal_corruption
    assert not report.rebuilt_from_files and not report.checkpoint_problems
    return store


def _state(store: Store) -> tuple[int, dict[str, tuple[int, bytes]]]:
    return store.seq, snapshot_of(store)


@pytest.mark.parametrize("keep_unsynced", [False, True], ids=["power-loss", "process-kill"])
def test_crash_at_every_step_of_the_workload(keep_unsynced: bool) -> None:
    total = _total_steps()
    assert total > 50
    for step in range(total + 1):
        fs = new_fs()
        store = open_store(fs)
        model: dict[str, Any] = {}
        inflight: dict[str, list[Any]] = {}
        fs.arm(step)
        acked_seq = 0
        try:
            acked_seq = _run(store, model, inflight)
        except SimulatedCrash:
            acked_seq = max(acked_seq, store.seq)
        fs.crash(keep_unsynced=keep_unsynced)
        recovered = _recover_cleanly(fs)
        _check_recovered(recovered, model, inflight, acked_seq)
        first = _state(recovered)
        recovered.close()
        fs.crash(keep_unsynced=False)
        again = open_store(fs)
        assert _state(again) == first, f"second recovery differs after a crash at step {step}"


def test_crash_during_recovery_at_every_step() -> None:
    total = _total_steps()
    for step in range(0, total + 1, 3):
        fs = new_fs()
        store = open_store(fs)
        model: dict[str, Any] = {}
        inflight: dict[str, list[Any]] = {}
        fs.arm(step)
        with contextlib.suppress(SimulatedCrash):
            _run(store, model, inflight)
        fs.crash(keep_unsynced=False)
        recovery_step = 0
        while True:
            fs.arm(recovery_step)
            try:
                recovered = Store(fs, "/state")
                recovered.open()
            except SimulatedCrash:
                fs.crash(keep_unsynced=False)
                recovery_step += 1
                continue
            break
        _check_recovered(recovered, model, inflight, 0)


def test_acknowledged_writes_survive_power_loss_between_batches() -> None:
    fs = new_fs()
    store = open_store(fs)
    model: dict[str, Any] = {}
    for batch in WORKLOAD:
        store.commit(batch)
        for mutation in batch:
            _apply(model, mutation)
        fs.crash(keep_unsynced=False)
        store = open_store(fs)
        assert {k: v for k, (_s, v) in snapshot_of(store).items()} == model
    assert body_for("a", 4) == model["a"]


def _appending(suffix: str, fence: Any = None) -> Rewrite:
    """A Rewrite that appends to the session's body: its result depends on the committed state."""

    def apply(current: bytes | None, _source: bytes | None) -> bytes:
        return body_for("rw", (cbor2.loads(current)["value"] if current else "") + suffix)

    return Rewrite("s", "rw", apply) if fence is None else Rewrite("s", "rw", apply, fence=fence)


def _lease(holder: str) -> Rewrite:
    return Rewrite(
        LEASE,
        LEASE_ID,
        lambda current, _s: canonical_dumps({"holder": holder, "epoch": 1}),
        fenced=False,
        exclusive=True,
    )


WORKLOAD_WITH_COMPACTION: list[Any] = [
    [put("a", 1), _appending("x"), Put("l", "run-1", b"\xa0", digest_bytes_of_canonical(b"\xa0"))],
    [_appending("y"), remove("a")],
    "compact",
    [put("b", 2), Remove("l", "run-1"), _appending("z")],
    [_lease("agent")],
    "compact",
    [
        Put(
            "s",
            "c",
            body_for("c", 3),
            digest_bytes_of_canonical(body_for("c", 3)),
            fence=("agent", 1),
        ),
        _appending("w", fence=("agent", 1)),
    ],
]


def _run_with_compaction(
    store: Store, model: dict[tuple[str, str], Any], inflight: dict[tuple[str, str], list[Any]]
) -> int:
    for step in WORKLOAD_WITH_COMPACTION:
        inflight.clear()
        if step == "compact":
            store.compact()
            continue
        for mutation in step:
            key = (mutation.kind, mutation.id)
            old = model.get(key)
            if isinstance(mutation, Rewrite):
                new = mutation.apply(old, None)
            else:
                new = mutation.body if isinstance(mutation, Put) else None
            inflight[key] = [new, old]
        result = store.commit_durably(step)
        store.publish(result)
        for mutation, outcome in zip(step, result.outcomes, strict=True):
            assert outcome.ok, outcome
            key = (mutation.kind, mutation.id)
            model[key] = inflight[key][0]
            if model[key] is None:
                del model[key]
    inflight.clear()
    return store.seq


@pytest.mark.parametrize("sealing_key", [None, SEALING_KEY], ids=["plaintext", "sealed"])
@pytest.mark.parametrize("keep_unsynced", [False, True], ids=["power-loss", "process-kill"])
def test_crash_at_every_step_with_rewrites_leases_and_compaction(
    keep_unsynced: bool, sealing_key: Key | None
) -> None:
    probe_fs = new_fs()
    probe = open_store(probe_fs, key=sealing_key)
    before = probe_fs.steps
    final_seq = _run_with_compaction(probe, {}, {})
    total = probe_fs.steps - before
    for step in range(total + 1):
        fs = new_fs()
        store = open_store(fs, key=sealing_key)
        model: dict[tuple[str, str], Any] = {}
        inflight: dict[tuple[str, str], list[Any]] = {}
        fs.arm(step)
        acked_seq = 0
        try:
            acked_seq = _run_with_compaction(store, model, inflight)
        except SimulatedCrash:
            acked_seq = store.seq
        fs.crash(keep_unsynced=keep_unsynced)
        recovered = _recover_cleanly(fs, sealing_key)
        assert_clean(recovered)
        assert recovered.seq >= acked_seq
        documents = all_documents(recovered)
        for key in set(model) | set(documents) | set(inflight):
            allowed = inflight.get(key, [model.get(key)])
            assert documents.get(key) in allowed, (step, key)
        if step == total:
            assert recovered.seq == final_seq
        lease_expected = ("L", "lease") in documents
        assert (recovered.lease is not None) == lease_expected
        history = recovered.history.after(0, 1000)
        assert [c.seq for c in history] == sorted(c.seq for c in history)
        first = (recovered.seq, documents)
        recovered.close()
        fs.crash(keep_unsynced=False)
        again = open_store(fs, key=sealing_key)
        assert (again.seq, all_documents(again)) == first, f"second recovery differs at step {step}"
