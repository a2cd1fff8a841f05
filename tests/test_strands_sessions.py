# AWS Strands Agents on sessionstore, held to Strands' own tests of its session
# repositories (FileSessionManager's and S3SessionManager's: the repository each
# one is), of RepositorySessionManager driving a real Agent (a scripted model of
# our own, no network), and of its Storage protocol, ported in our words onto
# SessionStoreSessionRepository, SessionStoreSessionManager and
# SessionStoreStorage, through Strands' own package, on both engines.
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from strands import Agent
from strands.models import Model
from strands.session.repository_session_manager import RepositorySessionManager
from strands.storage import Storage
from strands.types.exceptions import SessionException
from strands.types.session import Session, SessionAgent, SessionMessage, SessionType

from sessionstore import StaleOwner
from sessionstore.strands import (
    SessionStoreSessionManager,
    SessionStoreSessionRepository,
    SessionStoreStorage,
)

from .conftest import DaemonProcess


@pytest.fixture
def repo(running: DaemonProcess) -> Iterator[SessionStoreSessionRepository]:
    repository = SessionStoreSessionRepository(running.socket_path)
    yield repository
    repository.close()


def _agent(agent_id: str = "test-agent", **state: Any) -> SessionAgent:
    return SessionAgent(agent_id=agent_id, state=state or {"key": "value"},
                        conversation_manager_state={"removed_message_count": 0})  # fmt: skip


def _message(message_id: int, text: str = "Hello world") -> SessionMessage:
    return SessionMessage.from_message({"role": "user", "content": [{"text": text}]}, message_id)


class MultiAgent:
    def __init__(self, state: dict[str, Any]) -> None:
        self.id = "test-multi-agent"
        self.state = state

    def serialize_state(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state}


def test_a_session_is_created_once_read_back_and_deleted_with_all_it_holds(
    repo: SessionStoreSessionRepository,
) -> None:
    session = Session(session_id="test-session", session_type=SessionType.AGENT)
    assert repo.create_session(session) is session
    with pytest.raises(SessionException, match="already exists"):
        repo.create_session(Session(session_id="test-session", session_type=SessionType.AGENT))
    read = repo.read_session("test-session")
    assert read is not None and read.session_id == "test-session"
    assert read.session_type == SessionType.AGENT
    assert repo.read_session("nonexistent-session") is None
    repo.create_agent("test-session", _agent())
    repo.create_message("test-session", "test-agent", _message(0))
    repo.create_multi_agent("test-session", MultiAgent({"k": 1}))  # type: ignore[arg-type]
    repo.delete_session("test-session")
    assert repo.read_session("test-session") is None
    assert repo.read_agent("test-session", "test-agent") is None
    assert repo.list_messages("test-session", "test-agent") == []
    assert repo.read_multi_agent("test-session", "test-multi-agent") is None
    with pytest.raises(SessionException, match="does not exist"):
        repo.delete_session("test-session")


def test_an_agent_reads_back_and_an_update_keeps_its_created_at(
    repo: SessionStoreSessionRepository,
) -> None:
    assert repo.read_agent("no-session", "test-agent") is None
    agent = _agent()
    repo.create_agent("test-session", agent)
    read = repo.read_agent("test-session", "test-agent")
    assert read is not None and (read.agent_id, read.state) == ("test-agent", {"key": "value"})
    updated = _agent(updated="value")
    updated.created_at = "a later time"
    repo.update_agent("test-session", updated)
    read = repo.read_agent("test-session", "test-agent")
    assert read is not None and read.state == {"updated": "value"}
    assert read.created_at == agent.created_at  # as FileSessionManager keeps it
    with pytest.raises(SessionException, match="Agent missing in session test-session"):
        repo.update_agent("test-session", _agent("missing"))


def test_messages_read_back_list_in_id_order_and_page_by_offset_and_limit(
    repo: SessionStoreSessionRepository,
) -> None:
    assert repo.read_message("no-session", "no-agent", 0) is None
    for number in (10, 2, 0, 1, 3, 4, 5, 6, 7, 8, 9):  # ids sort as numbers, not text
        repo.create_message("s", "a", _message(number, f"text {number}"))
    read = repo.read_message("s", "a", 1)
    assert read is not None and read.message_id == 1
    assert read.message == {"role": "user", "content": [{"text": "text 1"}]}
    assert repo.read_message("s", "a", 999) is None
    ids = [m.message_id for m in repo.list_messages("s", "a")]
    assert ids == list(range(11))
    assert [m.message_id for m in repo.list_messages("s", "a", limit=3)] == [0, 1, 2]
    assert [m.message_id for m in repo.list_messages("s", "a", offset=5)] == list(range(5, 11))
    assert [m.message_id for m in repo.list_messages("s", "a", limit=2, offset=9)] == [9, 10]
    assert repo.list_messages("s", "a", offset=11) == []
    assert repo.list_messages("s", "new-agent") == []


def test_a_message_update_keeps_created_at_and_a_missing_one_is_refused(
    repo: SessionStoreSessionRepository,
) -> None:
    original = _message(0)
    repo.create_message("s", "a", original)
    updated = _message(0, "Updated content")
    updated.redact_message = {"role": "user", "content": [{"text": "[redacted]"}]}
    repo.update_message("s", "a", updated)
    read = repo.read_message("s", "a", 0)
    assert read is not None and read.message["content"][0]["text"] == "Updated content"
    assert read.to_message()["content"][0]["text"] == "[redacted]"
    assert read.created_at == original.created_at
    with pytest.raises(SessionException, match="Message 7 does not exist"):
        repo.update_message("s", "a", _message(7))


@pytest.mark.parametrize("bad", ["1", None, [], True])
def test_a_message_id_must_be_an_integer(repo: SessionStoreSessionRepository, bad: Any) -> None:
    with pytest.raises(ValueError, match=r"message_id=<.*> \| message id must be an integer"):
        repo.read_message("s", "a", bad)


def test_bytes_in_a_message_round_trip(repo: SessionStoreSessionRepository) -> None:
    image = {"image": {"format": "png", "source": {"bytes": b"\x89PNG\x00\xff"}}}
    message = SessionMessage.from_message({"role": "user", "content": [image]}, 0)
    repo.create_message("s", "a", message)
    read = repo.read_message("s", "a", 0)
    assert read is not None and read.to_message() == {"role": "user", "content": [image]}


def test_multi_agent_states_are_created_read_and_updated(
    repo: SessionStoreSessionRepository,
) -> None:
    multi = MultiAgent({"key": "value"})
    assert repo.read_multi_agent("s", "test-multi-agent") is None
    with pytest.raises(SessionException, match="does not exist"):
        repo.update_multi_agent("s", multi)  # type: ignore[arg-type]
    repo.create_multi_agent("s", multi)  # type: ignore[arg-type]
    assert repo.read_multi_agent("s", "test-multi-agent") == {
        "id": "test-multi-agent", "state": {"key": "value"},
    }  # fmt: skip
    multi.state = {"key": "updated"}
    repo.update_multi_agent("s", multi)  # type: ignore[arg-type]
    assert repo.read_multi_agent("s", "test-multi-agent") == {
        "id": "test-multi-agent", "state": {"key": "updated"},
    }  # fmt: skip


class ScriptedModel(Model):
    """Answers each call with the next of its replies, in Strands' stream events; keeps
    the messages it was given."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.seen: list[list[Any]] = []

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {"context_window_limit": 100_000}

    async def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError
        yield  # pragma: no cover

    async def stream(self, messages: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.seen.append([dict(m) for m in messages])
        text = self.replies[len(self.seen) - 1]
        yield {"messageStart": {"role": "assistant"}}
        yield {"contentBlockStart": {"start": {}}}
        yield {"contentBlockDelta": {"delta": {"text": text}}}
        yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "end_turn"}}


def _texts(messages: list[Any]) -> list[str]:
    return [block["text"] for m in messages for block in m["content"] if "text" in block]


def test_an_agent_resumes_its_conversation_and_state_after_kill_9(
    running: DaemonProcess,
) -> None:
    manager = SessionStoreSessionManager("conversation", running.socket_path)
    agent = Agent(model=ScriptedModel(["hello!"]), session_manager=manager, callback_handler=None)
    agent.state.set("turns", 1)
    assert str(agent("Hi")).strip() == "hello!"
    manager.close()
    running.kill9()
    running.start()
    again = SessionStoreSessionManager("conversation", running.socket_path)
    model = ScriptedModel(["again!"])
    restored = Agent(model=model, session_manager=again, callback_handler=None)
    assert restored.state.get("turns") == 1
    assert _texts(restored.messages) == ["Hi", "hello!"]
    restored("Once more")
    assert _texts(model.seen[0]) == ["Hi", "hello!", "Once more"]
    stored = again.repository.list_messages("conversation", "default")
    assert [m.message_id for m in stored] == [0, 1, 2, 3]  # the ids go on where they stopped
    assert _texts([m.to_message() for m in stored]) == ["Hi", "hello!", "Once more", "again!"]
    again.close()


def test_two_agents_of_one_session_keep_apart_and_a_third_of_the_same_id_is_refused(
    running: DaemonProcess,
) -> None:
    repository = SessionStoreSessionRepository(running.socket_path)
    manager = RepositorySessionManager(session_id="pair", session_repository=repository)
    first = Agent(agent_id="first", model=ScriptedModel(["one"]), session_manager=manager,
                  callback_handler=None)  # fmt: skip
    second = Agent(agent_id="second", model=ScriptedModel(["two"]), session_manager=manager,
                   callback_handler=None)  # fmt: skip
    first("to first")
    second("to second")
    assert _texts([m.to_message() for m in repository.list_messages("pair", "first")]) == [
        "to first", "one",
    ]  # fmt: skip
    assert len(repository.list_messages("pair", "second")) == 2
    with pytest.raises(SessionException, match="must be unique in a session"):
        Agent(agent_id="first", model=ScriptedModel([]), session_manager=manager,
              callback_handler=None)  # fmt: skip
    repository.close()


def test_the_storage_protocol_reads_writes_lists_by_prefix_and_deletes(
    running: DaemonProcess,
) -> None:
    async def main() -> None:
        storage = SessionStoreStorage(running.socket_path)
        try:
            assert isinstance(storage, Storage)
            assert await storage.read("missing") is None
            await storage.write("sessions/abc/state.json", b'{"messages": []}')
            await storage.write("sessions/abc/blob", bytes(range(256)))
            await storage.write("sessions/abd/state.json", b"other")
            await storage.write("notes", b"n")
            assert await storage.read("sessions/abc/blob") == bytes(range(256))
            await storage.write("notes", b"overwritten")
            assert await storage.read("notes") == b"overwritten"
            assert await storage.list("sessions/abc/") == [
                "sessions/abc/blob", "sessions/abc/state.json",
            ]  # fmt: skip
            assert await storage.list("") == [
                "notes", "sessions/abc/blob", "sessions/abc/state.json", "sessions/abd/state.json",
            ]  # fmt: skip
            view = storage.namespace("sessions")
            assert await view.read("abd/state.json") == b"other"
            assert await view.list("abc") == ["abc/blob", "abc/state.json"]
            await storage.delete("notes")
            await storage.delete("notes")  # a no-op
            assert await storage.read("notes") is None
            found = await storage.search("messages")
            assert [result.key for result in found][:1] == ["sessions/abc/state.json"]
        finally:
            await storage.aclose()

    asyncio.run(main())


def test_two_workers_resume_one_session_and_only_the_owner_writes(
    running: DaemonProcess,
) -> None:
    """Worker a runs the session; worker b resumes it and takes it over; a's next turn
    is refused with StaleOwner and stores nothing."""
    first = SessionStoreSessionManager("shared", running.socket_path, owner="worker-a")
    agent_a = Agent(model=ScriptedModel(["a1", "a2"]), session_manager=first,
                    callback_handler=None)  # fmt: skip
    agent_a("one")
    second = SessionStoreSessionManager("shared", running.socket_path, owner="worker-b")
    agent_b = Agent(model=ScriptedModel(["b1"]), session_manager=second, callback_handler=None)
    with pytest.raises(StaleOwner):  # b may not write while a owns the session
        agent_b("from b, too early")
    second.take_over()
    agent_b = Agent(model=ScriptedModel(["b1"]), session_manager=SessionStoreSessionManager(
        "shared", running.socket_path, owner="worker-b"), callback_handler=None)  # fmt: skip
    agent_b("two")
    with pytest.raises(StaleOwner):  # a was fenced
        agent_a("from a, fenced")
    stored = second.repository.list_messages("shared", "default")
    assert _texts([m.to_message() for m in stored]) == ["one", "a1", "two", "b1"]
    first.close(), second.close()
