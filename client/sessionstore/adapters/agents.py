# An OpenAI Agents SDK session on sessionstore: `SessionStoreSession`
# implements the SDK's Session protocol (get_items, add_items, pop_item,
# clear_session, session_settings) over the asyncio client.
#
# Each item is its own `kv` document at PREFIX + SESSION + "/" + the seq of its
# commit (20 digits), appended by one `txn`: the daemon picks the key, so the
# items of every caller in every process are ordered by commit, one call's
# items stay together and in order, and nothing is rewritten. add_items costs
# the same at item 10 and at item 10,000; get_items(limit=N) is one range read
# of the newest N; pop_item removes the newest item under a requirement on its
# generation (retrying if another caller took it first); clear_session is one
# range delete.
#
# Calls of any size succeed: add_items sends one txn per TXN_OPS items (the
# daemon's largest), so a call of more keeps its items in order but another
# caller's may land between its txns, and a daemon that dies halfway keeps the
# txns it acknowledged. A range delete the daemon refuses as too large (over
# 100,000 items) is split by the next digit of the keys' seqs, oldest first, so
# a clear cut short leaves the newest items, never a gap.
#
# With ttl=SECONDS (as RedisSession takes it), the session's items are gone
# that long after its last write, all at once: the session has a lifetime
# document beside its items (lifetime.py), renewed by every write. Items added
# without a ttl after it expired are read at once, the expired ones never.
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import cbor2
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from .. import requests as r
from ..asyncio_client import AsyncClient, ClientPerLoop
from ..effects import AsyncLedger, Scope
from ..errors import Conflict, TooLarge
from . import plans
from .keyparts import key_part
from .lifetime import Items, Lifetime, every_item, group_gone, lapsed, untimed
from .ownership import LEASE_TTL_S, Commit, fenced_txn, one_txn, owner_of, take_over
from .plans import KIND, TXN_OPS, Plan, delete_op, delete_prefix_op, socket_of

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

PAGE = 1000  # the daemon's largest range read
SEQ_DIGITS = 20  # an appended key is the prefix and the seq of its commit


def settings_of(given: SessionSettings | dict[str, Any] | None) -> SessionSettings:
    """As the SDK's own backends take it: a dict becomes SessionSettings (TypeError at
    once for a key it does not know), and none is the default settings."""
    return coerce_session_settings(given) if given is not None else SessionSettings()


class SessionStoreSession:
    def __init__(
        self,
        session_id: str,
        socket_path: str | None = None,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        prefix: str = "agents/",
        timeout: float | None = 60.0,
        ttl: int | None = None,
        client: AsyncClient | None = None,
        owner: str | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
    ) -> None:
        """client: an AsyncClient to use instead of the session's own (on its event
        loop); the caller closes it. owner: this session object's name as the session's
        owner (ownership.py): once another owner has taken the session over, its writes
        are refused with StaleOwner."""
        self.owner = owner_of(owner, lease_ttl_s)
        # "%owner", "%effects": no percent-encoded session id; never among the items
        self.owner_key = f"{prefix}%owner/{key_part(session_id)}"
        self.effects_prefix = f"{prefix}%effects/{key_part(session_id)}/"
        self.session_id = session_id
        self.session_settings: SessionSettings | None = settings_of(session_settings)
        self.socket_path = socket_of(socket_path, client)
        self.items_prefix = f"{prefix}{key_part(session_id)}/"
        self.life_key = f"{prefix}{key_part(session_id)}"  # beside the items, not among them
        self.lifetime = None if ttl is None else Lifetime(ttl)
        self._clients = ClientPerLoop(self.socket_path, timeout, client)
        self.timeout = self._clients.timeout

    def _client(self) -> AsyncClient:
        return self._clients.current()

    async def close(self) -> None:
        await self._clients.aclose()

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted == 0:
            return []
        return await plans.arun(self._client(), self._read(wanted))

    def _read(self, wanted: int | None) -> Plan[list[TResponseInputItem]]:
        guard = [] if self.lifetime is None else [self.lifetime.guard(self.life_key)]
        if wanted is None or wanted < 0:
            found = yield from self._every_item(guard)
        else:
            found = yield from self._newest(guard, wanted)
        return [item["value"]["item"] for item in found]

    def _every_item(self, guard: list[r.Call[Any]]) -> Plan[Items]:
        """Every item, oldest first."""
        *life, page = yield [*guard, _scan(self.items_prefix, limit=PAGE)]
        found: Items = page["items"]
        if page["next"] is not None:
            found += yield from every_item(self.items_prefix, page["next"])
        return untimed(found) if (yield from self._expired(life, found)) else found

    def _newest(self, guard: list[r.Call[Any]], wanted: int) -> Plan[Items]:
        """The newest `wanted` items, oldest first."""
        found: Items = []
        before: str | None = None
        life: list[Any] = []
        expired = False
        while len(found) < wanted:
            scan = _scan(
                self.items_prefix, before=before, limit=min(PAGE, wanted - len(found)), reverse=True
            )
            *read, page = yield [*guard, scan]
            if guard:  # the lifetime, read with the first page
                life, guard = read, []
            found += untimed(page["items"]) if expired else page["items"]
            before = page["next"]
            if not expired and (yield from self._expired(life, found)):
                expired, found = True, untimed(found)
            if before is None:
                break
        found.reverse()
        return found

    def _expired(self, life: list[Any], found: Items) -> Plan[bool]:
        """Whether the session's lifetime has expired, from the lifetime as read with its
        items: then only its untimed() items are read."""
        if self.lifetime is None:
            return (yield from group_gone(self.life_key, found))
        if self.lifetime.gone(life[0], found):
            return True
        yield from self.lifetime.after_read(self.life_key, life[0], self._members)
        return False

    def _members(self) -> Plan[Items]:
        items = yield from every_item(self.items_prefix, values=False)
        return items + (yield from every_item(self.effects_prefix, values=False))

    def _write(self, ops: list[dict[str, Any]], require: Items | None = None) -> Plan[None]:
        """A txn of ops; with a ttl it renews the session's lifetime, and the items it
        stores expire with the session."""
        commit: Commit = one_txn
        if self.lifetime is not None:
            commit = functools.partial(self.lifetime.commit, self.life_key, members=self._members)
        yield from fenced_txn(self.owner, self.owner_key, ops, require or [], commit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if not items:
            return
        append = {"op": "append", "kind": KIND, "prefix": self.items_prefix}
        ops = [{**append, "value": {"item": item}} for item in items]
        try:  # every item before any txn goes, so that a bad one stores nothing
            cbor2.dumps(ops)
        except (cbor2.CBOREncodeError, TypeError, ValueError) as error:
            # a TypeError, as json.dumps raises for the SDK's own backends
            raise TypeError(f"an item cannot be stored: {error}") from error
        # with a ttl one op of each txn is the lifetime's, with an owner one is the lease's
        per_txn = TXN_OPS - (self.lifetime is not None) - (self.owner is not None)
        for start in range(0, len(ops), per_txn):
            await plans.arun(self._client(), self._write(ops[start : start + per_txn]))

    async def pop_item(self) -> TResponseInputItem | None:
        return await plans.arun(self._client(), self._pop())

    def _pop(self) -> Plan[TResponseInputItem | None]:
        while True:
            guard = [] if self.lifetime is None else [r.checkpoint_get(KIND, self.life_key)]
            *life, page = yield [*guard, _scan(self.items_prefix, limit=1, reverse=True)]
            if not page["items"]:
                return None
            newest = page["items"][0]
            if (yield from self._expired(life, page["items"])):
                newest = yield from self._newest_untimed()
                if newest is None:
                    return None
            try:
                yield from self._write(
                    [delete_op(newest["key"])],
                    [{"kind": KIND, "key": newest["key"], "digest": newest["digest"]}],
                )
            except Conflict:
                continue  # another caller popped it first: take the next newest
            item: TResponseInputItem = newest["value"]["item"]
            return item

    def _newest_untimed(self) -> Plan[dict[str, Any] | None]:
        before: str | None = None
        while True:
            (page,) = yield [_scan(self.items_prefix, before=before, limit=PAGE, reverse=True)]
            kept = untimed(page["items"])
            if kept:
                return kept[0]
            before = page["next"]
            if before is None:
                return None

    async def clear_session(self) -> None:
        # the lifetime with the first range: a clear cut short leaves an expiring
        # session already gone
        await self._delete_range(
            self.items_prefix, [delete_op(self.life_key), delete_prefix_op(self.effects_prefix)]
        )

    def effects(self) -> AsyncLedger:
        """The session's tool-effect ledger (sessionstore.effects): its records are writes
        to the session (under its owner, expiring with it), and clear_session removes
        them."""
        expired = functools.partial(lapsed, self.lifetime, self.life_key)
        runner = plans.Runner(self.socket_path, self.timeout, async_clients=self._clients)
        return AsyncLedger.of_adapter(Scope(self.effects_prefix, self._write, expired), runner)

    async def take_over(self) -> None:
        """This session object's owner takes the session, at the next epoch: its previous
        owner's next write is refused with StaleOwner (owner= needed)."""
        await plans.arun(self._client(), take_over(self.owner, self.owner_key))

    async def _delete(self, ops: Items) -> None:
        """Removals, not renewing a lifetime (with ttl) but under the owner's lease."""
        await plans.arun(self._client(), fenced_txn(self.owner, self.owner_key, ops, []))

    async def _delete_range(self, prefix: str, also: Items | None = None) -> None:
        try:
            await self._delete([*(also or []), delete_prefix_op(prefix)])
        except TooLarge:
            if len(prefix) >= len(self.items_prefix) + SEQ_DIGITS:
                raise
            if also:
                await self._delete(also)
            for digit in "0123456789":  # the keys' seqs, oldest first
                await self._delete_range(prefix + digit)


def _scan(prefix: str, **options: Any) -> r.Call[Any]:
    return r.checkpoint_scan(KIND, prefix, **options)
