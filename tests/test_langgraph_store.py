# SessionStoreStore, LangGraph's BaseStore on a real daemon, on both engines,
# held to LangGraph's own stores: random batches of puts, deletes, gets,
# filtered searches and namespace listings give what InMemoryStore gives
# (hypothesis); updates keep created_at and search orders by updated_at, as
# PostgresStore does; a batch's puts are one txn; processes share one store;
# items expire (and a read may refresh them); a graph uses it through
# LangGraph's runtime; and the store survives kill -9.
from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchItem,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore

from sessionstore.errors import SessionStoreError
from sessionstore.langgraph import SessionStoreStore

from .conftest import DaemonProcess
from .wall_clock import advance_past

REPO = Path(__file__).resolve().parent.parent
ROOTS = itertools.count()  # each example its own root label: one daemon for all of them

LABELS = ["a", "b", "c/d", "é"]
KEYS = ["k", "k/2", "ü", "x" * 300]  # the last one longer than a key part holds
values = st.fixed_dictionaries(
    {
        "n": st.integers(0, 4),
        "s": st.sampled_from(["x", "y"]),
        "nested": st.fixed_dictionaries({"m": st.integers(0, 2)}),
        "tags": st.lists(st.sampled_from(["p", "q"]), max_size=2),
    }
)
filters = st.sampled_from(
    [
        None,
        {"s": "x"},
        {"n": {"$gt": 1}},
        {"n": {"$gte": 2, "$lt": 4}},
        {"n": {"$lte": 1}, "s": {"$ne": "x"}},
        {"nested": {"m": 1}},
        {"tags": ["p"]},
        {"s": {"$eq": "y"}},
    ]
)


def namespaces(min_size: int = 1) -> st.SearchStrategy[tuple[str, ...]]:
    return st.lists(st.sampled_from(LABELS), min_size=min_size, max_size=3).map(tuple)


def _rooted(root: str, namespace: tuple[str, ...]) -> tuple[str, ...]:
    return (root, *namespace)


writes = st.tuples(st.just("put"), namespaces(), st.sampled_from(KEYS), values) | st.tuples(
    st.just("delete"), namespaces(), st.sampled_from(KEYS), st.none()
)
reads = st.one_of(
    st.tuples(st.just("get"), namespaces(), st.sampled_from(KEYS)),
    st.tuples(st.just("search"), namespaces(0), filters),
    st.tuples(
        st.just("list"),
        st.lists(st.sampled_from([*LABELS, "*"]), max_size=2).map(tuple),
        st.lists(st.sampled_from([*LABELS, "*"]), max_size=2).map(tuple),
        st.none() | st.integers(1, 3),
    ),
)


def _op(root: str, step: tuple[Any, ...]) -> Any:
    name = step[0]
    if name in ("put", "delete"):
        return PutOp(_rooted(root, step[1]), step[2], step[3])
    if name == "get":
        return GetOp(_rooted(root, step[1]), step[2])
    if name == "search":
        return SearchOp(_rooted(root, step[1]), step[2], limit=1000)
    conditions = [MatchCondition("prefix", (root, *step[1]))]
    if step[2]:
        conditions.append(MatchCondition("suffix", step[2]))
    return ListNamespacesOp(tuple(conditions), step[3], limit=1000)


def _comparable(result: Any) -> Any:
    """A result without its timestamps; a search's items as a set (orders differ:
    InMemoryStore keeps insertion order, PostgresStore and ours updated_at)."""
    if isinstance(result, list) and result and hasattr(result[0], "key"):
        return sorted((i.namespace, i.key, repr(sorted(i.value.items()))) for i in result)
    if hasattr(result, "key"):
        return (result.namespace, result.key, result.value)
    return result


def _embed(texts: list[str]) -> list[list[float]]:
    """A deterministic embedding: 8 numbers from each text's SHA-256."""
    return [[b / 255 - 0.5 for b in hashlib.sha256(t.encode()).digest()[:8]] for t in texts]


INDEX: Any = {"dims": 8, "embed": _embed, "fields": ["text"]}
WORDS = ["apple", "river", "cloud"]


def _indexed_op(root: str, step: tuple[Any, ...]) -> Any:
    """Puts with a text unique to their item (no two items tie on a score), indexed by
    the config, not at all, or at another path; searches with a query."""
    name = step[0]
    namespace = _rooted(root, step[1])
    if name == "put":
        item = f"{namespace} {step[2]}"  # InMemoryStore cannot embed one text for two items
        value = {**step[3], "text": f"{step[4]} {item}", "other": f"{step[4]} other {item}"}
        return PutOp(namespace, step[2], value, index=step[5])
    if name == "search":
        return SearchOp(namespace, step[2], limit=step[4], offset=step[5], query=step[3])
    return _op(root, step)


indexed_steps = st.one_of(
    st.tuples(st.just("put"), namespaces(), st.sampled_from(KEYS), values,
              st.sampled_from(WORDS), st.sampled_from([None, False, ["other"]])),
    st.tuples(st.just("delete"), namespaces(), st.sampled_from(KEYS), st.none()),
    st.tuples(st.just("search"), namespaces(0), filters, st.sampled_from(WORDS),
              st.integers(1, 6), st.integers(0, 3)),
)  # fmt: skip


def _scored(result: Any) -> Any:
    if isinstance(result, list) and result and hasattr(result[0], "score"):
        return [(i.namespace, i.key, None if i.score is None else round(i.score, 4))
                for i in result]  # fmt: skip
    return _comparable(result)


def _ranked_and_count(items: list[Any]) -> list[Any]:
    """The ranked items in order, then as many placeholders as items without a vector."""
    ranked = [i for i in items if i.score is not None]
    return ranked + [UNRANKED] * (len(items) - len(ranked))


UNRANKED = SearchItem(namespace=(), key="(without a vector)", value={}, created_at=datetime.min,
                      updated_at=datetime.min, score=None)  # fmt: skip


def _without_empty_namespaces(reference: InMemoryStore) -> None:
    """InMemoryStore lists a namespace whose items were all deleted (and one a get
    asked for); PostgresStore and ours list those with items."""
    for namespace in [ns for ns, items in reference._data.items() if not items]:
        del reference._data[namespace]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=st.lists(st.lists(writes | reads, min_size=1, max_size=6), min_size=1, max_size=6))
def test_random_batches_give_what_in_memory_store_gives(
    running: DaemonProcess, batches: list[list[tuple[Any, ...]]]
) -> None:
    root = f"r{next(ROOTS)}"
    store = SessionStoreStore(running.socket_path)
    reference = InMemoryStore()
    try:
        for batch in batches:
            ops = [_op(root, step) for step in batch]
            _without_empty_namespaces(reference)
            # the listings first: InMemoryStore's gets add the namespaces they ask for
            listings = {n: reference.batch([op])[0] for n, op in enumerate(ops)
                        if isinstance(op, ListNamespacesOp)}  # fmt: skip
            expected = reference.batch(ops)
            expected = [listings.get(n, result) for n, result in enumerate(expected)]
            got = store.batch(ops)
            assert [_comparable(g) for g in got] == [_comparable(e) for e in expected], ops
    finally:
        store.close()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=st.lists(st.lists(indexed_steps, min_size=1, max_size=6), min_size=1, max_size=6))
def test_semantic_search_ranks_as_in_memory_store_ranks(
    running: DaemonProcess, batches: list[list[tuple[Any, ...]]]
) -> None:
    """With an index, search(query=...) gives InMemoryStore's items in its order, with its
    scores (to 4 places: vectors rest as float32), past offsets and filters, and the
    items without a vector after the ranked ones."""
    root = f"s{next(ROOTS)}"
    store = SessionStoreStore(running.socket_path, index=INDEX)
    reference = InMemoryStore(index=INDEX)
    try:
        for batch in batches:
            ops = [_indexed_op(root, step) for step in batch]
            expected = reference.batch(ops)
            got = store.batch(ops)
            unordered = [
                n for n, op in enumerate(ops) if isinstance(op, SearchOp)
                and any(getattr(i, "score", 0) is None for i in expected[n] or [])
            ]  # fmt: skip
            for n in unordered:  # items without a vector: in key order here, insertion there
                if len(expected[n]) == ops[n].limit:  # so a limit keeps other ones of them
                    got[n], expected[n] = _ranked_and_count(got[n]), _ranked_and_count(expected[n])
                else:
                    got[n], expected[n] = sorted(got[n], key=repr), sorted(expected[n], key=repr)
            assert [_scored(g) for g in got] == [_scored(e) for e in expected], ops
    finally:
        store.close()


@pytest.mark.parametrize(
    "daemon_keeps", [True, False], ids=["kept by the daemon", "read first (a daemon without)"]
)
def test_an_update_keeps_created_at_and_search_orders_by_updated_at(
    running: DaemonProcess, daemon_keeps: bool
) -> None:
    store = SessionStoreStore(running.socket_path)
    if not daemon_keeps:  # as with a daemon whose hello lacks txn_keep
        store._daemon_keeps = False
    for key in ("first", "second", "third"):
        store.put(("docs",), key, {"v": key})
    created = store.get(("docs",), "first")
    assert created is not None and created.created_at == created.updated_at
    store.put(("docs",), "first", {"v": "again"})
    updated = store.get(("docs",), "first")
    assert updated is not None and updated.value == {"v": "again"}
    assert updated.created_at == created.created_at < updated.updated_at
    assert [i.key for i in store.search(("docs",))] == ["first", "third", "second"]
    assert [i.key for i in store.search(("docs",), limit=1, offset=1)] == ["third"]
    store.delete(("docs",), "first")
    store.put(("docs",), "first", {"v": "new"})  # a new item: a new created_at
    again = store.get(("docs",), "first")
    assert again is not None and again.created_at > created.created_at


@pytest.mark.parametrize("namespace", [("foo.bar",), ("foo", ""), (123,)])
def test_a_bad_namespace_label_is_refused_before_anything_is_sent(
    running: DaemonProcess, namespace: Any
) -> None:
    store = SessionStoreStore(running.socket_path)
    with running.client() as client:
        seq = client.stats()["seq"]
    for op in (GetOp(namespace, "k"), PutOp(namespace, "k", {"v": 1}), SearchOp(namespace)):
        with pytest.raises(InvalidNamespaceError):
            store.batch([PutOp(("fine",), "k", {"v": 1}), op])
    with pytest.raises(InvalidNamespaceError):
        store.list_namespaces(prefix=namespace)
    with running.client() as client:
        assert client.stats()["seq"] == seq  # nothing of those batches was written
    store.put(("tenant", "a_%", "*"), "k", {"v": 1})  # LIKE and wildcard characters are labels
    assert [i.key for i in store.search(("tenant", "a_%"))] == ["k"]
    assert store.list_namespaces(prefix=("tenant", "*")) == [("tenant", "a_%", "*")]
    assert store.search(("tenant", "a_")) == []


def test_a_search_with_a_query_and_no_index_ignores_the_query(running: DaemonProcess) -> None:
    """As InMemoryStore and PostgresStore: a store made without an index answers
    search(query=...) with the items the same search without a query gives, filtered
    and paged, sync and async."""
    store = SessionStoreStore(running.socket_path)
    for n in range(5):
        store.put(("plain",), f"k{n}", {"n": n, "text": f"item {n}"})
    for options in ({}, {"filter": {"n": {"$gte": 2}}}, {"limit": 2, "offset": 1}):
        without = store.search(("plain",), **options)
        assert store.search(("plain",), query="item 3", **options) == without
        assert asyncio.run(store.asearch(("plain",), query="item 3", **options)) == without


def test_namespace_rules_through_the_methods_and_through_batch(running: DaemonProcess) -> None:
    """LangGraph's own namespace rules: an empty namespace, an empty label or one with
    a period is refused everywhere; a namespace whose root label is "langgraph" is
    refused by put but taken by batch and abatch, and "langgraph" below the root is an
    ordinary label. Each stored item is read, searched (with a query too) and deleted."""
    store = SessionStoreStore(running.socket_path)
    value = {"foo": "bar"}
    for namespace in ((), ("the", "thing.about"), ("some", "fun", ""), ("langgraph", "foo")):
        with pytest.raises(InvalidNamespaceError):
            store.put(namespace, "k", value)
        with pytest.raises(InvalidNamespaceError):
            asyncio.run(store.aput(namespace, "k", value))

    async def through_async(namespace: tuple[str, ...], via_batch: bool) -> None:
        if via_batch:
            await store.abatch([PutOp(namespace, "bar", value)])
        else:
            await store.aput(namespace, "bar", value)
        got = await store.aget(namespace, "bar")
        assert got is not None and got.value == value
        assert [i.value for i in await store.asearch(namespace)] == [value]
        assert [i.value for i in await store.asearch(namespace, query="bar")] == [value]
        await store.adelete(namespace, "bar")
        assert await store.aget(namespace, "bar") is None

    for namespace, via_batch in (
        (("foo", "langgraph", "foo"), False),
        (("langgraph", "foo"), True),
    ):
        asyncio.run(through_async(namespace, via_batch))
        if via_batch:
            store.batch([PutOp(namespace, "bar", value)])
        else:
            store.put(namespace, "bar", value)
        got = store.get(namespace, "bar")
        assert got is not None and got.value == value
        assert [i.value for i in store.search(namespace)] == [value]
        assert [i.value for i in store.search(namespace, query="bar")] == [value]
        store.delete(namespace, "bar")
        assert store.get(namespace, "bar") is None


def test_a_dotted_filter_key_reaches_into_nested_maps(running: DaemonProcess) -> None:
    store = SessionStoreStore(running.socket_path)
    store.put(("dotted",), "nested", {"user": {"access-level": "high", "n": 3}})
    store.put(("dotted",), "literal", {"user.access-level": "high"})
    store.put(("dotted",), "other", {"user": {"access-level": "low"}})
    found = store.search(("dotted",), filter={"user.access-level": "high"})
    assert sorted(i.key for i in found) == ["literal", "nested"]
    assert [i.key for i in store.search(("dotted",), filter={"user.n": {"$gt": 2}})] == ["nested"]


def test_a_batch_reads_before_it_writes_and_its_puts_are_one_txn(running: DaemonProcess) -> None:
    store = SessionStoreStore(running.socket_path)
    store.put(("b",), "old", {"v": 0})
    results = store.batch(
        [
            PutOp(("b",), "new", {"v": 1}),
            GetOp(("b",), "new"),  # before the batch's puts, as InMemoryStore reads
            PutOp(("b",), "new", {"v": 2}),  # the last put of a key wins
            PutOp(("b",), "old", None),
        ]
    )
    assert results[1] is None
    got = store.get(("b",), "new")
    assert got is not None and got.value == {"v": 2}
    assert store.get(("b",), "old") is None
    with running.client() as client:
        seq = client.stats()["seq"]
    with pytest.raises(SessionStoreError):  # one bad put: nothing of the batch is stored
        store.batch([PutOp(("b",), "fine", {"v": 3}), PutOp(("b",), "bad", {"v": 1 << 70})])
    assert store.get(("b",), "fine") is None
    with running.client() as client:
        assert client.stats()["seq"] == seq


def test_processes_share_one_store(running: DaemonProcess) -> None:
    script = (
        "import sys\n"
        "from sessionstore.langgraph import SessionStoreStore\n"
        "store = SessionStoreStore(sys.argv[1])\n"
        "for n in range(50):\n"
        "    store.put(('shared', sys.argv[2]), str(n), {'n': n})\n"
        "    store.put(('shared',), 'counter', {'last': sys.argv[2]})\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}"}
    children = [
        subprocess.Popen([sys.executable, "-c", script, running.socket_path, f"p{n}"], env=env)
        for n in range(4)
    ]
    assert [child.wait(timeout=120) for child in children] == [0] * 4
    store = SessionStoreStore(running.socket_path)
    assert store.list_namespaces(prefix=("shared",)) == [
        ("shared",), *[("shared", f"p{n}") for n in range(4)]
    ]  # fmt: skip
    for n in range(4):
        found = store.search(("shared", f"p{n}"), limit=100)
        assert sorted(int(i.key) for i in found) == list(range(50))
    counter = store.get(("shared",), "counter")
    assert counter is not None and counter.value["last"] in {f"p{n}" for n in range(4)}


def test_items_expire_and_a_read_may_refresh_them(running: DaemonProcess) -> None:
    store = SessionStoreStore(running.socket_path, ttl={"default_ttl": 0.02})  # 1.2 s
    assert store.supports_ttl
    store.put(("t",), "default", {"v": 1})  # the config's default_ttl
    store.put(("t",), "own", {"v": 2}, ttl=0.01)
    store.put(("t",), "forever", {"v": 3}, ttl=None)
    store.put(("t",), "refreshed", {"v": 4})
    with running.client() as client:
        for step in range(5):  # 2.5 s of the daemon's clock: reads keep "refreshed" alive
            client.call("advance_clock", by_ms=500)
            assert store.get(("t",), "refreshed") is not None  # refresh_on_read: True
            alive = store.get(("t",), "default", refresh_ttl=False) is not None
            assert alive == (step < 2)  # until 1.2 s after its put
    assert store.get(("t",), "own") is None
    assert store.get(("t",), "default") is None
    assert {i.key for i in store.search(("t",))} == {"forever", "refreshed"}
    store.put(("gone",), "k", {"v": 1}, ttl=0.005)
    sweeper = store.start_ttl_sweeper()  # PostgresStore's calls: the daemon sweeps itself
    with running.client() as client:
        client.call("advance_clock", by_ms=1000)
    assert ("gone",) not in store.list_namespaces()
    assert store.sweep_ttl() == 0 and not sweeper.done()
    assert store.stop_ttl_sweeper() and sweeper.done()
    for bad in (-1, 0, math.nan, 1e12, "5"):
        with pytest.raises(SessionStoreError) as refused:
            store.put(("t",), "bad", {"v": 1}, ttl=bad)
        assert refused.value.code == "bad_request"
    with pytest.raises(ValueError, match="default_ttl"):
        SessionStoreStore(running.socket_path, ttl={"default_ttl": -1})


@pytest.mark.parametrize("in_async", [False, True], ids=["sync", "async"])
def test_an_item_read_with_refresh_outlives_its_ttl_and_expires_after(
    running: DaemonProcess, in_async: bool
) -> None:
    """PostgresStore's ttl test: get and search (with a query, on a store without an
    index) with refresh_ttl set the item's expiry ttl from now again, a read without
    it does not, and past that expiry a search finds nothing."""
    store = SessionStoreStore(running.socket_path, ttl={"default_ttl": 1, "refresh_on_read": True})
    namespace = ("ttl", "async" if in_async else "sync")

    def expiry() -> int:
        with running.client() as client:
            (item,) = client.checkpoint_scan("kv", store._namespace_prefix(namespace))["items"]
        return int(item["expires_at_ms"])

    async def reads() -> list[Any]:
        return [
            await store.aget(namespace, "item1", refresh_ttl=True),
            await store.asearch(namespace, query="foo", refresh_ttl=True),
            await store.aget(namespace, "item1", refresh_ttl=False),
        ]

    store.put(namespace, "item1", {"foo": "bar"}, ttl=0.03)  # 1.8 s
    first = expiry()
    with running.client() as client:  # a refresh now sets a later expiry than before
        client.call("advance_clock", by_ms=1000)
    if in_async:
        refreshed, found, plain = asyncio.run(reads())
    else:
        refreshed = store.get(namespace, "item1", refresh_ttl=True)
        found = store.search(namespace, query="foo", refresh_ttl=True)
        plain = store.get(namespace, "item1", refresh_ttl=False)
    assert refreshed is not None and plain is not None and len(found) == 1
    last = expiry()
    assert last > first
    assert store.get(namespace, "item1", refresh_ttl=False) is not None and expiry() == last
    with running.client() as client:
        advance_past(client, last)
    assert store.search(namespace, query="bar", refresh_ttl=False) == []
    assert store.get(namespace, "item1") is None


def test_the_async_methods_and_kill_9(running: DaemonProcess) -> None:
    async def main() -> None:
        store = SessionStoreStore(running.socket_path)
        try:
            await store.aput(("async", "ns"), "k", {"v": [1, 2]})
            got = await store.aget(("async", "ns"), "k")
            assert got is not None and got.value == {"v": [1, 2]}
            assert [i.key for i in await store.asearch(("async",), filter={"v": [1, 2]})] == ["k"]
            assert await store.alist_namespaces(prefix=("async",)) == [("async", "ns")]
        finally:
            await store.aclose()

    asyncio.run(main())
    running.kill9()
    running.start()
    got = SessionStoreStore(running.socket_path).get(("async", "ns"), "k")
    assert got is not None and got.value == {"v": [1, 2]}


class _State(TypedDict):
    user: str
    remembered: list[str]


def test_a_graph_keeps_memories_through_langgraphs_runtime(running: DaemonProcess) -> None:
    def remember(state: _State, runtime: Runtime[None]) -> dict[str, Any]:
        assert runtime.store is not None
        namespace = ("memories", state["user"])
        count = len(runtime.store.search(namespace))
        runtime.store.put(namespace, f"m{count}", {"text": f"visit {count}"})
        return {"remembered": [i.value["text"] for i in runtime.store.search(namespace)]}

    graph = StateGraph(_State)
    graph.add_node("remember", remember)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", END)
    app = graph.compile(store=SessionStoreStore(running.socket_path))
    for _ in range(3):
        result = app.invoke({"user": "ada", "remembered": []})
    assert sorted(result["remembered"]) == ["visit 0", "visit 1", "visit 2"]
    fresh = SessionStoreStore(running.socket_path)  # another store object, same daemon
    assert len(fresh.search(("memories", "ada"))) == 3


def test_an_unindexed_put_after_an_indexed_one_in_one_batch_keeps_the_vector(
    running: DaemonProcess,
) -> None:
    """LangGraph keeps the last of two puts of one item in a batch; a put with
    index=False leaves the item's vectors as they were, in InMemoryStore and in
    PostgresStore (which embeds only the puts it indexes, and deletes no vectors)."""
    store = SessionStoreStore(running.socket_path, index=INDEX)
    reference = InMemoryStore(index=INDEX)
    first = [_indexed_op("u", ("put", ("a",), "k", {"n": 0}, "apple", None))]
    second = [
        _indexed_op("u", ("put", ("a",), "k", {"n": 0}, "apple", None)),
        _indexed_op("u", ("put", ("a",), "k", {"n": 0}, "apple", False)),
    ]
    search = [_indexed_op("u", ("search", (), None, "apple", 1, 0))]
    try:
        for batch in (first, second, search):
            assert [_scored(g) for g in store.batch(batch)] == [
                _scored(e) for e in reference.batch(batch)
            ]
    finally:
        store.close()
