# The client API, once: every op as a method that builds its Call (requests.py)
# and hands it to the transport's run(). The blocking client's run() returns the
# result; the trio and asyncio clients' run() returns an awaitable of it. So the
# three clients have the same methods with the same signatures by construction
# (a test checks it), and only connecting, sending and watching differ.
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import requests as r
from .requests import UNSET, Call


class OpMethods:
    def run(self, call: Call) -> Any:
        raise NotImplementedError

    def call(self, op: str, **args: Any) -> Any:
        """Any op by name, its whole reply (without ok and rid)."""
        return self.run(r.make(op, **args))

    def hello(self) -> Any:
        return self.run(r.hello())

    def ping(self) -> Any:
        return self.run(r.ping())

    def save(
        self,
        snapshot: dict[str, Any],
        *,
        expect: Any = UNSET,
        lease: Any = UNSET,
        ttl_s: Any = UNSET,
    ) -> Any:
        """ttl_s: the new generation expires that many seconds from now."""
        return self.run(r.save(snapshot, expect, lease, ttl_s))

    def load(self, session_id: str, *, at: Any = UNSET) -> Any:
        """The snapshot, or None; at: the generation that was current at that seq
        (Compacted when it is no longer kept)."""
        return self.run(r.load(session_id, at))

    def load_with_meta(
        self, session_id: str, *, refresh_ttl_s: Any = UNSET, at: Any = UNSET
    ) -> Any:
        """{snapshot, digest, seq, expires_at_ms?}; refresh_ttl_s: an expiring session gets
        one that many seconds from now (LangGraph's refresh_on_read); at: as load's, and
        the reply has committed_at_ms."""
        return self.run(r.load_with_meta(session_id, refresh_ttl_s, at))

    def history(self, session_id: str, *, limit: Any = UNSET) -> Any:
        """The session's generations kept, newest first: [{seq, digest, size,
        committed_at_ms}, ...] ([] when it does not exist)."""
        return self.run(r.history(session_id, limit))

    def revert(
        self,
        session_id: str,
        at: int,
        *,
        expect: Any = UNSET,
        lease: Any = UNSET,
        ttl_s: Any = UNSET,
    ) -> Any:
        """Write the generation that was current at seq `at` back as a new generation:
        {digest (its old one), seq (a new one)}."""
        return self.run(r.revert(session_id, at, expect, lease, ttl_s))

    def head(self, session_id: str) -> Any:
        return self.run(r.head(session_id))

    def exists(self, session_id: str) -> Any:
        return self.run(r.exists(session_id))

    def list(self, prefix: str = "", *, after: str | None = None, limit: int | None = None) -> Any:
        return self.run(r.list_ids(prefix, after, limit))

    def delete(self, session_id: str, *, expect: Any = UNSET, lease: Any = UNSET) -> Any:
        return self.run(r.delete(session_id, expect, lease))

    def update(
        self,
        session_id: str,
        component: str,
        value: Any,
        *,
        expect: Any = UNSET,
        lease: Any = UNSET,
    ) -> Any:
        return self.run(r.update(session_id, component, value, expect, lease))

    def fork(
        self,
        session_id: str,
        new_session_id: str,
        workspace: Any,
        *,
        lease: Any = UNSET,
        at: Any = UNSET,
    ) -> Any:
        """at: fork the generation that was current at that seq."""
        return self.run(r.fork(session_id, new_session_id, workspace, lease, at))

    def checkpoint_put(
        self, kind: str, key: str, value: dict[str, Any], *, lease: Any = UNSET, ttl_s: Any = UNSET
    ) -> Any:
        return self.run(r.checkpoint_put(kind, key, value, lease, ttl_s))

    def expire(
        self,
        session_id: str | None,
        ttl_s: float | None,
        *,
        kind: str | None = None,
        key: str | None = None,
        lease: Any = UNSET,
    ) -> Any:
        """A session's (or with kind and key, a document's) expiry set to ttl_s seconds
        from now, or removed with None: {found, seq, expires_at_ms?}."""
        return self.run(r.expire(session_id, ttl_s, kind, key, lease))

    def checkpoint_get(self, kind: str, key: str, *, refresh_ttl_s: Any = UNSET) -> Any:
        return self.run(r.checkpoint_get(kind, key, refresh_ttl_s))

    def checkpoint_delete(self, kind: str, key: str, *, lease: Any = UNSET) -> Any:
        return self.run(r.checkpoint_delete(kind, key, lease))

    def checkpoint_scan(
        self,
        kind: str,
        prefix: str = "",
        *,
        after: str | None = None,
        before: str | None = None,
        limit: int | None = None,
        reverse: bool = False,
        values: bool = True,
        refresh_ttl_s: Any = UNSET,
    ) -> Any:
        """Keyed documents in key order: {"items": [{key, seq, digest, value}], "next"}."""
        return self.run(
            r.checkpoint_scan(kind, prefix, after, before, limit, reverse, values, refresh_ttl_s)
        )

    def checkpoint_rank(
        self,
        kind: str,
        prefix: str,
        query: Any,
        *,
        limit: Any = UNSET,
        field: Any = UNSET,
    ) -> Any:
        """The documents under prefix whose value holds vectors at field (default
        "vectors": float32 byte strings), best cosine similarity to query first:
        {"items": [{key, score}], "ranked", "scanned"}."""
        return self.run(r.checkpoint_rank(kind, prefix, query, limit, field))

    def txn(
        self, ops: Sequence[dict[str, Any]], *, require: Any = UNSET, lease: Any = UNSET
    ) -> Any:
        """Several document changes, all or none: {"seq", "results"}; `conflict` when a
        requirement fails (details: failed, current)."""
        return self.run(r.txn(list(ops), require, lease))

    def lease_acquire(self, holder: str) -> Any:
        return self.run(r.lease_acquire(holder))

    def lease_get(self) -> Any:
        return self.run(r.lease_get())

    def lease_release(self, holder: str, epoch: int) -> Any:
        return self.run(r.lease_release(holder, epoch))

    def stats(self) -> Any:
        return self.run(r.stats())

    def verify(self) -> Any:
        return self.run(r.verify())

    def compact(self) -> Any:
        return self.run(r.compact())
