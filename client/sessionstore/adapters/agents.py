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
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import cbor2
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from ..asyncio_client import AsyncioClient, ClientPerLoop
from ..errors import Conflict, TooLarge
from .keyparts import key_part

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

KIND = "kv"
PAGE = 1000  # the daemon's largest range read
TXN_OPS = 10_000  # the daemon's largest txn
SEQ_DIGITS = 20  # an appended key is the prefix and the seq of its commit


class SessionStoreSession:
    def __init__(
        self,
        session_id: str,
        socket_path: str | None = None,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        prefix: str = "agents/",
        timeout: float | None = 60.0,
    ) -> None:
        self.session_id = session_id
        # as the SDK's own backends take it: a dict becomes SessionSettings (TypeError at
        # once for a key it does not know), and none is the default settings
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self.socket_path = socket_path
        self.timeout = timeout
        self.items_prefix = f"{prefix}{key_part(session_id)}/"
        self._clients = ClientPerLoop(socket_path, timeout)

    def _client(self) -> AsyncioClient:
        return self._clients.current()

    async def close(self) -> None:
        await self._clients.aclose()

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted == 0:
            return []
        client = self._client()
        if wanted is None or wanted < 0:  # everything, oldest first
            items: list[Any] = []
            after: str | None = None
            while True:
                page = await client.checkpoint_scan(
                    KIND, self.items_prefix, after=after, limit=PAGE
                )
                items += [item["value"]["item"] for item in page["items"]]
                after = page["next"]
                if after is None:
                    return items
        newest: list[Any] = []
        before: str | None = None
        while len(newest) < wanted:
            page = await client.checkpoint_scan(
                KIND,
                self.items_prefix,
                before=before,
                limit=min(PAGE, wanted - len(newest)),
                reverse=True,
            )
            newest += [item["value"]["item"] for item in page["items"]]
            before = page["next"]
            if before is None:
                break
        return newest[::-1]

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
        for start in range(0, len(ops), TXN_OPS):
            await self._client().txn(ops[start : start + TXN_OPS])

    async def pop_item(self) -> TResponseInputItem | None:
        client = self._client()
        while True:
            page = await client.checkpoint_scan(KIND, self.items_prefix, limit=1, reverse=True)
            if not page["items"]:
                return None
            newest = page["items"][0]
            try:
                await client.txn(
                    [{"op": "delete", "kind": KIND, "key": newest["key"]}],
                    require=[{"kind": KIND, "key": newest["key"], "digest": newest["digest"]}],
                )
            except Conflict:
                continue  # another caller popped it first: take the next newest
            item: TResponseInputItem = newest["value"]["item"]
            return item

    async def clear_session(self) -> None:
        await self._delete_range(self.items_prefix)

    async def _delete_range(self, prefix: str) -> None:
        try:
            await self._client().txn([{"op": "delete_prefix", "kind": KIND, "prefix": prefix}])
        except TooLarge:
            if len(prefix) >= len(self.items_prefix) + SEQ_DIGITS:
                raise
            for digit in "0123456789":  # the keys' seqs, oldest first
                await self._delete_range(prefix + digit)
