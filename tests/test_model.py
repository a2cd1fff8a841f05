# A hypothesis state machine: the store against a dict, step by step, with
# CAS, deletes, clean restarts and power loss between operations.
from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sessionstore.wire.canonical import digest_bytes_of_canonical
from sessionstored.storage.log.store import Store
from sessionstored.storage.mutations import ANY

from .simfs import CRASH_MODES
from .storage_helpers import assert_clean, body_for, new_fs, open_store, put, remove, snapshot_of

SEGMENT_BYTES = 16 * 1024

IDS = st.sampled_from(["a", "b", "c/d", "../e", "ü" * 3, "x" * 300])
EXPECT_MODES = st.sampled_from(["any", "absent", "current", "stale"])


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fs = new_fs()
        self.store = self._open()
        self.model: dict[str, bytes] = {}
        self.seq = 0

    def _expect(self, session_id: str, mode: str) -> Any:
        current = self.model.get(session_id)
        if mode == "any":
            return ANY
        if mode == "absent":
            return None
        if mode == "current":
            return digest_bytes_of_canonical(current) if current is not None else None
        return digest_bytes_of_canonical(body_for(session_id, "never-stored"))

    def _expect_met(self, session_id: str, expect: Any) -> bool:
        if expect is ANY:
            return True
        current = self.model.get(session_id)
        return expect == (digest_bytes_of_canonical(current) if current is not None else None)

    @rule(session_id=IDS, value=st.integers(0, 5), mode=EXPECT_MODES)
    def save(self, session_id: str, value: int, mode: str) -> None:
        expect = self._expect(session_id, mode)
        [outcome] = self.store.commit([put(session_id, value, expect)])
        if self._expect_met(session_id, expect):
            assert outcome.ok
            self.seq += 1
            assert outcome.seq == self.seq
            self.model[session_id] = body_for(session_id, value)
        else:
            assert outcome.code == "conflict"

    @rule(session_id=IDS, mode=EXPECT_MODES)
    def delete(self, session_id: str, mode: str) -> None:
        expect = self._expect(session_id, mode)
        [outcome] = self.store.commit([remove(session_id, expect)])
        if not self._expect_met(session_id, expect):
            assert outcome.code == "conflict"
            return
        assert outcome.ok and outcome.existed == (session_id in self.model)
        if session_id in self.model:
            self.seq += 1
            del self.model[session_id]
        assert outcome.seq == self.seq

    @rule(ids=st.lists(IDS, min_size=2, max_size=5), value=st.integers(0, 5))
    def batch(self, ids: list[str], value: int) -> None:
        outcomes = self.store.commit([put(i, value) for i in ids])
        for session_id, outcome in zip(ids, outcomes, strict=True):
            assert outcome.ok
            self.seq += 1
            self.model[session_id] = body_for(session_id, value)
        assert self.store.seq == self.seq

    def _open(self) -> Store:
        return open_store(self.fs, segment_bytes=SEGMENT_BYTES)

    @rule(value=st.integers(0, 5), size=st.integers(100, 3000))
    def rewrite_everything(self, value: int, size: int) -> None:
        ids = sorted(self.model)
        if ids:
            self.store.commit([put(i, [value, "p" * size]) for i in ids])
            self.seq += len(ids)
            self.model.update({i: body_for(i, [value, "p" * size]) for i in ids})

    @rule()
    def compact(self) -> None:
        self.store.compact()

    @rule()
    def compact_if_due(self) -> None:
        if self.store.compactor.due():
            self.store.compact()

    @rule(mode=st.sampled_from(CRASH_MODES))
    def restart(self, mode: str) -> None:
        if mode == "keep":
            self.store.close()
        self.fs.crash(mode)
        self.store = self._open()

    @invariant()
    def matches_model(self) -> None:
        assert {k: v for k, (_s, v) in snapshot_of(self.store).items()} == self.model
        assert self.store.seq == self.seq
        ids, _ = self.store.reads.list_sessions("", None, 100)
        assert ids == sorted(self.model, key=lambda s: s.encode())

    def teardown(self) -> None:
        assert_clean(self.store)


StoreMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestStoreMachine = StoreMachine.TestCase
