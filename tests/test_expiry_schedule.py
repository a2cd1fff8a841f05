# The log engine's expiry schedule against the store: it holds the expiries of the
# live documents (a rewrite or a removal takes the old one out, within a constant
# factor of them), what it hands the sweep is each live document's current expiry
# once, and taking due entries does a bounded amount of work per call, stale entries
# counted, between which the sweep lets the event loop serve others. Time is the
# sweep's argument here (due_expirations' now_ms), not the clock, except where the sweep
# itself reads the clock: there the stale entries expired in 1970.
from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstored.storage.documents import NEVER
from sessionstored.storage.log import expiries as expiries_module
from sessionstored.storage.log.expiries import Expiries
from sessionstored.storage.log.store import Store
from sessionstored.storage.mutations import Expire, Put
from sessionstored.writer import sweeper as sweeper_module
from sessionstored.writer.sweeper import DUE_PER_PASS, Sweeper
from sessionstored.writer.writer import Writer

from .storage_helpers import new_fs, open_store, put, remove

SOON_MS = 3_000_000_000_000  # the year 2065: far enough that the wall clock expires nothing
LATER_MS = 4_000_000_000_000
KEYS = 500
REWRITES = 20
LIMIT = 100  # entries per due_expirations call
# what the schedule may hold: a few entries per live document that expires, and slack
ENTRIES_PER_LIVE = 4
SLACK_ENTRIES = 2_048


def _expiring(session_id: str, value: object, expires_at_ms: int) -> Put:
    return dataclasses.replace(put(session_id, value), expires_at_ms=expires_at_ms)


def _entries(store: Store) -> int:
    return int(store.stats()["expiry_schedule_entries"])


def _all_due(store: Store, now_ms: int) -> list[Expire]:
    due: list[Expire] = []
    while (upcoming := store.expiry.next_ms()) is not None and upcoming <= now_ms:
        due += store.expiry.due(now_ms, LIMIT)
    return due


def test_rewrites_leave_the_schedule_a_constant_factor_of_the_live_documents() -> None:
    store = open_store(new_fs())
    for rewrite in range(REWRITES):
        store.commit([_expiring(f"s{n}", rewrite, LATER_MS + rewrite) for n in range(KEYS)])
        assert _entries(store) <= ENTRIES_PER_LIVE * KEYS + SLACK_ENTRIES
    assert sorted(_all_due(store, LATER_MS + REWRITES)) == sorted(
        Expire("s", f"s{n}", LATER_MS + REWRITES - 1) for n in range(KEYS)
    )


def test_removals_and_rewrites_without_expiry_take_theirs_out() -> None:
    store = open_store(new_fs())
    for round_number in range(REWRITES):
        store.commit([_expiring(f"s{n}", round_number, LATER_MS) for n in range(KEYS)])
        if round_number % 2:
            store.commit([remove(f"s{n}") for n in range(KEYS)])
        else:
            store.commit([put(f"s{n}", round_number) for n in range(KEYS)])
        assert _entries(store) <= SLACK_ENTRIES
    assert _all_due(store, LATER_MS) == []


def test_stale_entries_that_come_due_are_taken_a_bounded_number_per_call() -> None:
    store = open_store(new_fs())
    store.commit([_expiring(f"s{n}", 0, SOON_MS + n) for n in range(KEYS)])
    store.commit([_expiring(f"s{n}", 1, LATER_MS) for n in range(KEYS)])  # the first go stale
    calls = 0
    while (upcoming := store.expiry.next_ms()) is not None and upcoming < LATER_MS:
        before = _entries(store)
        assert store.expiry.due(LATER_MS - 1, LIMIT) == []
        assert before - _entries(store) <= LIMIT
        calls += 1
    assert calls >= KEYS // LIMIT
    assert len(store.expiry.due(LATER_MS, 2 * KEYS)) == KEYS


async def test_the_sweep_lets_others_run_between_passes_over_stale_entries() -> None:
    store = open_store(new_fs())
    stale = 10 * DUE_PER_PASS
    store.commit([_expiring(f"s{n}", 0, 1 + n) for n in range(stale)])
    store.commit([_expiring(f"s{n}", 1, LATER_MS) for n in range(stale)])
    sweeper = Sweeper(store, Writer(store, on_fatal=lambda reason: None))
    others_ran = 0

    async def another_client() -> None:
        nonlocal others_ran
        while True:
            await trio.sleep(0)
            others_ran += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(another_client)
        due = await sweeper._due()
        nursery.cancel_scope.cancel()
    assert due == [] and store.expiry.next_ms() == LATER_MS
    assert others_ran >= stale // DUE_PER_PASS // 2


def test_a_rewrite_moves_or_cancels_the_expiry_and_a_removal_drops_it() -> None:
    store = open_store(new_fs())
    names = ("moved", "cancelled", "removed", "kept")
    store.commit([_expiring(name, 0, SOON_MS) for name in names])
    store.commit([_expiring("moved", 1, LATER_MS), put("cancelled", 1), remove("removed")])
    assert store.expiry.due(SOON_MS, LIMIT) == [Expire("s", "kept", SOON_MS)]
    assert store.expiry.due(LATER_MS, LIMIT) == [Expire("s", "moved", LATER_MS)]
    assert store.expiry.next_ms() is None


def test_a_failed_sweep_is_due_again_unless_the_document_was_written_since() -> None:
    store = open_store(new_fs())
    store.commit([_expiring("failed", 0, SOON_MS), _expiring("rewritten", 0, SOON_MS)])
    taken = store.expiry.due(SOON_MS, LIMIT)
    assert sorted(taken) == [Expire("s", "failed", SOON_MS), Expire("s", "rewritten", SOON_MS)]
    store.commit([_expiring("rewritten", 1, LATER_MS)])
    for expire in taken:
        store.expiry.retry(expire)
    assert store.expiry.due(SOON_MS, LIMIT) == [Expire("s", "failed", SOON_MS)]
    assert store.expiry.due(LATER_MS, LIMIT) == [Expire("s", "rewritten", LATER_MS)]


def test_a_restart_schedules_each_live_expiry_once() -> None:
    fs = new_fs()
    store = open_store(fs)
    for rewrite in range(3):
        store.commit([_expiring(f"s{n}", rewrite, LATER_MS) for n in range(KEYS)])
    store.commit([put(f"s{n}", "plain") for n in range(KEYS // 2)])
    store.close()
    reopened = open_store(fs)
    assert _entries(reopened) == KEYS - KEYS // 2
    assert len(_all_due(reopened, LATER_MS)) == KEYS - KEYS // 2


# The schedule alone against a dict of the pending expiries, with drains made frequent:
# the sweep never sleeps past a pending expiry, takes each one once and only while it is
# pending, takes at most limit entries per call, and the entries held stay within a
# constant factor of the pending ones. The bound is a drain's worst case: it starts
# with 2 L + S + 1 entries (L pending) and ends within a quarter as many changes (at
# least four entries moved per change), while cancellations may halve L meanwhile.
DRAIN_TEST_STALE_MIN = 3
schedule_ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.sampled_from("abcd"), st.integers(NEVER, 60)),
        st.tuples(st.just("due"), st.integers(0, 64), st.integers(1, 3)),
        st.tuples(st.just("sweep"), st.integers(0, 64), st.integers(1, 3)),
    ),
    max_size=100,
)
rewrites = st.lists(  # many changes between sweeps: what grows stale entries
    st.tuples(st.just("set"), st.sampled_from("ab"), st.integers(NEVER, 60)),
    min_size=50,
    max_size=150,
)


def _kind_of(key: str) -> str:
    return "kv" if key < "c" else "loop"


def _bound(pending: int) -> int:
    return 5 * pending + 3 * DRAIN_TEST_STALE_MIN + 10


@settings(max_examples=200, deadline=None)
@given(st.one_of(schedule_ops, rewrites))
def test_the_schedule_matches_a_dict_of_pending_expiries(ops: list[tuple[str, Any, int]]) -> None:
    with mock.patch.object(expiries_module, "STALE_ENTRIES_MIN", DRAIN_TEST_STALE_MIN):
        schedule, model = Expiries(), dict[str, int]()
        for name, arg, number in ops:
            if name == "set":
                schedule.schedule(_kind_of(arg), arg, number)
                if number == NEVER:
                    model.pop(arg, None)
                else:
                    model[arg] = number
            else:
                calls = 1 if name == "due" else len(schedule) + 1
                for _ in range(calls):
                    held = len(schedule)
                    taken = schedule.due(arg, number)
                    assert held - len(schedule) <= number and len(taken) <= number
                    for kind, key, expires_at_ms in taken:
                        assert kind == _kind_of(key) and model.pop(key) == expires_at_ms <= arg
                if name == "sweep":
                    assert all(expires_at_ms > arg for expires_at_ms in model.values())
            upcoming = schedule.next_ms()
            if model:
                assert upcoming is not None and upcoming <= min(model.values())
            assert len(schedule) <= _bound(len(model))


async def test_a_generation_the_writer_finds_unexpired_stays_scheduled() -> None:
    """The clock set back between the sweep's reading of it and the writer's: the writer
    leaves the generation alone, and it must come due again, not leave the schedule."""
    store = open_store(new_fs())
    store.commit([_expiring("later", 0, SOON_MS), _expiring("gone", 0, 1)])
    writer = Writer(store, on_fatal=lambda reason: None)
    sweeper = Sweeper(store, writer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        with mock.patch.object(sweeper_module, "epoch_ms", lambda: SOON_MS):
            assert await sweeper.sweep_round()
        nursery.cancel_scope.cancel()
    assert sweeper.expired == 1 and store.reads.head("s", "gone") is None
    assert store.reads.head("s", "later") is not None
    assert store.expiry.next_ms() == SOON_MS
    assert store.expiry.due(SOON_MS, LIMIT) == [Expire("s", "later", SOON_MS)]
