# Google ADK's session service on sessionstore: `SessionStoreSessionService`,
# a `BaseSessionService` over the asyncio client, for ADK's Runner and
# everything else that takes a session service.
#
# Layout, under PREFIX ("adk/"), each name part percent-encoded (keyparts.py):
#   s/APP/USER/SESSION        the session: {"id", "app", "user", "t", "last"}, t its
#                             last_update_time, last the id of its newest event
#   v/APP/USER/SESSION/KEY    one key of its own state: {"k": key, "v": value}
#   e/APP/USER/SESSION/SEQ    one event, its JSON as ADK's SQLite service writes it,
#                             appended by txn: the daemon picks the key (the seq of
#                             its commit), so events are in commit order and none is
#                             ever rewritten
#   a/APP/KEY, u/APP/USER/KEY one key of the app's state, of the user's
# Every state key is a document of its own, so an event's state delta is a put
# per key it sets, never a read and a rewrite of the whole state: app: and user:
# keys shared by many sessions take each write whole, as DatabaseSessionService
# applies them. temp: keys are never stored (the base class strips them).
#
# append_event is one txn. It requires the session document to be the one this
# Session object last saw (its _storage_update_marker is that document's digest),
# replaces it (t: the event's timestamp, last: its id), appends the event and puts
# the state keys the event sets. A writer holding an older Session object is
# refused with StaleSessionError, as DatabaseSessionService refuses it, whatever
# the clocks say: two servers appending to one session are ordered by the
# daemon, and the later one reloads instead of interleaving its turn. A Session
# without a marker (made by hand) is held to DatabaseSessionService's rule: it
# is stale when the stored session is newer and its newest event is not the
# Session's.
#
# get_session reads the session document first and then, in the same round
# trip, its state, the app's and user's, and its events: an append is one txn,
# so the events read hold every one the session document counts. With
# num_recent_events=N it reads only the newest N, one range read whatever the
# session's length; with after_timestamp, the events at or after it (a full
# read), then the newest N of those, as DatabaseSessionService filters.
#
# With owner=NAME, every write also carries the service's lease on the session
# (ownership.py): a service whose session another owner took over is refused
# with StaleOwner, and take_over() fences the previous owner.
#
# Where it differs from DatabaseSessionService: events come back in the order
# they were committed, as InMemorySessionService keeps them, not sorted by
# timestamp (the same order whenever each event's timestamp is not older than
# the one before, as the Runner makes them).
from __future__ import annotations

import functools
import time
import uuid
from typing import Any, TypeVar

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from pydantic_core import to_jsonable_python

from .. import requests as r
from ..asyncio_client import AsyncClient, ClientPerLoop
from ..effects import AsyncLedger, Scope
from ..errors import Conflict, TooLarge
from . import plans
from .keyparts import key_part
from .lifetime import Items, digest_of, every_item
from .ownership import LEASE_TTL_S, fenced_txn, owner_of, take_over
from .plans import KIND, SCAN_PAGE, Plan, delete_op, delete_prefix_op, socket_of

T = TypeVar("T")
STALE_MESSAGE = (
    "The session has been modified in storage since it was loaded. Please reload the"
    " session before appending more events."
)  # DatabaseSessionService's words: callers match "modified in storage"


def _json_safe(value: Any) -> Any:
    """A state value as stored: JSON's types, anything else as its str (a callable), as
    DatabaseSessionService stores state."""
    return to_jsonable_python(value, fallback=str)


def _by_scope(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A state or a delta as (app, user, session) keys, prefixes taken off; temp: goes."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in state.items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = _json_safe(value)
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = _json_safe(value)
        elif not key.startswith(State.TEMP_PREFIX):
            own[key] = _json_safe(value)
    return app, user, own


def _state_of(items: Items) -> dict[str, Any]:
    return {item["value"]["k"]: item["value"]["v"] for item in items}


class SessionStoreSessionService(BaseSessionService):
    def __init__(
        self,
        socket_path: str | None = None,
        *,
        prefix: str = "adk/",
        timeout: float | None = 60.0,
        client: AsyncClient | None = None,
        owner: str | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
    ) -> None:
        """socket_path None: the default socket, as every client finds it; client: an
        AsyncClient to use instead of the service's own (on its event loop), which the
        caller closes; owner: this service's name as the owner of the sessions it writes
        (ownership.py): a session another owner has taken over refuses its writes with
        StaleOwner."""
        self.prefix = prefix
        self.owner = owner_of(owner, lease_ttl_s)
        self.socket_path = socket_of(socket_path, client)
        self._clients = ClientPerLoop(self.socket_path, timeout, client)
        self.timeout = self._clients.timeout

    async def close(self) -> None:
        await self._clients.aclose()

    async def _run(self, plan: Plan[T]) -> T:
        return await plans.arun(self._clients.current(), plan)

    # -- keys -----------------------------------------------------------------------

    def _session_key(self, app: str, user: str, session_id: str) -> str:
        return f"{self.prefix}s/{key_part(app)}/{key_part(user)}/{key_part(session_id)}"

    def _events_prefix(self, app: str, user: str, session_id: str) -> str:
        return f"{self.prefix}e/{key_part(app)}/{key_part(user)}/{key_part(session_id)}/"

    def _own_prefix(self, app: str, user: str, session_id: str) -> str:
        return f"{self.prefix}v/{key_part(app)}/{key_part(user)}/{key_part(session_id)}/"

    def _effects_prefix(self, app: str, user: str, session_id: str) -> str:
        return f"{self.prefix}f/{key_part(app)}/{key_part(user)}/{key_part(session_id)}/"

    def _owner_key(self, app: str, user: str, session_id: str) -> str:
        return f"{self.prefix}o/{key_part(app)}/{key_part(user)}/{key_part(session_id)}"

    def effects(self, *, app_name: str, user_id: str, session_id: str) -> AsyncLedger:
        """The session's tool-effect ledger (sessionstore.effects), for its async tools:
        its records are writes to the session, under this service's owner, and
        delete_session removes them."""
        session_id = session_id.strip()
        scope = self._owner_key(app_name, user_id, session_id)
        prefix = self._effects_prefix(app_name, user_id, session_id)
        write = functools.partial(fenced_txn, self.owner, scope)
        runner = plans.Runner(self.socket_path, self.timeout, async_clients=self._clients)
        return AsyncLedger.of_adapter(Scope(prefix, write), runner)

    async def take_over(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """This service's owner takes the session, at the next epoch: its previous owner's
        next write is refused with StaleOwner."""
        scope = self._owner_key(app_name, user_id, session_id.strip())
        await self._run(take_over(self.owner, scope))

    def _app_prefix(self, app: str) -> str:
        return f"{self.prefix}a/{key_part(app)}/"

    def _user_prefix(self, app: str, user: str | None) -> str:
        users = f"{self.prefix}u/{key_part(app)}/"
        return users if user is None else f"{users}{key_part(user)}/"

    def _state_puts(self, prefix: str, keys: dict[str, Any]) -> list[dict[str, Any]]:
        return [plans.put_op(prefix + key_part(k), {"k": k, "v": v}) for k, v in keys.items()]

    # -- the service ------------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        given = (session_id or "").strip()
        chosen = given or uuid.uuid4().hex
        return await self._run(self._create(app_name, user_id, state or {}, chosen))

    def _create(self, app: str, user: str, state: dict[str, Any], session_id: str) -> Plan[Session]:
        app_keys, user_keys, own = _by_scope(state)
        header = {"id": session_id, "app": app, "user": user, "t": time.time(), "last": ""}
        key = self._session_key(app, user, session_id)
        ops = [
            plans.put_op(key, header),
            *self._state_puts(self._own_prefix(app, user, session_id), own),
            *self._state_puts(self._app_prefix(app), app_keys),
            *self._state_puts(self._user_prefix(app, user), user_keys),
        ]
        scope = self._owner_key(app, user, session_id)
        try:
            yield from fenced_txn(
                self.owner, scope, ops, [{"kind": KIND, "key": key, "exists": False}]
            )
        except Conflict:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
        app_items, user_items = yield from self._shared_state(app, user)
        return self._session(header, own, app_items, user_items, [])

    def _shared_state(self, app: str, user: str | None) -> Plan[tuple[Items, Items]]:
        app_page, user_page = yield [
            r.checkpoint_scan(KIND, self._app_prefix(app), limit=SCAN_PAGE),
            r.checkpoint_scan(KIND, self._user_prefix(app, user), limit=SCAN_PAGE),
        ]
        return (yield from _all(app_page, self._app_prefix(app))), (
            yield from _all(user_page, self._user_prefix(app, user))
        )

    def _session(
        self,
        header: dict[str, Any],
        own: dict[str, Any],
        app_items: Items,
        user_items: Items,
        events: list[Event],
    ) -> Session:
        state = dict(own)
        state.update({State.APP_PREFIX + k: v for k, v in _state_of(app_items).items()})
        user_prefix = self._user_prefix(header["app"], header["user"])
        mine = [item for item in user_items if item["key"].startswith(user_prefix)]
        state.update({State.USER_PREFIX + k: v for k, v in _state_of(mine).items()})
        session = Session(
            id=header["id"],
            app_name=header["app"],
            user_id=header["user"],
            state=state,
            events=events,
            last_update_time=header["t"],
        )
        session._storage_update_marker = digest_of(header)
        return session

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        return await self._run(self._get(app_name, user_id, session_id.strip(), config))

    def _get(
        self, app: str, user: str, session_id: str, config: GetSessionConfig | None
    ) -> Plan[Session | None]:
        wanted = None if config is None else config.num_recent_events
        after = None if config is None else config.after_timestamp
        events_prefix = self._events_prefix(app, user, session_id)
        own_prefix = self._own_prefix(app, user, session_id)
        if wanted == 0:
            events_read = r.checkpoint_scan(KIND, events_prefix, limit=1, values=False)
        elif wanted is not None and after is None:
            events_read = r.checkpoint_scan(
                KIND, events_prefix, limit=min(wanted, SCAN_PAGE), reverse=True
            )
        else:
            events_read = r.checkpoint_scan(KIND, events_prefix, limit=SCAN_PAGE)
        # the session document first: the events read after it hold every one it counts
        header, own_page, app_page, user_page, events_page = yield [
            r.checkpoint_get(KIND, self._session_key(app, user, session_id)),
            r.checkpoint_scan(KIND, own_prefix, limit=SCAN_PAGE),
            r.checkpoint_scan(KIND, self._app_prefix(app), limit=SCAN_PAGE),
            r.checkpoint_scan(KIND, self._user_prefix(app, user), limit=SCAN_PAGE),
            events_read,
        ]
        if header is None:
            return None
        own = _state_of((yield from _all(own_page, own_prefix)))
        app_items = yield from _all(app_page, self._app_prefix(app))
        user_items = yield from _all(user_page, self._user_prefix(app, user))
        if wanted == 0:
            stored: Items = []
        elif wanted is not None and after is None:
            stored = yield from self._newest(events_prefix, events_page, wanted)
        else:
            stored = yield from _all(events_page, events_prefix)
        events = [Event.model_validate_json(item["value"]["json"]) for item in stored]
        if after is not None:
            events = [event for event in events if event.timestamp >= after]
            if wanted is not None:
                events = events[-wanted:] if wanted else []
        return self._session(header, own, app_items, user_items, events)

    def _newest(self, prefix: str, page: dict[str, Any], wanted: int) -> Plan[Items]:
        """The newest `wanted` events, oldest first, from the first page read newest first."""
        found: Items = list(page["items"])
        before = page["next"]
        while len(found) < wanted and before is not None:
            limit = min(SCAN_PAGE, wanted - len(found))
            (page,) = yield [
                r.checkpoint_scan(KIND, prefix, before=before, limit=limit, reverse=True)
            ]
            found += page["items"]
            before = page["next"]
        found.reverse()
        return found

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        return await self._run(self._list(app_name, user_id))

    def _list(self, app: str, user: str | None) -> Plan[ListSessionsResponse]:
        sessions_prefix = f"{self.prefix}s/{key_part(app)}/"
        own_prefix = f"{self.prefix}v/{key_part(app)}/"
        if user is not None:
            sessions_prefix += f"{key_part(user)}/"
            own_prefix += f"{key_part(user)}/"
        headers = yield from every_item(sessions_prefix)
        if not headers:
            return ListSessionsResponse()
        owns = yield from every_item(own_prefix)
        app_items, user_items = yield from self._shared_state(app, user)
        sessions = []
        for item in headers:
            header = item["value"]
            mine = self._own_prefix(app, header["user"], header["id"])
            own = _state_of([o for o in owns if o["key"].startswith(mine)])
            sessions.append(self._session(header, own, app_items, user_items, []))
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        await self._run(self._delete(app_name, user_id, session_id.strip()))

    def _delete(self, app: str, user: str, session_id: str) -> Plan[None]:
        events_prefix = self._events_prefix(app, user, session_id)
        ops = [
            delete_op(self._session_key(app, user, session_id)),
            delete_prefix_op(self._own_prefix(app, user, session_id)),
            delete_prefix_op(self._effects_prefix(app, user, session_id)),
        ]
        scope = self._owner_key(app, user, session_id)
        try:
            yield from fenced_txn(self.owner, scope, [*ops, delete_prefix_op(events_prefix)], [])
        except TooLarge:  # over the daemon's 100,000 keys a txn: the session goes first
            yield from fenced_txn(self.owner, scope, ops, [])
            while True:
                (page,) = yield [
                    r.checkpoint_scan(KIND, events_prefix, limit=SCAN_PAGE, values=False)
                ]
                if not page["items"]:
                    return
                removals = [delete_op(item["key"]) for item in page["items"]]
                yield from fenced_txn(self.owner, scope, removals, [])

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return await self._run(self._user_state(app_name, user_id))

    def _user_state(self, app: str, user: str) -> Plan[dict[str, Any]]:
        return _state_of((yield from every_item(self._user_prefix(app, user))))

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        header = await self._run(self._append(session, event))
        session.last_update_time = header["t"]
        session._storage_update_marker = digest_of(header)
        return self._commit_event_to_session(session, event)

    def _append(self, session: Session, event: Event) -> Plan[dict[str, Any]]:
        app, user, session_id = session.app_name, session.user_id, session.id
        key = self._session_key(app, user, session_id)
        seen = session._storage_update_marker
        if seen is None:
            seen = yield from self._markerless(session, key)
        header = {"id": session_id, "app": app, "user": user, "t": event.timestamp,
                  "last": event.id}  # fmt: skip
        app_keys, user_keys, own = _by_scope(event.actions.state_delta or {})
        append = {
            "op": "append",
            "kind": KIND,
            "prefix": self._events_prefix(app, user, session_id),
        }
        ops = [
            plans.put_op(key, header),
            {**append, "value": {"json": event.model_dump_json(exclude_none=True)}},
            *self._state_puts(self._own_prefix(app, user, session_id), own),
            *self._state_puts(self._app_prefix(app), app_keys),
            *self._state_puts(self._user_prefix(app, user), user_keys),
        ]
        scope = self._owner_key(app, user, session_id)
        try:
            yield from fenced_txn(
                self.owner, scope, ops, [{"kind": KIND, "key": key, "digest": seen}]
            )
        except Conflict as conflict:
            if conflict.current is None:
                raise SessionNotFoundError(f"Session {session_id} not found.") from None
            raise StaleSessionError(STALE_MESSAGE) from None
        return header

    def _markerless(self, session: Session, key: str) -> Plan[str]:
        """The digest to require for a Session that carries none: the stored one, unless
        the stored session is newer and its newest event is not the Session's."""
        (header,) = yield [r.checkpoint_get(KIND, key)]
        if header is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        newest = session.events[-1].id if session.events else ""
        if header["t"] > session.last_update_time and header["last"] != newest:
            raise StaleSessionError(STALE_MESSAGE)
        return digest_of(header)


def _all(page: dict[str, Any], prefix: str) -> Plan[Items]:
    """Every item under the prefix, given its first page (read oldest first)."""
    items: Items = list(page["items"])
    if page["next"] is not None:
        items += yield from every_item(prefix, page["next"])
    return items
