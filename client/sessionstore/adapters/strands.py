# AWS Strands Agents on sessionstore:
#   - SessionStoreSessionRepository, a SessionRepository (sessions, agents, their
#     messages, multi-agent states) over the blocking client, shared by every
#     process that talks to the daemon;
#   - SessionStoreSessionManager(session_id), the RepositorySessionManager over it:
#     the one line that moves an Agent's session to sessionstore;
#   - SessionStoreStorage, Strands' Storage protocol (bytes under keys, listed by
#     prefix), over the asyncio client, for the snapshot session manager and
#     anything else that takes a Storage.
#
# The repository's layout, under PREFIX ("strands/"), each id percent-encoded:
#   x/SESSION                  the session (Session.to_dict())
#   g/SESSION/AGENT            an agent (SessionAgent.to_dict())
#   m/SESSION/AGENT/ID         a message (SessionMessage.to_dict()), ID its message_id
#                              as 20 digits (so keys sort as the ids do)
#   y/SESSION/MULTI_AGENT      a multi-agent's serialize_state()
# Each call is one request. Updates keep the stored created_at (a txn put's
# `keep`, read by the daemon as it commits) and require the document to exist;
# deleting a session removes its agents, messages and multi-agent states in the
# same txn. Errors are FileSessionManager's: SessionException with its words.
from __future__ import annotations

import builtins
import copy
import functools
from typing import TYPE_CHECKING, Any

from strands.session.repository_session_manager import RepositorySessionManager
from strands.session.session_repository import SessionRepository
from strands.storage import Storage
from strands.types.exceptions import SessionException, StorageError
from strands.types.session import Session, SessionAgent, SessionMessage

from .. import requests as r
from ..asyncio_client import AsyncClient, ClientPerLoop
from ..client import Client
from ..effects import AsyncLedger, Ledger, Scope
from ..errors import Conflict
from . import plans
from .keyparts import key_part
from .lifetime import Items, every_item
from .ownership import LEASE_TTL_S, fenced_txn, owner_of, take_over
from .plans import KIND, SCAN_PAGE, Plan, delete_op, delete_prefix_op, put_op

if TYPE_CHECKING:
    from strands.multiagent.base import MultiAgentBase

ID_DIGITS = 20
KEPT = ["created_at"]  # what an update keeps of the stored document


def _message_id(message_id: Any) -> int:
    if not isinstance(message_id, int) or isinstance(message_id, bool):
        raise ValueError(f"message_id=<{message_id}> | message id must be an integer")
    return message_id


class SessionStoreSessionRepository(plans.OnRunner, SessionRepository):
    def __init__(
        self,
        socket_path: str | None = None,
        *,
        prefix: str = "strands/",
        timeout: float | None = 60.0,
        client: Client | None = None,
        owner: str | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
    ) -> None:
        """socket_path None: the default socket, as every client finds it; client: a
        Client to use instead of the repository's own, which the caller closes; owner:
        this repository's name as the owner of the sessions it writes (ownership.py): a
        session another owner has taken over refuses its writes with StaleOwner."""
        self.prefix = prefix
        self.owner = owner_of(owner, lease_ttl_s)
        self._start_runner(socket_path, timeout, client)

    # -- keys -----------------------------------------------------------------------

    def _session_key(self, session_id: str) -> str:
        return f"{self.prefix}x/{key_part(session_id)}"

    def _agent_key(self, session_id: str, agent_id: str) -> str:
        return f"{self.prefix}g/{key_part(session_id)}/{key_part(agent_id)}"

    def _messages_prefix(self, session_id: str, agent_id: str) -> str:
        return f"{self.prefix}m/{key_part(session_id)}/{key_part(agent_id)}/"

    def _message_key(self, session_id: str, agent_id: str, message_id: int) -> str:
        return self._messages_prefix(session_id, agent_id) + f"{message_id:0{ID_DIGITS}d}"

    def _owner_key(self, session_id: str) -> str:
        return f"{self.prefix}o/{key_part(session_id)}"

    def _effects_prefix(self, session_id: str) -> str:
        return f"{self.prefix}f/{key_part(session_id)}/"

    def effects(self, session_id: str) -> Ledger:
        """The session's tool-effect ledger (sessionstore.effects), for blocking tools: its
        records are writes to the session, under this repository's owner, and
        delete_session removes them."""
        return Ledger.of_adapter(self._effects_scope(session_id), self._runner)

    def aeffects(self, session_id: str) -> AsyncLedger:
        """effects(), for async tools."""
        return AsyncLedger.of_adapter(self._effects_scope(session_id), self._runner)

    def _effects_scope(self, session_id: str) -> Scope:
        write = functools.partial(fenced_txn, self.owner, self._owner_key(session_id))
        return Scope(self._effects_prefix(session_id), write)

    def take_over(self, session_id: str) -> None:
        """This repository's owner takes the session, at the next epoch: its previous
        owner's next write is refused with StaleOwner."""
        self._runner.run(take_over(self.owner, self._owner_key(session_id)))

    def _multi_agent_key(self, session_id: str, multi_agent_id: str) -> str:
        return f"{self.prefix}y/{key_part(session_id)}/{key_part(multi_agent_id)}"

    # -- one request each -------------------------------------------------------------

    def _get(self, key: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self._runner.run(_one(r.checkpoint_get(KIND, key)))
        return found

    def _txn(
        self, session_id: str, ops: list[dict[str, Any]], require: list[dict[str, Any]]
    ) -> bool:
        """A write to the session (under the owner's lease, if any); False when one of
        the requirements was not met."""
        try:
            self._runner.run(fenced_txn(self.owner, self._owner_key(session_id), ops, require))
        except Conflict:
            return False
        return True

    def _update(self, session_id: str, key: str, value: dict[str, Any]) -> bool:
        """Replace an existing document, keeping its created_at; False when there is none."""
        put = {**put_op(key, value), "keep": KEPT}
        return self._txn(session_id, [put], [{"kind": KIND, "key": key, "exists": True}])

    # -- sessions -----------------------------------------------------------------------

    def create_session(self, session: Session, **kwargs: Any) -> Session:
        key = self._session_key(session.session_id)
        value = {**session.to_dict(), "session_type": str(session.session_type.value)}
        exists = [{"kind": KIND, "key": key, "exists": False}]
        if not self._txn(session.session_id, [put_op(key, value)], exists):
            raise SessionException(f"Session {session.session_id} already exists")
        return session

    def read_session(self, session_id: str, **kwargs: Any) -> Session | None:
        found = self._get(self._session_key(session_id))
        return None if found is None else Session.from_dict(found)

    def delete_session(self, session_id: str, **kwargs: Any) -> None:
        key = self._session_key(session_id)
        part = key_part(session_id)
        ops = [delete_op(key), delete_prefix_op(self._effects_prefix(session_id))] + [
            delete_prefix_op(f"{self.prefix}{kind}/{part}/") for kind in ("g", "m", "y")
        ]
        if not self._txn(session_id, ops, [{"kind": KIND, "key": key, "exists": True}]):
            raise SessionException(f"Session {session_id} does not exist")

    # -- agents ---------------------------------------------------------------------------

    def create_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        key = self._agent_key(session_id, session_agent.agent_id)
        self._txn(session_id, [put_op(key, session_agent.to_dict())], [])

    def read_agent(self, session_id: str, agent_id: str, **kwargs: Any) -> SessionAgent | None:
        found = self._get(self._agent_key(session_id, agent_id))
        return None if found is None else SessionAgent.from_dict(found)

    def update_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        key = self._agent_key(session_id, session_agent.agent_id)
        if not self._update(session_id, key, session_agent.to_dict()):
            raise SessionException(
                f"Agent {session_agent.agent_id} in session {session_id} does not exist"
            )

    # -- messages -------------------------------------------------------------------------

    def create_message(
        self, session_id: str, agent_id: str, session_message: SessionMessage, **kwargs: Any
    ) -> None:
        number = _message_id(session_message.message_id)
        key = self._message_key(session_id, agent_id, number)
        self._txn(session_id, [put_op(key, session_message.to_dict())], [])

    def read_message(
        self, session_id: str, agent_id: str, message_id: int, **kwargs: Any
    ) -> SessionMessage | None:
        key = self._message_key(session_id, agent_id, _message_id(message_id))
        found = self._get(key)
        return None if found is None else SessionMessage.from_dict(found)

    def update_message(
        self, session_id: str, agent_id: str, session_message: SessionMessage, **kwargs: Any
    ) -> None:
        number = _message_id(session_message.message_id)
        key = self._message_key(session_id, agent_id, number)
        if not self._update(session_id, key, session_message.to_dict()):
            raise SessionException(f"Message {number} does not exist")

    def list_messages(
        self,
        session_id: str,
        agent_id: str,
        limit: int | None = None,
        offset: int = 0,
        **kwargs: Any,
    ) -> list[SessionMessage]:
        """In message_id order: those from the offset-th on, at most limit of them."""
        prefix = self._messages_prefix(session_id, agent_id)
        found = self._runner.run(_page_of(prefix, offset, limit))
        return [SessionMessage.from_dict(item["value"]) for item in found]

    # -- multi-agent states -----------------------------------------------------------

    def create_multi_agent(
        self, session_id: str, multi_agent: MultiAgentBase, **kwargs: Any
    ) -> None:
        key = self._multi_agent_key(session_id, multi_agent.id)
        self._txn(session_id, [put_op(key, multi_agent.serialize_state())], [])

    def read_multi_agent(
        self, session_id: str, multi_agent_id: str, **kwargs: Any
    ) -> dict[str, Any] | None:
        return self._get(self._multi_agent_key(session_id, multi_agent_id))

    def update_multi_agent(
        self, session_id: str, multi_agent: MultiAgentBase, **kwargs: Any
    ) -> None:
        key = self._multi_agent_key(session_id, multi_agent.id)
        state = multi_agent.serialize_state()
        exists = [{"kind": KIND, "key": key, "exists": True}]
        if not self._txn(session_id, [put_op(key, state)], exists):
            raise SessionException(
                f"MultiAgent state {multi_agent.id} in session {session_id} does not exist"
            )


class SessionStoreSessionManager(RepositorySessionManager):
    """A Strands Agent's session in sessionstore: Agent(session_manager=this)."""

    def __init__(
        self,
        session_id: str,
        socket_path: str | None = None,
        *,
        prefix: str = "strands/",
        timeout: float | None = 60.0,
        owner: str | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
        **kwargs: Any,
    ) -> None:
        """owner: as the repository takes it; the manager's session is the one it owns."""
        self.repository = SessionStoreSessionRepository(
            socket_path, prefix=prefix, timeout=timeout, owner=owner, lease_ttl_s=lease_ttl_s
        )
        super().__init__(session_id=session_id, session_repository=self.repository, **kwargs)

    def effects(self) -> Ledger:
        """The session's tool-effect ledger, as the repository's effects() gives it."""
        return self.repository.effects(self.session_id)

    def aeffects(self) -> AsyncLedger:
        return self.repository.aeffects(self.session_id)

    def take_over(self) -> None:
        """The session, from whichever owner held it (owner= needed)."""
        self.repository.take_over(self.session_id)

    def close(self) -> None:
        self.repository.close()


def _one(call: r.Call[Any]) -> Plan[Any]:
    (result,) = yield [call]
    return result


def _page_of(prefix: str, offset: int, limit: int | None) -> Plan[Items]:
    """The items under prefix from the offset-th on (skipped by their keys alone), at
    most limit of them (all, for None)."""
    after: str | None = None
    while offset > 0:
        (page,) = yield [r.checkpoint_scan(KIND, prefix, after, limit=min(offset, SCAN_PAGE),
                                           values=False)]  # fmt: skip
        if not page["items"]:
            return []
        offset -= len(page["items"])
        after = page["items"][-1]["key"]
        if page["next"] is None and offset > 0:
            return []
    if limit is None:
        return (yield from every_item(prefix, after))
    found: Items = []
    while len(found) < limit:
        (page,) = yield [r.checkpoint_scan(KIND, prefix, after, limit=min(limit - len(found),
                                                                        SCAN_PAGE))]  # fmt: skip
        found += page["items"]
        after = page["next"]
        if after is None:
            break
    return found


class SessionStoreStorage(Storage):
    """Strands' Storage over the daemon: bytes under keys, each a `kv` document under
    PREFIX + key, listed by prefix in key order. Keys are taken as given."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        prefix: str = "strands-storage/",
        timeout: float | None = 60.0,
        client: AsyncClient | None = None,
    ) -> None:
        self.prefix = prefix
        self.socket_path = plans.socket_of(socket_path, client)
        self._clients = ClientPerLoop(self.socket_path, timeout, client)
        self.timeout = self._clients.timeout

    def namespace(self, prefix: str) -> SessionStoreStorage:
        """A view of the keys under prefix + "/", sharing this storage's clients."""
        view = copy.copy(self)
        view.prefix = f"{self.prefix}{prefix.strip('/')}/"
        return view

    async def aclose(self) -> None:
        await self._clients.aclose()

    def _key(self, key: str) -> str:
        if not key:
            raise StorageError("a storage key may not be empty")
        return self.prefix + key

    async def write(self, key: str, data: bytes) -> None:
        await self._clients.current().txn([put_op(self._key(key), {"b": bytes(data)})])

    async def read(self, key: str) -> bytes | None:
        found = await self._clients.current().checkpoint_get(KIND, self._key(key))
        return None if found is None else bytes(found["b"])

    async def delete(self, key: str) -> None:
        await self._clients.current().txn([delete_op(self._key(key))])

    async def list(self, query: str) -> builtins.list[str]:
        found = await plans.arun(
            self._clients.current(), every_item(self.prefix + query, values=False)
        )
        return [item["key"].removeprefix(self.prefix) for item in found]
