# The trio client against a real daemon: the same ops as the blocking one, and
# a watch() that resumes with `since` across a daemon restart, skipping nothing.
from __future__ import annotations

import pytest
import trio

from sessionstore import Conflict, TrioClient
from sessionstore.errors import Fenced

from .conftest import DaemonProcess, snapshot


async def test_async_ops(running: DaemonProcess) -> None:
    async with TrioClient(running.socket_path) as client:
        await client.ping()
        assert (await client.hello())["protocol"] == 1
        saved = await client.save(snapshot("a1"), expect=None)
        with pytest.raises(Conflict):
            await client.save(snapshot("a1"), expect=None)
        assert await client.load("a1") == snapshot("a1")
        assert (await client.head("a1"))["digest"] == saved["digest"]
        assert await client.exists("a1")
        await client.update("a1", "artifacts", [{"k": 1}])
        await client.fork("a1", "a2", "/w2")
        assert (await client.load("a2"))["session"]["config"]["workspace"] == "/w2"
        assert (await client.list("a"))["ids"] == ["a1", "a2"]
        await client.checkpoint_put("workflow", "wf", {"workflow_id": "wf"})
        assert await client.checkpoint_get("workflow", "wf") == {"workflow_id": "wf"}
        assert await client.checkpoint_delete("workflow", "wf")
        lease = await client.lease_acquire("me")
        with pytest.raises(Fenced):
            await client.delete("a2")
        assert (await client.delete("a2", lease=lease))["deleted"]
        assert await client.lease_release("me", lease["epoch"])
        assert await client.lease_get() is None
        assert (await client.verify())["problems"] == []
        assert (await client.compact())["seq"] == (await client.stats())["seq"]


async def test_async_watch_resumes_across_a_restart(running: DaemonProcess) -> None:
    seen: list[dict] = []
    got_three = trio.Event()
    async with TrioClient(running.socket_path) as client:
        start = (await client.stats())["seq"]

        async def watch() -> None:
            async for event in client.watch(since=start):
                seen.append(event)
                if len(seen) == 3:
                    got_three.set()
                if len(seen) == 6:
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            for n in range(3):
                await client.save(snapshot(f"r{n}"))
            with trio.fail_after(20):
                await got_three.wait()
            await trio.to_thread.run_sync(running.stop)
            await trio.to_thread.run_sync(running.start)
            await client.aclose()
            for n in range(3, 6):
                await client.save(snapshot(f"r{n}"))
    assert [e["seq"] for e in seen] == list(range(start + 1, start + 7))
    assert [e["session_id"] for e in seen] == [f"r{n}" for n in range(6)]
