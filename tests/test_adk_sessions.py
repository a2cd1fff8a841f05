# Google ADK's session-service contract, as ADK's own tests hold every backend to
# it (the session-service tests that every backend of its registry runs, and
# DatabaseSessionService's stale-writer and concurrency tests, in google/adk-python's
# unit tests), ported in our words onto SessionStoreSessionService, through ADK's own
# package, on both engines. Where ours differs, the test says so.
from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types

from sessionstore.adk import SessionStoreSessionService

from .conftest import DaemonProcess

T = TypeVar("T")
Body = Callable[[SessionStoreSessionService], Awaitable[T]]
APP, USER = "my_app", "test_user"


@pytest.fixture
def adk(running: DaemonProcess) -> Callable[[Body[Any]], Any]:
    """Runs a test's body on a service of its own, in an asyncio loop, as ADK runs."""

    def run(body: Body[T]) -> T:
        async def main() -> T:
            service = SessionStoreSessionService(running.socket_path)
            try:
                return await body(service)
            finally:
                await service.close()

        return asyncio.run(main())

    return run


def _event(invocation: str = "invocation", **actions: Any) -> Event:
    return Event(invocation_id=invocation, author="user", actions=EventActions(**actions))


def test_a_missing_session_is_none(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        assert await service.get_session(app_name=APP, user_id=USER, session_id="123") is None

    adk(body)


def test_a_created_session_reads_back_equal_and_is_gone_once_deleted(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        created = await service.create_session(app_name=APP, user_id=USER, state={"key": "value"})
        assert (created.app_name, created.user_id, created.state) == (APP, USER, {"key": "value"})
        assert created.id and created.last_update_time <= time.time()
        got = await service.get_session(app_name=APP, user_id=USER, session_id=created.id)
        assert got == created  # its storage marker too
        await service.delete_session(app_name=APP, user_id=USER, session_id=created.id)
        assert await service.get_session(app_name=APP, user_id=USER, session_id=created.id) is None
        await service.delete_session(app_name=APP, user_id=USER, session_id=created.id)  # no-op

    adk(body)


def test_sessions_are_listed_with_their_state_and_no_events(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        for n in range(5):
            session = await service.create_session(
                app_name=APP, user_id=USER, session_id=f"session{n}", state={"key": f"value{n}"}
            )
            await service.append_event(session, _event())
        listed = (await service.list_sessions(app_name=APP, user_id=USER)).sessions
        assert [s.id for s in listed] == [f"session{n}" for n in range(5)]
        assert [s.state for s in listed] == [{"key": f"value{n}"} for n in range(5)]
        assert all(s.events == [] for s in listed)
        assert (await service.list_sessions(app_name="other", user_id=USER)).sessions == []

    adk(body)


def test_sessions_are_listed_oldest_update_first(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        for name in ("a", "b", "c"):
            await service.create_session(app_name=APP, user_id=USER, session_id=name)
        a = await service.get_session(app_name=APP, user_id=USER, session_id="a")
        assert a is not None
        later = _event()
        later.timestamp = a.last_update_time + 10
        await service.append_event(a, later)
        listed = (await service.list_sessions(app_name=APP, user_id=USER)).sessions
        assert [s.id for s in listed] == ["b", "c", "a"]

    adk(body)


def test_listing_without_a_user_lists_every_users_sessions(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        for user, session_id in (("u1", "1a"), ("u1", "1b"), ("u2", "2a")):
            await service.create_session(
                app_name=APP, user_id=user, session_id=session_id,
                state={"key": session_id, "user:name": user},
            )  # fmt: skip
        one = (await service.list_sessions(app_name=APP, user_id="u1")).sessions
        two = (await service.list_sessions(app_name=APP, user_id="u2")).sessions
        every = (await service.list_sessions(app_name=APP)).sessions
        assert sorted(s.id for s in one) == ["1a", "1b"] and [s.id for s in two] == ["2a"]
        assert {s.id: s.state for s in every} == {
            "1a": {"key": "1a", "user:name": "u1"},
            "1b": {"key": "1b", "user:name": "u1"},
            "2a": {"key": "2a", "user:name": "u2"},
        }

    adk(body)


def test_app_state_is_every_users_user_state_one_users_session_state_its_own(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        first = await service.create_session(
            app_name=APP, user_id="u1", session_id="s1",
            state={"app:k1": "v1", "user:k1": "v1", "sk1": "v1"},
        )  # fmt: skip
        await service.append_event(
            first, _event(state_delta={"app:k2": "v2", "user:k2": "v2", "sk2": "v2"})
        )
        again = await service.get_session(app_name=APP, user_id="u1", session_id="s1")
        assert again is not None and again.state == {
            "app:k1": "v1", "app:k2": "v2", "user:k1": "v1", "user:k2": "v2",
            "sk1": "v1", "sk2": "v2",
        }  # fmt: skip
        mine = await service.create_session(app_name=APP, user_id="u1", session_id="s1b")
        assert mine.state == {"app:k1": "v1", "app:k2": "v2", "user:k1": "v1", "user:k2": "v2"}
        theirs = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
        assert theirs.state == {"app:k1": "v1", "app:k2": "v2"}

    adk(body)


@pytest.mark.parametrize("scope", ["", "app:", "user:"])
def test_a_delta_replaces_a_value_whole_and_stores_none(adk: Any, scope: str) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        key = f"{scope}profile"
        session = await service.create_session(
            app_name=APP, user_id=USER, state={key: {"name": "ada", "role": "admin"}, "flag": False}
        )
        await service.append_event(session, _event(state_delta={key: {"name": "bob"}}))
        await service.append_event(session, _event(state_delta={f"{scope}gone": None, "n": True}))
        for seen in (
            session,
            await service.get_session(app_name=APP, user_id=USER, session_id=session.id),
        ):
            assert seen is not None
            assert seen.state[key] == {"name": "bob"}  # no deep merge
            assert f"{scope}gone" in seen.state and seen.state[f"{scope}gone"] is None
            assert seen.state["flag"] is False  # untouched by the unrelated deltas

    adk(body)


def test_temp_state_is_seen_in_memory_and_never_stored(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER)
        event = await service.append_event(
            session, _event(state_delta={"temp:k1": "v1", "sk": "v2"})
        )
        assert session.state["temp:k1"] == "v1"
        assert "temp:k1" not in event.actions.state_delta and event.actions.state_delta["sk"]
        stored = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert stored is not None and stored.state == {"sk": "v2"}
        assert "temp:k1" not in stored.events[0].actions.state_delta

    adk(body)


def test_a_session_is_one_users(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        first = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
        await service.append_event(first, _event())
        await service.create_session(app_name=APP, user_id="u2", session_id="s1")
        theirs = await service.get_session(app_name=APP, user_id="u2", session_id="s1")
        assert theirs is not None and theirs.user_id == "u2" and theirs.events == []

    adk(body)


def test_creating_an_existing_id_is_already_exists(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        await service.create_session(app_name=APP, user_id=USER, session_id="s", state={"k": 1})
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name=APP, user_id=USER, session_id="s")
        with pytest.raises(AlreadyExistsError):  # the id as InMemorySessionService strips it
            await service.create_session(app_name=APP, user_id=USER, session_id="  s  ")
        kept = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert kept is not None and kept.state == {"k": 1}
        blank = await service.create_session(app_name=APP, user_id=USER, session_id="   ")
        assert blank.id.strip()

    adk(body)


def test_a_padded_id_reads_and_deletes_as_the_stripped_one(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        created = await service.create_session(app_name=APP, user_id=USER, session_id="order-42\n")
        assert created.id == "order-42"
        padded = await service.get_session(app_name=APP, user_id=USER, session_id="order-42\n")
        assert padded is not None and padded.id == "order-42"
        await service.delete_session(app_name=APP, user_id=USER, session_id="order-42\n")
        assert await service.get_session(app_name=APP, user_id=USER, session_id="order-42") is None

    adk(body)


def test_every_field_of_an_event_reads_back_equal(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER)
        event = Event(
            invocation_id="invocation",
            author="agent",
            timestamp=1700000000.123,
            content=types.Content(
                role="model",
                parts=[
                    types.Part(text="text"),
                    types.Part.from_bytes(data=b"test_image_data", mime_type="image/png"),
                ],
            ),
            actions=EventActions(
                artifact_delta={"file": 0},
                transfer_to_agent="agent",
                escalate=True,
                requested_tool_confirmations={
                    "call": ToolConfirmation(hint="ok?", confirmed=False, payload={"n": 1})
                },
            ),
            long_running_tool_ids={"tool1"},
            error_code="error_code",
            error_message="error_message",
            interrupted=True,
            turn_complete=True,
            custom_metadata={"custom": {"nested": [1, 2.5, "three"]}},
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=1, candidates_token_count=2, total_token_count=3
            ),
            grounding_metadata=types.GroundingMetadata(
                search_entry_point=types.SearchEntryPoint(sdk_blob=b"blob")
            ),
            input_transcription=types.Transcription(text="in", finished=True),
            output_transcription=types.Transcription(text="out", finished=True),
        )
        await service.append_event(session, event)
        assert await service.get_session(app_name=APP, user_id=USER, session_id=session.id) == (
            session
        )

    adk(body)


def test_an_events_timestamp_is_the_sessions_last_update_time(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER)
        original = session.last_update_time
        event = _event()
        event.timestamp = original + 10
        await service.append_event(session, event)
        stored = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert stored is not None
        assert session.last_update_time == stored.last_update_time == event.timestamp > original

    adk(body)


def test_get_session_config_reads_the_newest_events_and_those_after_a_time(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER)
        base = time.time()
        for n in range(1, 6):
            event = _event(f"invocation {n}")
            event.timestamp = base + n
            await service.append_event(session, event)

        async def read(**config: Any) -> list[float]:
            got = await service.get_session(
                app_name=APP, user_id=USER, session_id=session.id,
                config=GetSessionConfig(**config) if config else None,
            )  # fmt: skip
            assert got is not None
            return [event.timestamp - base for event in got.events]

        assert await read() == [1, 2, 3, 4, 5]
        assert await read(num_recent_events=0) == []
        assert await read(num_recent_events=3) == [3, 4, 5]
        assert await read(num_recent_events=30) == [1, 2, 3, 4, 5]
        assert await read(after_timestamp=base + 4) == [4, 5]  # at or after it
        assert await read(after_timestamp=base + 100) == []
        assert await read(num_recent_events=1, after_timestamp=base + 4) == [5]
        assert await read(num_recent_events=3, after_timestamp=base + 4) == [4, 5]

    adk(body)


def test_a_partial_event_is_neither_applied_nor_stored(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER)
        partial = Event(invocation_id="i", author="agent", partial=True,
                        actions=EventActions(state_delta={"k": "v"}))  # fmt: skip
        await service.append_event(session, partial)
        stored = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert session.events == [] and "k" not in session.state
        assert stored is not None and stored.events == [] and stored.state == {}

    adk(body)


def test_user_state_is_one_users_in_one_app(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        assert await service.get_user_state(app_name=APP, user_id="u1") == {}
        session = await service.create_session(
            app_name=APP, user_id="u1", state={"user:ctx": {"v": 1}}
        )
        assert await service.get_user_state(app_name=APP, user_id="u1") == {"ctx": {"v": 1}}
        for counter in (1, 2):
            await service.append_event(
                session,
                _event(state_delta={"user:profile": {"name": "Alice"}, "user:counter": counter,
                                    "session_key": 1}),
            )  # fmt: skip
        assert await service.get_user_state(app_name=APP, user_id="u1") == {
            "ctx": {"v": 1}, "profile": {"name": "Alice"}, "counter": 2,
        }  # fmt: skip
        assert await service.get_user_state(app_name=APP, user_id="u2") == {}
        assert await service.get_user_state(app_name="other", user_id="u1") == {}

    adk(body)


def test_a_state_value_json_cannot_hold_is_stored_as_its_text(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER)
        await service.append_event(session, _event(state_delta={"callback": lambda: 1, "ok": 2}))
        stored = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert stored is not None and len(stored.events) == 1
        assert stored.state["ok"] == 2 and isinstance(stored.state["callback"], str)

    adk(body)


def test_appending_to_a_deleted_session_is_session_not_found(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER)
        await service.delete_session(app_name=APP, user_id=USER, session_id=session.id)
        with pytest.raises(SessionNotFoundError):
            await service.append_event(session, _event())

    adk(body)


def test_a_stale_session_is_refused_and_writes_nothing(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        original = await service.create_session(app_name=APP, user_id=USER)
        await service.append_event(original, _event("inv1", state_delta={"sk1": "v1"}))
        updated = await service.get_session(app_name=APP, user_id=USER, session_id=original.id)
        assert updated is not None
        await service.append_event(updated, _event("inv2", state_delta={"sk2": "v2"}))
        assert len(original.events) == 1 and "sk2" not in original.state
        with pytest.raises(StaleSessionError, match="modified in storage"):
            await service.append_event(original, _event("inv3", state_delta={"sk3": "v3"}))
        stored = await service.get_session(app_name=APP, user_id=USER, session_id=original.id)
        assert stored is not None
        assert [e.invocation_id for e in stored.events] == ["inv1", "inv2"]
        assert stored.state == {"sk1": "v1", "sk2": "v2"}
        copied = stored.model_copy(deep=True)  # a copy carries its marker: current
        await service.append_event(copied, _event("inv4"))
        with pytest.raises(StaleSessionError) as raised:
            await service.append_event(stored, _event("inv5"))
        assert isinstance(raised.value, ValueError)

    adk(body)


def test_of_two_copies_appending_at_once_exactly_one_wins_each_round(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER)
        for round_number in range(8):
            latest = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
            assert latest is not None
            copies = [latest.model_copy(deep=True) for _ in range(2)]
            outcomes = await asyncio.gather(
                *(
                    service.append_event(c, _event(state_delta={f"sk{round_number}-{n}": True}))
                    for n, c in enumerate(copies, start=1)
                ),
                return_exceptions=True,
            )
            refused = [o for o in outcomes if isinstance(o, BaseException)]
            assert len(refused) == 1 and isinstance(refused[0], StaleSessionError)
            assert "modified in storage" in str(refused[0])
        stored = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert stored is not None and len(stored.events) == 8
        for n in range(8):
            assert (f"sk{n}-1" in stored.state) != (f"sk{n}-2" in stored.state)

    adk(body)


def test_a_current_session_appends_whatever_its_clock_says(adk: Any) -> None:
    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER)
        await service.append_event(session, _event())
        session.last_update_time -= 0.0001  # the marker still matches
        await service.append_event(session, _event())
        markerless = copy.deepcopy(session)
        markerless._storage_update_marker = None
        markerless.last_update_time -= 0.0001  # its newest event is the stored newest
        await service.append_event(markerless, _event())
        stored = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert stored is not None and len(stored.events) == 3
        stale = copy.deepcopy(session)  # two events behind, no marker: refused
        stale._storage_update_marker = None
        with pytest.raises(StaleSessionError):
            await service.append_event(stale, _event())

    adk(body)


def test_events_read_back_in_the_order_appended(adk: Any) -> None:
    """DatabaseSessionService sorts events by timestamp and then id; ours keeps the order
    they were committed in, as InMemorySessionService does (the same whenever no event
    is older than the one before it, as the Runner makes them)."""

    async def body(service: SessionStoreSessionService) -> None:
        session = await service.create_session(app_name=APP, user_id=USER)
        for event_id in ("event_z", "event_a", "event_m"):
            event = _event(event_id)
            event.id, event.timestamp = event_id, 100.0
            await service.append_event(session, event)
        stored = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert stored is not None and [e.id for e in stored.events] == [
            "event_z", "event_a", "event_m",
        ]  # fmt: skip

    adk(body)
