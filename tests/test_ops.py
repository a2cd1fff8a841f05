# The ops in process, over a real store on the simulated file system and a real
# writer task (the way the writer's tests run): one test group per ops module,
# plus dispatch itself (registry, access check, refusals).
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import cbor2
import pytest
import trio

from sessionstore.canonical import snapshot_digest
from sessionstore.protocol import RawCBOR, Request, parse_request
from sessionstored.access import Access
from sessionstored.ops import ARGUMENTS, REGISTRY, Ops
from sessionstored.steps import Exclusive, Read, Reply, Write
from sessionstored.watch import Broadcaster
from sessionstored.writer import Writer

from .storage_helpers import new_fs, open_store


def _snapshot(session_id: str, **extra: Any) -> dict[str, Any]:
    return {"schema_version": 1, "session": {"id": session_id, **extra}}


class Harness:
    def __init__(self, ops: Ops) -> None:
        self.ops = ops

    async def call(self, op: str, access: Access = Access.FULL, **args: Any) -> dict[str, Any]:
        request: Request = parse_request({"op": op, **args})
        step = self.ops.dispatch(request, access)
        if isinstance(step, (Write, Exclusive)):
            await self.ops.writer.enqueue(step.job)
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
    ops = Ops(
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
    added = {"checkpoint_scan", "txn"}  # ours, documented in the README
    assert set(REGISTRY) == contract | added
    assert ARGUMENTS["update"] == {"session_id", "component", "value", "expect", "lease"}
    read_only = {name for name, op in REGISTRY.items() if op.read_only}
    assert read_only == {
        "hello", "ping", "load", "head", "exists", "list", "checkpoint_get",
        "lease_get", "watch", "stats", "verify", "checkpoint_scan",
    }  # fmt: skip


async def test_dispatch_refuses_unknown_ops_bad_arguments_and_writes_from_readers(
    harness: Harness,
) -> None:
    assert (await harness.call("nope"))["error"]["code"] == "unknown_op"
    assert (await harness.call("load"))["error"]["code"] == "bad_request"
    refused = await harness.call("save", Access.READ_ONLY, snapshot=_snapshot("r"))
    assert refused["error"]["code"] == "unauthorized"
    assert (await harness.call("load", Access.READ_ONLY, session_id="r"))["snapshot"] is None
    assert isinstance(harness.ops.dispatch(parse_request({"op": "ping"})), Reply)
    assert isinstance(harness.ops.dispatch(parse_request({"op": "stats"})), Read)


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
