# What a user imports: the three clients by their names, every error class with a
# word on when it is raised, the old names still there with a warning, one version,
# and adapters that run on a client the caller already has (and leave it open).
from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
import warnings

import pytest
from langgraph.checkpoint.base import empty_checkpoint

import sessionstore
from sessionstore import AsyncClient, Client, TrioClient, errors
from sessionstore.agents import AdvancedSessionStoreSession, SessionStoreSession
from sessionstore.langgraph import SessionStoreSaver, SessionStoreStore

from .conftest import DaemonProcess, snapshot


def test_every_error_class_is_exported_and_says_when_it_is_raised() -> None:
    classes = {
        name
        for name, member in vars(errors).items()
        if inspect.isclass(member) and issubclass(member, errors.SessionStoreError)
    }
    assert len(classes) == 25
    assert classes <= set(sessionstore.__all__)
    for name in classes:
        assert getattr(sessionstore, name).__doc__, name
    assert set(errors.ERROR_CLASSES) == {code.value for code in errors.ErrorCode}


TIERS = {
    errors.InputError: {"bad_request", "unknown_op", "invalid_snapshot", "too_large"},
    errors.PreconditionFailed: {"not_found", "conflict", "fenced", "compacted"},
    errors.RetryLater: {"overloaded", "shutting_down", "no_space", "io_error"},
}


def test_each_wire_error_is_of_the_tier_that_says_what_to_do_with_it() -> None:
    for tier, codes in TIERS.items():
        assert {c for c, cls in errors.ERROR_CLASSES.items() if issubclass(cls, tier)} == codes
    untiered = {c for c, cls in errors.ERROR_CLASSES.items() if not issubclass(cls, tuple(TIERS))}
    assert untiered == {"unauthorized", "read_only", "internal"}
    fenced = errors.error_from_wire(
        {"code": "fenced", "message": "m", "holder": "worker-a", "epoch": 7}
    )
    assert isinstance(fenced, errors.Fenced) and (fenced.holder, fenced.epoch) == ("worker-a", 7)
    compacted = errors.error_from_wire({"code": "compacted", "message": "m", "oldest_seq": 40})
    assert isinstance(compacted, errors.Compacted) and compacted.oldest_seq == 40


def test_the_clients_have_one_name_each() -> None:
    assert sessionstore.AsyncClient.__module__ == "sessionstore.asyncio_client"
    assert sessionstore.TrioClient.__module__ == "sessionstore.trio_client"
    assert sessionstore.Client.__module__ == "sessionstore.client"


def test_the_old_names_still_work_and_warn() -> None:
    with pytest.warns(DeprecationWarning, match="sessionstore.AsyncClient"):
        assert sessionstore.AsyncioClient is AsyncClient  # type: ignore[attr-defined]
    sys.modules.pop("sessionstore.aclient", None)
    with pytest.warns(DeprecationWarning, match="sessionstore.TrioClient"):
        old = importlib.import_module("sessionstore.aclient")
    assert old.AsyncClient is TrioClient
    with pytest.raises(AttributeError):
        sessionstore.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018


def test_one_version_everywhere() -> None:
    from importlib import metadata

    import sessionstored

    assert sessionstore.__version__ == sessionstored.__version__
    assert metadata.version("sessionstore") == sessionstore.__version__


def _config(thread: str) -> dict[str, dict[str, str]]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def test_the_langgraph_adapters_run_on_a_blocking_client_they_leave_open(
    running: DaemonProcess,
) -> None:
    with Client(running.socket_path) as client:
        saver = SessionStoreSaver(client=client)
        assert saver.socket_path == client.socket_path
        written = saver.put(_config("t1"), empty_checkpoint(), {}, {})
        assert saver.get_tuple(written) is not None
        store = SessionStoreStore(client=client)
        store.put(("users",), "u1", {"name": "Ada"})
        item = store.get(("users",), "u1")
        assert item is not None and item.value == {"name": "Ada"}
        saver.close()
        store.close()
        client.ping()  # still open: the adapters did not close the caller's client
        assert client.exists("nobody") is False


def test_the_langgraph_adapters_run_their_async_methods_on_an_asyncio_client(
    running: DaemonProcess,
) -> None:
    async def scenario() -> None:
        async with AsyncClient(running.socket_path) as client:
            saver = SessionStoreSaver(client=client)
            written = await saver.aput(_config("t2"), empty_checkpoint(), {}, {})
            assert await saver.aget_tuple(written) is not None
            assert saver.get_tuple(written) is not None
            await saver.aclose()
            saver.close()
            await client.ping()

    asyncio.run(scenario())


def test_the_agents_sessions_run_on_an_asyncio_client_they_leave_open(
    running: DaemonProcess,
) -> None:
    async def scenario() -> None:
        async with AsyncClient(running.socket_path) as client:
            session = SessionStoreSession("s1", client=client)
            await session.add_items([{"role": "user", "content": "hi"}])
            assert await session.get_items() == [{"role": "user", "content": "hi"}]
            await session.close()
            advanced = AdvancedSessionStoreSession(session_id="s2", client=client)
            await advanced.add_items([{"role": "user", "content": "yo"}])
            assert [item["content"] for item in await advanced.get_items()] == ["yo"]  # type: ignore[typeddict-item]
            await advanced.close()
            await client.save(snapshot("s3"))  # still open
            assert await client.exists("s3") is True

    asyncio.run(scenario())


def test_an_adapter_takes_a_socket_or_a_client_not_both(running: DaemonProcess) -> None:
    with Client(running.socket_path) as client, pytest.raises(TypeError, match="not both"):
        SessionStoreSaver(running.socket_path, client=client)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SessionStoreStore(running.socket_path).close()  # no warning on the plain path
