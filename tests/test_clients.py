# The three clients come from one core (op_methods.py, requests.py): the same
# public methods with the same signatures, and the asyncio one against a real
# daemon gives what the blocking one gives.
from __future__ import annotations

import asyncio
import inspect
import socket
from pathlib import Path
from typing import Any

import pytest
import trio

from sessionstore import AsyncClient, Client, Conflict, TrioClient
from sessionstore.errors import ConnectionLost, Fenced, NoDaemon, Timeout

from .conftest import DaemonProcess, snapshot

LIFECYCLE = {"close", "aclose"}  # closing a blocking socket is not awaited


def _public(cls: type) -> dict[str, inspect.Signature]:
    """Parameters of each public method (an iterator's return is sync or async)."""
    return {
        name: inspect.signature(member).replace(return_annotation=inspect.Signature.empty)
        for name, member in inspect.getmembers(cls, callable)
        if not name.startswith("_") and name not in LIFECYCLE
    }


def test_the_three_clients_have_the_same_methods_and_signatures() -> None:
    blocking = _public(Client)
    assert {"save", "load", "watch", "iter_ids", "call", "pipeline", "connect"} <= set(blocking)
    assert _public(TrioClient) == blocking
    assert _public(AsyncClient) == blocking
    for cls in (Client, TrioClient, AsyncClient):
        assert inspect.signature(cls.__init__) == inspect.signature(Client.__init__)


def test_the_asyncio_client(running: DaemonProcess) -> None:
    async def scenario() -> None:
        async with AsyncClient(running.socket_path) as client:
            await client.ping()
            saved = await client.save(snapshot("x1"), expect=None)
            with pytest.raises(Conflict):
                await client.save(snapshot("x1"), expect=None)
            assert await client.load("x1") == snapshot("x1")
            assert await client.exists("x1") is True
            await client.update("x1", "artifacts", [{"k": 1}])
            await client.fork("x1", "x2", "/w2")
            assert [i async for i in client.iter_ids("x", page=1)] == ["x1", "x2"]
            lease = await client.lease_acquire("me")
            with pytest.raises(Fenced):
                await client.delete("x2")
            assert (await client.delete("x2", lease=lease))["deleted"]
            assert await client.lease_release("me", lease["epoch"]) is True
            assert await client.checkpoint_delete("loop", "none") is False
            events = []
            async for event in client.watch(since=saved["seq"] - 1):
                events.append(event)
                if len(events) == 3:
                    break
            assert [e["seq"] for e in events] == [1, 2, 3]
            many = await asyncio.gather(*(client.head("x1") for _ in range(20)))
            assert len({m["digest"] for m in many}) == 1

    asyncio.run(scenario())
    with Client(running.socket_path) as blocking:
        assert blocking.exists("x1") is True and blocking.load("x2") is None


def test_with_no_daemon_every_client_and_adapter_names_the_socket_and_how_to_start_one(
    short_tmp: Path,
) -> None:
    nowhere = str(short_tmp / "nobody-here.sock")

    def check(error: BaseException) -> None:
        assert isinstance(error, NoDaemon) and isinstance(error, ConnectionLost)
        assert nowhere in str(error) and f"sessionstored --socket {nowhere}" in str(error)

    with pytest.raises(NoDaemon) as caught:
        Client(nowhere).ping()
    check(caught.value)

    async def on_asyncio() -> None:
        async with AsyncClient(nowhere) as client:
            await client.ping()

    with pytest.raises(NoDaemon) as caught:
        asyncio.run(on_asyncio())
    check(caught.value)

    async def on_trio() -> None:
        async with TrioClient(nowhere) as client:
            await client.ping()

    with pytest.raises(NoDaemon) as caught:
        trio.run(on_trio)
    check(caught.value)

    from sessionstore.agents import SessionStoreSession
    from sessionstore.langgraph import SessionStoreSaver

    with pytest.raises(NoDaemon) as caught:
        asyncio.run(SessionStoreSession("s", nowhere).get_items())
    check(caught.value)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    with pytest.raises(NoDaemon) as caught:
        SessionStoreSaver(nowhere).get_tuple(config)  # type: ignore[arg-type]
    check(caught.value)


def test_a_reply_that_never_comes_is_a_timeout_in_every_client(short_tmp: Path) -> None:
    """A peer that takes the connection and never answers: each client gives up after
    its timeout with Timeout, a ConnectionLost (whether a write landed is unknown)."""
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = str(short_tmp / "silent.sock")
    silent.bind(path)
    silent.listen()
    try:
        with pytest.raises(Timeout) as caught:
            Client(path, timeout=0.2).ping()
        assert isinstance(caught.value, ConnectionLost) and "0.2 s" in str(caught.value)
        patient = Client(path, timeout=600)  # a call of its own may be given less
        with pytest.raises(Timeout, match=r"0\.2 s"), patient.timeout_of(0.2):
            patient.ping()
        assert patient.timeout == 600

        async def on_asyncio() -> None:
            async with AsyncClient(path, timeout=600) as client:
                with client.timeout_of(0.2):
                    await client.ping()

        with pytest.raises(Timeout, match=r"0\.2 s"):
            asyncio.run(on_asyncio())

        async def on_trio() -> None:
            async with TrioClient(path, timeout=600) as client:
                with client.timeout_of(0.2):
                    await client.ping()

        with pytest.raises(Timeout):
            trio.run(on_trio)
    finally:
        silent.close()


def test_each_client_streams_a_backup(running: DaemonProcess) -> None:
    """Client.backup and the async clients' backup give the same stream: a header at
    the store's seq, payload messages, then the end."""
    with Client(running.socket_path) as client:
        client.save(snapshot("b1"))
        seq = client.stats()["seq"]
        messages = list(client.backup())
    assert messages[0]["seq"] == seq and messages[-1] == {"end": True, "seq": seq, "documents": 1}

    async def streamed() -> list[dict[str, Any]]:
        async with AsyncClient(running.socket_path) as client:
            return [message async for message in client.backup()]

    again = asyncio.run(streamed())
    assert again[0]["seq"] == seq and again[-1]["end"] is True
    assert sum(len(m.get("payloads", [])) for m in again) == 1


def test_each_client_goes_on_after_a_refusal_that_closed_its_connection(
    running: DaemonProcess,
) -> None:
    """A request the daemon cannot frame (a bignum, CBOR tag 2) gets bad_request with
    closing: true, and the daemon closes that connection; the same client object then
    answers the rest of a pipeline with that refusal, and its next call connects anew."""
    bad = {"op": "put", "kind": "kv", "key": "big", "value": {"v": 2**70}}
    with Client(running.socket_path) as client:
        replies = client._send_raw([{"op": "txn", "ops": [bad]}, {"op": "ping"}])
        assert [r["error"]["code"] for r in replies] == ["bad_request"] * 2
        assert replies[0]["error"]["closing"] is True
        assert client.ping() == client.ping()
        assert client.checkpoint_get("kv", "big") is None

    async def with_asyncio() -> None:
        async with AsyncClient(running.socket_path) as client:
            replies = await client._send_raw([{"op": "txn", "ops": [bad]}, {"op": "ping"}])
            assert [r["error"].get("closing") for r in replies] == [True, True]
            await client.ping()

    async def with_trio() -> None:
        async with TrioClient(running.socket_path) as client:
            replies = await client._send_raw([{"op": "txn", "ops": [bad]}, {"op": "ping"}])
            assert [r["error"].get("closing") for r in replies] == [True, True]
            await client.ping()

    asyncio.run(with_asyncio())
    trio.run(with_trio)
