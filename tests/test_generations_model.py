# The log's earlier generations against a model, on the in-process simulated file
# system: hypothesis runs saves, deletes, reverts (also to generations no longer
# kept), compactions (also one copying while a save replaces a record it copies,
# as the daemon's background compaction does), index checkpoints, restarts with
# another --keep-generations and power losses, and after each step every
# session's generations, read back whole, are the model's. Then a revert crashed
# at every syscall is all or nothing.
from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sessionstore.wire.codes import ErrorCode
from sessionstored.storage.log.store import Store
from sessionstored.storage.mutations import SESSION, Rewrite

from .simfs import SimFileSystem, SimulatedCrash
from .storage_helpers import assert_clean, body_for, new_fs, open_store, put, remove

IDS = ("a", "b", "c")


def revert(session_id: str, at: int) -> Rewrite:
    def apply(_current: bytes | None, earlier: bytes | None) -> bytes | None:
        assert earlier is not None  # the model only reverts sessions that exist
        return earlier

    return Rewrite(SESSION, session_id, apply, source=(SESSION, session_id), source_at=at)


class Model:
    """Each session's generations since it was last created, oldest first: (seq, body)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.generations: dict[str, list[tuple[int, bytes]]] = {}

    def kept(self, session_id: str) -> list[tuple[int, bytes]]:
        return list(reversed(self.generations.get(session_id, [])[-(self.keep + 1) :]))

    def written(self, session_id: str, seq: int, body: bytes) -> None:
        self.generations.setdefault(session_id, []).append((seq, body))
        del self.generations[session_id][: -(self.keep + 1)]

    def at(self, session_id: str, seq: int) -> bytes | None:
        """The body current at seq, None when it is no longer kept."""
        return next((body for s, body in self.kept(session_id) if s <= seq), None)


def assert_matches(store: Store, model: Model) -> None:
    for session_id in IDS:
        entries = store.reads.generations(SESSION, session_id)
        kept = model.kept(session_id)
        assert [e.seq for e in entries] == [seq for seq, _ in kept], session_id
        for entry, (_, body) in zip(entries, kept, strict=True):
            assert store.reads.read_generation(SESSION, session_id, entry).body == body
            assert entry.committed_at_ms > 0


SEGMENT_BYTES = 16 * 1024  # a few saves fill a segment: compactions find records to copy
save_step = st.tuples(st.just("save"), st.sampled_from(IDS), st.integers(0, 3))
step = st.one_of(
    *[save_step] * 3,  # three times as likely as each other step
    st.tuples(st.just("delete"), st.sampled_from(IDS), st.just(0)),
    st.tuples(st.just("revert"), st.sampled_from(IDS), st.integers(0, 8)),
    st.tuples(st.just("compact"), st.just(""), st.just(0)),
    st.tuples(st.just("compact_while_saving"), st.sampled_from(IDS), st.integers(0, 3)),
    st.tuples(st.just("checkpoint"), st.just(""), st.just(0)),
    st.tuples(st.just("restart"), st.just(""), st.integers(0, 4)),
    st.tuples(st.just("power_loss"), st.just(""), st.just(0)),
)


@settings(max_examples=200, deadline=None)
@given(keep=st.integers(0, 4), steps=st.lists(step, max_size=40))
@example(  # kept generations before an index checkpoint come back from it
    keep=2,
    steps=[("save", "a", 0), ("save", "a", 1), ("checkpoint", "", 0), ("restart", "", 2)],
)
@example(  # a's current record is copied while a save replaces it: an earlier one, kept
    keep=1,
    steps=[("save", "a", 0), *[("save", "b", 0)] * 24, ("compact_while_saving", "a", 1)],
)
def test_earlier_generations_follow_the_model(keep: int, steps: list[tuple[str, str, int]]) -> None:
    fs = new_fs()
    store = open_store(fs, keep_generations=keep, segment_bytes=SEGMENT_BYTES)
    model = Model(keep)
    saves = 0

    def save(session_id: str, n: int) -> None:
        nonlocal saves
        saves += 1
        body = body_for(session_id, f"{n}-{saves}" + "x" * 3000)  # segments fill
        (outcome,) = store.commit([put(session_id, f"{n}-{saves}" + "x" * 3000)])
        model.written(session_id, outcome.seq, body)

    for action, session_id, n in steps:
        if action == "save":
            save(session_id, n)
        elif action == "delete":
            store.commit([remove(session_id)])
            model.generations.pop(session_id, None)
        elif action == "revert" and model.kept(session_id):
            at = model.kept(session_id)[0][0] - n  # n seqs before the current one
            (outcome,) = store.commit([revert(session_id, at)])
            wanted = model.at(session_id, at)
            if wanted is None:
                assert outcome.refused is not None
                assert outcome.refused.code == ErrorCode.COMPACTED
                assert outcome.refused.details["oldest_seq"] == model.kept(session_id)[-1][0]
            else:
                assert outcome.refused is None
                model.written(session_id, outcome.seq, wanted)
        elif action == "compact":
            store.compact()
        elif action == "compact_while_saving":  # planned, copied, a save, switched in
            work = store.compactor.choose(everything=True)
            if work is not None:
                store.compactor.copy(work)
            save(session_id, n)
            if work is not None:
                store.compactor.switch(work)
                store.checkpointing.write()
                store.state.log.close_retired()
        elif action == "checkpoint":
            store.checkpointing.write()
        elif action in ("restart", "power_loss"):
            store.close()
            if action == "power_loss":
                fs.crash("drop")  # every acknowledged batch was synced
            else:
                # a smaller --keep-generations: the oldest beyond go (a larger one keeps more
                # from then on, and may find earlier ones still in the log: not modelled)
                model.keep = keep = min(n, keep)
                model.generations = {i: g[-(keep + 1) :] for i, g in model.generations.items()}
            store = open_store(fs, keep_generations=keep, segment_bytes=SEGMENT_BYTES)
        assert_matches(store, model)
    assert_clean(store)
    store.close()


def _with_generations(fs: SimFileSystem) -> tuple[Store, list[Any]]:
    store = open_store(fs, keep_generations=3)
    outcomes = [store.commit([put("s", n)])[0] for n in range(3)]
    return store, outcomes


def test_a_revert_crashed_at_every_syscall_is_all_or_nothing() -> None:
    step = 0
    while True:
        fs = new_fs()
        store, saved = _with_generations(fs)
        before = [e.seq for e in store.reads.generations(SESSION, "s")]
        fs.arm(step)
        try:
            store.commit([revert("s", saved[0].seq)])
            finished = True
        except SimulatedCrash:
            finished = False
        fs.crash("drop")
        store = open_store(fs, keep_generations=3)
        after = [e.seq for e in store.reads.generations(SESSION, "s")]
        current = store.reads.read(SESSION, "s")
        assert current is not None
        if after == before:  # the revert did not reach its sync
            assert current.body == body_for("s", 2)
        else:  # it did: whole, one generation more, the old body under a new seq
            assert after == [before[0] + 1, *before]
            assert current.body == body_for("s", 0)
        assert_clean(store)
        store.close()
        if finished:
            return
        step += 1
