# Generated from op_methods.py by dev/generate_async_op_methods.py: edit that file
# and run `make generate`. The op methods of the trio and asyncio clients.
from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from . import reply_types as t
from . import requests as r
from .replies import result_of, results_of
from .requests import UNSET, Call, ReplyMap, T


class AsyncOpMethods:
    async def _send_raw(self, requests: builtins.list[ReplyMap]) -> builtins.list[ReplyMap]:
        """The transport's part: send every request, then read as many replies, in order."""
        raise NotImplementedError

    async def _run(self, call: Call[T]) -> T:
        replies = await self._send_raw([call.request])
        return result_of(call, replies[0])

    async def pipeline(self, calls: Sequence[Call[Any]]) -> builtins.list[Any]:
        """Several calls in one round trip, each built by its op's function in
        sessionstore.requests; their results in order, or the first failure raised
        (the calls before it took effect, the ones after it too, unless they failed)."""
        replies = await self._send_raw([call.request for call in calls])
        return results_of(calls, replies)

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Any op by name with its arguments; its whole reply (without ok and rid)."""
        return await self._run(r.make(op, **args))

    async def hello(self) -> t.HelloReply:
        return await self._run(r.hello())

    async def ping(self) -> None:
        return await self._run(r.ping())

    async def save(
        self,
        snapshot: t.Snapshot,
        *,
        expect: r.Expect = UNSET,
        lease: r.LeaseArg = UNSET,
        ttl_s: r.Seconds = UNSET,
    ) -> t.Written:
        """ttl_s: the new generation expires that many seconds from now."""
        return await self._run(r.save(snapshot, expect, lease, ttl_s))

    async def load(
        self, session_id: str, *, refresh_ttl_s: r.Seconds = UNSET, at: r.SeqArg = UNSET
    ) -> t.Snapshot | None:
        """The snapshot, or None; refresh_ttl_s: as load_with_meta's; at: the generation
        that was current at that seq (Compacted when it is no longer kept)."""
        return await self._run(r.load(session_id, at, refresh_ttl_s))

    async def load_with_meta(
        self, session_id: str, *, refresh_ttl_s: r.Seconds = UNSET, at: r.SeqArg = UNSET
    ) -> t.Loaded:
        """{snapshot, digest, seq, expires_at_ms?}; refresh_ttl_s: an expiring session gets
        one that many seconds from now (LangGraph's refresh_on_read); at: as load's, and
        the reply has committed_at_ms."""
        return await self._run(r.load_with_meta(session_id, refresh_ttl_s, at))

    async def history(
        self, session_id: str, *, limit: r.Count = UNSET
    ) -> builtins.list[t.Generation]:
        """The session's generations kept, newest first: [{seq, digest, size,
        committed_at_ms}, ...] ([] when it does not exist)."""
        return await self._run(r.history(session_id, limit))

    async def revert(
        self,
        session_id: str,
        at: int,
        *,
        expect: r.Expect = UNSET,
        lease: r.LeaseArg = UNSET,
        ttl_s: r.Seconds = UNSET,
    ) -> t.Written:
        """Write the generation that was current at seq `at` back as a new generation:
        {digest (its old one), seq (a new one)}."""
        return await self._run(r.revert(session_id, at, expect, lease, ttl_s))

    async def head(self, session_id: str) -> t.Head:
        return await self._run(r.head(session_id))

    async def exists(self, session_id: str) -> bool:
        return await self._run(r.exists(session_id))

    async def list(
        self, prefix: str = "", *, after: str | None = None, limit: int | None = None
    ) -> t.IdPage:
        return await self._run(r.list_ids(prefix, after, limit))

    async def delete(
        self, session_id: str, *, expect: r.Expect = UNSET, lease: r.LeaseArg = UNSET
    ) -> t.Deleted:
        return await self._run(r.delete(session_id, expect, lease))

    async def update(
        self,
        session_id: str,
        component: str,
        value: Any,
        *,
        expect: r.Expect = UNSET,
        lease: r.LeaseArg = UNSET,
    ) -> t.Written:
        return await self._run(r.update(session_id, component, value, expect, lease))

    async def fork(
        self,
        session_id: str,
        new_session_id: str,
        workspace: Any,
        *,
        lease: r.LeaseArg = UNSET,
        at: r.SeqArg = UNSET,
    ) -> t.Written:
        """at: fork the generation that was current at that seq."""
        return await self._run(r.fork(session_id, new_session_id, workspace, lease, at))

    async def checkpoint_put(
        self,
        kind: str,
        key: str,
        value: dict[str, Any],
        *,
        lease: r.LeaseArg = UNSET,
        ttl_s: r.Seconds = UNSET,
    ) -> t.CheckpointPut:
        return await self._run(r.checkpoint_put(kind, key, value, lease, ttl_s))

    async def expire(
        self,
        session_id: str | None,
        ttl_s: float | None,
        *,
        kind: str | None = None,
        key: str | None = None,
        lease: r.LeaseArg = UNSET,
    ) -> t.Expiry:
        """A session's (or with kind and key, a document's) expiry set to ttl_s seconds
        from now, or removed with None: {found, seq, expires_at_ms?}."""
        return await self._run(r.expire(session_id, ttl_s, kind, key, lease))

    async def checkpoint_get(
        self, kind: str, key: str, *, refresh_ttl_s: r.Seconds = UNSET
    ) -> dict[str, Any] | None:
        return await self._run(r.checkpoint_get(kind, key, refresh_ttl_s))

    async def checkpoint_delete(self, kind: str, key: str, *, lease: r.LeaseArg = UNSET) -> bool:
        return await self._run(r.checkpoint_delete(kind, key, lease))

    async def checkpoint_scan(
        self,
        kind: str,
        prefix: str = "",
        *,
        after: str | None = None,
        before: str | None = None,
        limit: int | None = None,
        reverse: bool = False,
        values: bool = True,
        refresh_ttl_s: r.Seconds = UNSET,
    ) -> t.KeyPage:
        """Keyed documents in key order: {"items": [{key, seq, digest, value}], "next"}."""
        return await self._run(
            r.checkpoint_scan(kind, prefix, after, before, limit, reverse, values, refresh_ttl_s)
        )

    async def checkpoint_rank(
        self,
        kind: str,
        prefix: str,
        query: Any,
        *,
        limit: r.Count = UNSET,
        field: str | r.Unset = UNSET,
    ) -> t.Ranking:
        """The documents under prefix whose value holds vectors at field (default
        "vectors": float32 byte strings), best cosine similarity to query first:
        {"items": [{key, score}], "ranked", "scanned"}."""
        return await self._run(r.checkpoint_rank(kind, prefix, query, limit, field))

    async def txn(
        self,
        ops: Sequence[dict[str, Any]],
        *,
        require: r.Requirements = UNSET,
        lease: r.LeaseArg = UNSET,
    ) -> t.TxnResult:
        """Several document changes, all or none: {"seq", "results"}; `conflict` when a
        requirement fails (details: failed, current)."""
        return await self._run(r.txn(list(ops), require, lease))

    async def lease_acquire(self, holder: str) -> t.Lease:
        return await self._run(r.lease_acquire(holder))

    async def lease_get(self) -> t.Lease | None:
        return await self._run(r.lease_get())

    async def lease_release(self, holder: str, epoch: int) -> bool:
        return await self._run(r.lease_release(holder, epoch))

    async def stats(self) -> t.Stats:
        return await self._run(r.stats())

    async def verify(self) -> t.Verified:
        return await self._run(r.verify())

    async def compact(self) -> t.Compaction:
        return await self._run(r.compact())
