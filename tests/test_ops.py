# The ops in process, over a real store on the simulated file system and a real
# writer task (the way the writer's tests run): one test group per ops module,
# plus dispatch itself (registry, access check, refusals).
from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import Any

import cbor2
import pytest
import trio

from sessionstore.wire.canonical import snapshot_digest
from sessionstore.wire.protocol import RawCBOR, Request, parse_request
from sessionstored.access import Access
from sessionstored.front.connection import raw_bytes
from sessionstored.ops import ARGUMENTS, REGISTRY, OpContext, dispatch
from sessionstored.ops.steps import Exclusive, Read, Reply, Write
from sessionstored.ops.watch import Broadcaster
from sessionstored.storage.log.cache import DocumentCache
from sessionstored.writer.writer import Writer

from .storage_helpers import new_fs, open_store


def _snapshot(session_id: str, **extra: Any) -> dict[str, Any]:
    return {"schema_version": 1, "session": {"id": session_id, **extra}}


class Harness:
    def __init__(self, ops: OpContext) -> None:
        self.ops = ops

    async def call(self, op: str, access: Access = Access.FULL, **args: Any) -> dict[str, Any]:
        request: Request = parse_request({"op": op, **args})
        step = dispatch(self.ops, request, access)
        if isinstance(step, (Write, Exclusive)):  # as the server does, through the outbox
            await self.ops.writer.enqueue(step.job)
            await step.job.wait()
            reply = step.reply()
        else:
            reply = await step.resolve()
        for name, value in reply.items():  # what the wire would carry
            if isinstance(value, RawCBOR):
                reply[name] = cbor2.loads(value.data)
        return reply


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    store = open_store(new_fs())
    writer = Writer(store, on_fatal=lambda reason: None)
    broadcaster = Broadcaster(store)
    writer.on_publish = broadcaster.published
    ops = OpContext(
        store,
        writer,
        broadcaster,
        max_snapshot_bytes=1 << 20,
        max_request_bytes=1 << 20,
        stats_extra=dict,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        yield Harness(ops)
        writer.close()
    ops.offload.close()


def test_every_op_of_the_contract_is_registered_once_with_its_arguments() -> None:
    contract = {
        "hello", "ping", "save", "load", "head", "exists", "list", "delete", "update",
        "fork", "checkpoint_put", "checkpoint_get", "checkpoint_delete", "lease_acquire",
        "lease_get", "lease_release", "watch", "stats", "verify", "compact",
    }  # fmt: skip
    added = {"checkpoint_scan", "checkpoint_rank", "txn", "backup", "expire", "history", "revert",
             "advance_clock"}  # fmt: skip
    assert set(REGISTRY) == contract | added
    assert ARGUMENTS["update"] == {
        "session_id", "component", "value", "expect", "lease", "ttl_s"
    }  # fmt: skip
    read_only = {name for name, op in REGISTRY.items() if op.read_only}
    assert read_only == {
        "hello", "ping", "load", "head", "exists", "list", "checkpoint_get",
        "lease_get", "watch", "stats", "verify", "checkpoint_scan", "checkpoint_rank", "backup",
        "history",
    }  # fmt: skip


async def test_dispatch_refuses_unknown_ops_bad_arguments_and_writes_from_readers(
    harness: Harness,
) -> None:
    assert (await harness.call("nope"))["error"]["code"] == "unknown_op"
    assert (await harness.call("load"))["error"]["code"] == "bad_request"
    refused = await harness.call("save", Access.READ_ONLY, snapshot=_snapshot("r"))
    assert refused["error"]["code"] == "unauthorized"
    assert (await harness.call("load", Access.READ_ONLY, session_id="r"))["snapshot"] is None
    refreshing = await harness.call("load", Access.READ_ONLY, session_id="r", refresh_ttl_s=5)
    assert refreshing["error"]["code"] == "unauthorized"  # a refresh writes
    assert isinstance(dispatch(harness.ops, parse_request({"op": "ping"})), Reply)
    assert isinstance(dispatch(harness.ops, parse_request({"op": "stats"})), Read)


async def test_sessions(harness: Harness) -> None:
    snap = _snapshot("s1", config={"workspace": "/a"})
    saved = await harness.call("save", snapshot=snap)
    assert saved["ok"] and saved["digest"] == snapshot_digest(snap) and saved["seq"] == 1
    assert (await harness.call("load", session_id="s1"))["snapshot"] == snap
    conflict = await harness.call("save", snapshot=snap, expect=None)
    assert conflict["error"]["code"] == "conflict" and conflict["error"]["current"]
    updated = await harness.call("update", session_id="s1", component="artifacts", value=[1])
    assert updated["digest"] == snapshot_digest({**snap, "artifacts": [1]})
    forked = await harness.call("fork", session_id="s1", new_session_id="s2", workspace="/b")
    copy = (await harness.call("load", session_id="s2"))["snapshot"]
    assert copy["session"]["config"]["workspace"] == "/b"
    assert forked["digest"] == snapshot_digest(copy)
    listed = await harness.call("list", prefix="s")
    assert listed["ids"] == ["s1", "s2"] and listed["next"] is None
    head = await harness.call("head", session_id="s2")
    assert head["found"] and head["digest"] == forked["digest"]
    assert (await harness.call("delete", session_id="s1"))["deleted"] is True
    assert (await harness.call("exists", session_id="s1"))["exists"] is False
    missing = await harness.call("update", session_id="zz", component="artifacts", value=[])
    assert missing["error"]["code"] == "not_found"


async def test_checkpoints(harness: Harness) -> None:
    value = {"run_id": "r1", "step": 3}
    assert (await harness.call("checkpoint_put", kind="loop", key="r1", value=value))["ok"]
    got = await harness.call("checkpoint_get", kind="loop", key="r1")
    assert got["value"] == value
    wrong = await harness.call("checkpoint_put", kind="loop", key="r2", value=value)
    assert wrong["error"]["code"] == "bad_request"
    assert (await harness.call("checkpoint_delete", kind="loop", key="r1"))["deleted"] is True
    assert (await harness.call("checkpoint_get", kind="loop", key="r1"))["value"] is None


async def test_leases_fence_writers(harness: Harness) -> None:
    granted = await harness.call("lease_acquire", holder="me")
    assert granted["epoch"] == 1
    fenced = await harness.call("save", snapshot=_snapshot("l"))
    assert fenced["error"]["code"] == "fenced"
    lease = {"holder": "me", "epoch": 1}
    assert (await harness.call("save", snapshot=_snapshot("l"), lease=lease))["ok"]
    assert (await harness.call("lease_get"))["lease"]["holder"] == "me"
    assert (await harness.call("lease_release", holder="me", epoch=1))["released"] is True
    assert (await harness.call("save", snapshot=_snapshot("l")))["ok"]


async def test_admin(harness: Harness) -> None:
    hello = await harness.call("hello")
    assert hello["protocol"] == 1 and hello["capabilities"]["watch"] is True
    await harness.call("save", snapshot=_snapshot("a"))
    stats = await harness.call("stats")
    assert stats["sessions"] == 1 and stats["internal_errors"] == 0
    assert (await harness.call("verify"))["problems"] == []
    compacted = await harness.call("compact")
    assert compacted["ok"] and compacted["seq"] == 1


class _ThreadWatchingCache:
    """The store's read cache, noting the thread of every use."""

    def __init__(self, cache: DocumentCache) -> None:
        self.cache = cache
        self.threads: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        self.threads.add(threading.get_ident())
        return getattr(self.cache, name)


async def test_the_read_cache_is_used_only_on_the_event_loop(harness: Harness) -> None:
    """Large and small documents read at once, overwritten meanwhile, through a cache
    small enough to evict: every read gets its latest generation, and the cache (which
    is not thread-safe) is touched only by the event loop's thread."""
    store = harness.ops.store
    watching = _ThreadWatchingCache(DocumentCache(1024 * 1024))
    store.state.cache = watching
    large, small = 200 * 1024, 2 * 1024  # over and under the size read in a thread
    generation = {f"d{n}": 0 for n in range(12)}
    committed = dict(generation)  # what a read must see at least: acknowledged saves

    def snapshot(name: str) -> dict[str, Any]:
        size = large if int(name[1:]) % 2 else small
        return _snapshot(name, blob=name.encode() * (size // 3), generation=generation[name])

    for name in generation:
        assert (await harness.call("save", snapshot=snapshot(name)))["ok"]

    async def reader(name: str) -> None:
        for _ in range(15):
            seen = committed[name]
            reply = await harness.call("load", session_id=name)
            assert reply["ok"], reply
            assert reply["snapshot"]["session"]["generation"] >= seen

    async def writer() -> None:
        for round_ in range(10):
            for name in list(generation)[round_ % 2 :: 2]:
                generation[name] += 1
                assert (await harness.call("save", snapshot=snapshot(name)))["ok"]
                committed[name] = generation[name]
            await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        for name in generation:
            nursery.start_soon(reader, name)
    assert watching.threads == {threading.get_ident()}
    assert watching.cache.hits and watching.used_bytes <= 1024 * 1024


async def test_scans_and_loads_racing_compaction_never_miss_a_segment(harness: Harness) -> None:
    """Large values overwritten while `compact` runs in a loop: every scan and load that
    reads in a thread finds its segment, though compaction unlinks it meanwhile."""
    blob = b"v" * (160 * 1024)  # over the size read in a thread
    keys = [f"k{n}" for n in range(6)]

    async def put_all(round_: int) -> None:
        for key in keys:
            value = {"round": round_, "blob": blob}
            reply = await harness.call("checkpoint_put", kind="kv", key=key, value=value)
            assert reply["ok"], reply

    await put_all(0)
    done = trio.Event()

    async def churn() -> None:
        for round_ in range(1, 25):
            await put_all(round_)
            assert (await harness.call("compact"))["ok"]
        done.set()

    async def scan() -> None:
        while not done.is_set():
            reply = await harness.call("checkpoint_scan", kind="kv", prefix="k")
            assert reply["ok"], reply
            assert [item["key"] for item in reply["items"]] == keys
            reply = await harness.call("checkpoint_get", kind="kv", key="k3")
            assert reply["ok"], reply

    async with trio.open_nursery() as nursery:
        nursery.start_soon(churn)
        for _ in range(3):
            nursery.start_soon(scan)
    assert harness.ops.store.state.log._pins == {}  # every pin released


def test_a_reply_counts_the_stored_bytes_it_carries_wherever_they_are() -> None:
    """What decides that a JSON reply is encoded in a worker, off the event loop: a
    checkpoint_scan's values count as much as a load's snapshot."""
    body = RawCBOR(b"\xa0" * 1000)
    assert raw_bytes({"ok": True, "snapshot": body}) == 1000
    scan = {"ok": True, "items": [{"key": f"k{n}", "value": body} for n in range(8)], "next": None}
    assert raw_bytes(scan) == 8000
    assert raw_bytes({"ok": True, "ids": ["a", "b"]}) == 0
