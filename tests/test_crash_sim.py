# Crash at every syscall, over the simulated file system.
#
# A workload of batches, index checkpoints and compactions (one of them copying
# while a batch saves sessions whose records it copies, as the daemon's
# background compaction does) runs against a store that keeps earlier
# generations; the file system stops it at step k, for every k, and then loses
# power (what was not synced is dropped, or only some of its pages land, out of
# order) or only the process dies (everything the OS had stays). Recovery must
# then give: every acknowledged mutation (or, for a document of the
# interrupted batch, possibly that batch's value), every session's generations
# kept, each readable and as written, a clean check, no temp file, no
# corruption reported, a seq that did not go back, the whole watch history (as
# far back as it reached before the crash), and the same store when recovered a
# second time, also when recovery itself is crashed at each of its own steps
# first.
from __future__ import annotations

from typing import Any

import cbor2
import pytest

from sessionstore.wire.canonical import canonical_dumps, digest_bytes_of_canonical
from sessionstored.storage.log import segments
from sessionstored.storage.log.store import Store
from sessionstored.storage.mutations import (
    ANY,
    LEASE,
    LEASE_ID,
    SESSION,
    Mutation,
    Put,
    Remove,
    Rewrite,
)
from sessionstored.storage.sealing import Key

from .simfs import CRASH_MODES, SimFileSystem, SimulatedCrash
from .storage_helpers import (
    ROOT,
    all_documents,
    assert_clean,
    body_for,
    new_fs,
    open_store,
    open_with_report,
    put,
    remove,
)

SEALING_KEY = Key.from_material(b"\x5a" * 32)
SEGMENT_BYTES = 16 * 1024  # a few rotations and a real compaction in a short workload
KEEP_GENERATIONS = 2  # few enough that saves drop earlier generations and compaction copies

DocKey = tuple[str, str]
Kept = dict[str, list[tuple[int, bytes]]]  # session id -> its generations (seq, body), oldest first
COMPACT_WHILE_SAVING = "compact while saving"


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
        decides_lease=True,
        exclusive=True,
    )


def _fenced_put(session_id: str, value: Any) -> Put:
    body = body_for(session_id, value)
    return Put("s", session_id, body, digest_bytes_of_canonical(body), fence=("agent", 1))


WORKLOAD: list[Any] = [
    [put("a", 1), put("b", 1), put("c", "x" * 5000), _appending("x")],
    [put("a", 2), remove("b"), Put("l", "run-1", b"\xa0", digest_bytes_of_canonical(b"\xa0"))],
    [put("b", 3, expect=None), put("d", "y" * 6000)],
    "checkpoint",
    [remove("c"), put("a", 3), put("long/" + "z" * 600, 1), _appending("y")],
    [put("d", "w" * 7000), remove("nope"), Remove("l", "run-1")],
    "compact",
    [put("c", 4), put("a", "v" * 4000), remove("d")],
    # b's current record lies in the segment the first compaction made: the save replaces
    # it while it is copied, and it is an earlier generation when the copy is switched in
    (COMPACT_WHILE_SAVING, [put("b", 6), put("a", 6), put("c", "t" * 3000)]),
    [_lease("agent")],
    [_fenced_put("e", "u" * 3000), _appending("z", fence=("agent", 1))],
    "compact",
    [_fenced_put("a", 5)],
]


def _run(
    store: Store,
    model: dict[DocKey, Any],
    inflight: dict[DocKey, list[Any]],
    kept: Kept | None = None,
) -> int:
    """Run the workload; record acknowledged effects in model and the session generations
    kept in kept. Returns the last acked seq."""
    kept = {} if kept is None else kept
    for step in WORKLOAD:
        inflight.clear()
        if step == "compact":
            store.compact()
        elif step == "checkpoint":
            store.checkpointing.write()
        elif isinstance(step, tuple):  # planned, copied, a batch, then switched in
            work = store.compactor.choose(everything=True)
            assert work is not None
            store.compactor.copy(work)
            _commit(store, step[1], model, inflight, kept)
            saved = {m.id for m in step[1]}
            assert any(k == SESSION and i in saved for k, i, _ in work.moves)
            store.compactor.switch(work)
            store.checkpointing.write()
            store.state.log.close_retired()
        else:
            _commit(store, step, model, inflight, kept)
    inflight.clear()
    return store.seq


def _commit(
    store: Store,
    step: list[Mutation],
    model: dict[DocKey, Any],
    inflight: dict[DocKey, list[Any]],
    kept: Kept,
) -> None:
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
        if mutation.kind == SESSION and outcome.changed:
            _keep(kept, mutation.id, outcome.seq, model.get(key))


def _keep(kept: Kept, session_id: str, seq: int | None, body: bytes | None) -> None:
    """The generations the store keeps: a removal takes them all."""
    if body is None:
        kept.pop(session_id, None)
        return
    assert seq is not None
    generations = kept.setdefault(session_id, [])
    generations.append((seq, body))
    del generations[: -(KEEP_GENERATIONS + 1)]


def _open(fs: SimFileSystem, key: Key | None) -> Store:
    return open_store(fs, key=key, segment_bytes=SEGMENT_BYTES, keep_generations=KEEP_GENERATIONS)


def _total_steps(key: Key | None) -> tuple[int, int]:
    fs = new_fs()
    store = _open(fs, key)
    before = fs.steps
    final_seq = _run(store, {}, {})
    return fs.steps - before, final_seq


def _recover_cleanly(fs: SimFileSystem, key: Key | None) -> Store:
    """A crash, even power loss with pages landing out of order, never looks like corruption."""
    store, report = open_with_report(
        fs, key=key, segment_bytes=SEGMENT_BYTES, keep_generations=KEEP_GENERATIONS
    )
    assert report.corruption == [], report.corruption
    assert report.checkpoint_problems == [], report.checkpoint_problems
    return store


def _check_recovered(
    store: Store,
    model: dict[DocKey, Any],
    inflight: dict[DocKey, list[Any]],
    acked_seq: int,
    kept: Kept,
) -> None:
    assert_clean(store)
    assert [n for n in store.state.fs.listdir(f"{ROOT}/tmp") if not n.startswith("spare-")] == []
    assert store.seq >= acked_seq
    documents = all_documents(store)
    for key in set(model) | set(documents) | set(inflight):
        allowed = inflight.get(key, [model.get(key)])
        assert documents.get(key) in allowed, (key, documents.get(key), allowed)
    assert (store.lease is not None) == ((LEASE, LEASE_ID) in documents)
    # watch with since=0 reaches back to the first change: nothing of the history was lost
    assert [c.seq for c in store.history.after(0, 10_000)] == list(range(1, store.seq + 1))
    _check_generations(store, kept, inflight, landed=store.seq > acked_seq)


def _check_generations(
    store: Store, kept: Kept, inflight: dict[DocKey, list[Any]], *, landed: bool
) -> None:
    """Every generation the store lists loads at its seq as written, and they are the ones
    it keeps: the acknowledged ones, and the interrupted batch's if it landed."""
    sessions = (
        {i for k, i in inflight if k == SESSION}
        | set(kept)
        | {i for i, _ in store.state.index.items(SESSION)}
    )
    for session_id in sessions:
        listed = [
            (entry.seq, store.reads.read_generation(SESSION, session_id, entry).body)
            for entry in store.reads.generations(SESSION, session_id)
        ]
        expected = list(reversed(kept.get(session_id, [])))
        if landed and (SESSION, session_id) in inflight:
            new = inflight[(SESSION, session_id)][0]
            newest = listed[0][0] if listed else 0
            expected = [] if new is None else [(newest, new), *expected][: KEEP_GENERATIONS + 1]
        assert listed == expected, session_id


def _state(store: Store) -> tuple[int, dict[DocKey, bytes], list[Any]]:
    return store.seq, all_documents(store), store.history.after(0, 10_000)


@pytest.mark.parametrize("making", ["zero-filled", "preallocated"])
@pytest.mark.parametrize("key", [None, SEALING_KEY], ids=["plaintext", "sealed"])
@pytest.mark.parametrize("mode", CRASH_MODES)
def test_crash_at_every_step_of_the_workload(
    mode: str, key: Key | None, making: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the workload's commits are small: the preallocated run makes every new segment so
    if making == "preallocated":
        monkeypatch.setattr(segments, "PREALLOCATE_FROM_COMMIT_BYTES", 0)
    total, final_seq = _total_steps(key)
    assert total > 100
    for step in range(total + 1):
        fs = new_fs()
        store = _open(fs, key)
        model: dict[DocKey, Any] = {}
        inflight: dict[DocKey, list[Any]] = {}
        kept: Kept = {}
        fs.arm(step)
        acked_seq = 0
        try:
            acked_seq = _run(store, model, inflight, kept)
        except SimulatedCrash:
            acked_seq = store.seq
        fs.crash(mode)
        recovered = _recover_cleanly(fs, key)
        _check_recovered(recovered, model, inflight, acked_seq, kept)
        if step == total:
            assert recovered.seq == final_seq
        first = _state(recovered)
        recovered.close()
        fs.crash("drop")
        again = _open(fs, key)
        assert _state(again) == first, f"second recovery differs after a crash at step {step}"
        # the recovered log takes new batches: a short one where the torn batch was
        lease = again.lease or {}
        fence = (lease["holder"], lease["epoch"]) if lease.get("holder") else ANY
        after = body_for("after", 1)
        assert again.commit(
            [Put("s", "after", after, digest_bytes_of_canonical(after), fence=fence)]
        )[0].ok
        again.close()
        fs.crash("drop")
        final = _recover_cleanly(fs, key)
        assert final.reads.read("s", "after") is not None
        assert_clean(final)
    made = _open(new_fs(), key)
    _run(made, {}, {})
    assert made.state.log.segments_made[making.replace("-", "_")] >= 2  # the workload rotates


def test_crash_during_recovery_at_every_step() -> None:
    total, _ = _total_steps(None)
    for step in range(0, total + 1, 5):
        fs = new_fs()
        store = _open(fs, None)
        model: dict[DocKey, Any] = {}
        inflight: dict[DocKey, list[Any]] = {}
        kept: Kept = {}
        fs.arm(step)
        acked_seq = 0
        try:
            acked_seq = _run(store, model, inflight, kept)
        except SimulatedCrash:
            acked_seq = store.seq
        fs.crash("torn-alternate")
        recovery_step = 0
        while True:
            fs.arm(recovery_step)
            try:
                recovered = _recover_cleanly(fs, None)
            except SimulatedCrash:
                fs.crash("drop")
                recovery_step += 1
                continue
            break
        _check_recovered(recovered, model, inflight, acked_seq, kept)
        first = _state(recovered)
        recovered.close()
        fs.crash("drop")
        assert _state(_open(fs, None)) == first


def test_acknowledged_writes_survive_power_loss_between_batches() -> None:
    fs = new_fs()
    store = _open(fs, None)
    model: dict[DocKey, Any] = {}
    kept: Kept = {}
    for step in WORKLOAD:
        if not isinstance(step, list) or any(
            isinstance(m, Rewrite) or m.fence is not ANY for m in step
        ):
            continue
        outcomes = store.commit(step)
        for mutation, outcome in zip(step, outcomes, strict=True):
            assert outcome.ok, outcome
            key = (mutation.kind, mutation.id)
            if isinstance(mutation, Put):
                model[key] = mutation.body
            else:
                model.pop(key, None)
            if mutation.kind == SESSION and outcome.changed:
                _keep(kept, mutation.id, outcome.seq, model.get(key))
        fs.crash("drop")
        store = _open(fs, None)
        assert all_documents(store) == model
        assert_clean(store)
        _check_generations(store, kept, {}, landed=False)


def test_recovering_a_mutation_list_twice_is_the_same_store() -> None:
    fs = new_fs()
    store = _open(fs, None)
    mutations: list[Mutation] = [put(f"k{n}", n) for n in range(30)]
    store.commit(mutations)
    store.close()
    once = _open(fs, None)
    assert_clean(once)
    first = _state(once)
    fs.crash("keep")
    twice = _open(fs, None)
    assert_clean(twice)
    assert _state(twice) == first
