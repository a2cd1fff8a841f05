# Every op as (request, how to read its reply): the sans-IO core of the three
# clients (blocking, trio, asyncio), whose op methods (op_methods.py) only hand
# these to their transport.
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from .reply_types import (
    CheckpointPut,
    Compaction,
    Deleted,
    Expiry,
    Generation,
    Head,
    HelloReply,
    IdPage,
    KeyPage,
    Lease,
    Loaded,
    Ranking,
    Stats,
    TxnResult,
    Verified,
    Written,
)
from .wire.value_class import value_class


class Unset:
    """The type of UNSET: an argument not given, which the request leaves out."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = Unset()
# the op methods' optional arguments, as the wire takes them
Expect = str | None | Unset  # a digest (compare-and-swap), None (create-only), or no condition
LeaseArg = Mapping[str, Any] | Unset  # {"holder", "epoch"}, as lease_acquire returns it
Seconds = float | Unset
SeqArg = int | Unset  # a seq: the generation that was current then
Count = int | Unset
Requirements = Sequence[Mapping[str, Any]] | Unset  # a txn's: {kind, key, exists | digest}

ReplyMap = dict[str, Any]
T = TypeVar("T")


@value_class
class Call(Generic[T]):
    """One op's request, and how its reply becomes the op method's result (T)."""

    request: dict[str, Any]
    result: Callable[[ReplyMap], T]


def _whole(reply: ReplyMap) -> ReplyMap:
    return {k: v for k, v in reply.items() if k not in ("ok", "rid")}


def _field(name: str) -> Callable[[ReplyMap], Any]:
    return lambda reply: reply[name]


def make(op: str, result: Callable[[ReplyMap], Any] = _whole, **args: Any) -> Call[Any]:
    return Call({"op": op, **{k: v for k, v in args.items() if v is not UNSET}}, result)


def lease_arg(lease: Any) -> Any:
    """Accept {"holder", "epoch"} maps, lease_acquire's reply, or a (holder, epoch) pair."""
    if lease is UNSET or lease is None:
        return UNSET
    if isinstance(lease, tuple):
        return {"holder": lease[0], "epoch": lease[1]}
    return {"holder": lease["holder"], "epoch": lease["epoch"]}


def hello() -> Call[HelloReply]:
    return make("hello")


def ping() -> Call[None]:
    return make("ping", lambda reply: None)


def save(
    snapshot: dict[str, Any], expect: Any = UNSET, lease: Any = UNSET, ttl_s: Any = UNSET
) -> Call[Written]:
    return make("save", snapshot=snapshot, expect=expect, lease=lease_arg(lease), ttl_s=ttl_s)


def load(
    session_id: str, at: Any = UNSET, refresh_ttl_s: Any = UNSET
) -> Call[dict[str, Any] | None]:
    return make(
        "load",
        lambda r: r["snapshot"] if isinstance(r["snapshot"], dict) else None,
        session_id=session_id,
        at=at,
        refresh_ttl_s=refresh_ttl_s,
    )


def load_with_meta(session_id: str, refresh_ttl_s: Any = UNSET, at: Any = UNSET) -> Call[Loaded]:
    return make("load", session_id=session_id, refresh_ttl_s=refresh_ttl_s, at=at)


def history(session_id: str, limit: Any = UNSET) -> Call[list[Generation]]:
    return make("history", _field("generations"), session_id=session_id, limit=limit)


def revert(
    session_id: str, at: int, expect: Any = UNSET, lease: Any = UNSET, ttl_s: Any = UNSET
) -> Call[Written]:
    return make(
        "revert", session_id=session_id, at=at, expect=expect, lease=lease_arg(lease), ttl_s=ttl_s
    )


def head(session_id: str) -> Call[Head]:
    return make("head", session_id=session_id)


def exists(session_id: str) -> Call[bool]:
    return make("exists", lambda r: bool(r["exists"]), session_id=session_id)


def list_ids(prefix: str = "", after: str | None = None, limit: int | None = None) -> Call[IdPage]:
    return make(
        "list",
        prefix=prefix,
        after=UNSET if after is None else after,
        limit=UNSET if limit is None else limit,
    )


def delete(session_id: str, expect: Any = UNSET, lease: Any = UNSET) -> Call[Deleted]:
    return make("delete", session_id=session_id, expect=expect, lease=lease_arg(lease))


def update(
    session_id: str, component: str, value: Any, expect: Any = UNSET, lease: Any = UNSET
) -> Call[Written]:
    return make(
        "update",
        session_id=session_id,
        component=component,
        value=value,
        expect=expect,
        lease=lease_arg(lease),
    )


def fork(
    session_id: str, new_session_id: str, workspace: Any, lease: Any = UNSET, at: Any = UNSET
) -> Call[Written]:
    return make(
        "fork",
        session_id=session_id,
        new_session_id=new_session_id,
        workspace=workspace,
        lease=lease_arg(lease),
        at=at,
    )


def checkpoint_put(
    kind: str, key: str, value: dict[str, Any], lease: Any = UNSET, ttl_s: Any = UNSET
) -> Call[CheckpointPut]:
    return make(
        "checkpoint_put", kind=kind, key=key, value=value, lease=lease_arg(lease), ttl_s=ttl_s
    )


def expire(
    session_id: str | None,
    ttl_s: float | None,
    kind: str | None = None,
    key: str | None = None,
    lease: Any = UNSET,
) -> Call[Expiry]:
    named = {"session_id": session_id, "kind": kind, "key": key}
    target: dict[str, Any] = {name: value for name, value in named.items() if value is not None}
    # session_id with kind or key is sent as given: the daemon refuses it (bad_request)
    return make("expire", ttl_s=ttl_s, lease=lease_arg(lease), **target)


def checkpoint_get(kind: str, key: str, refresh_ttl_s: Any = UNSET) -> Call[dict[str, Any] | None]:
    return make("checkpoint_get", _field("value"), kind=kind, key=key, refresh_ttl_s=refresh_ttl_s)


def checkpoint_delete(kind: str, key: str, lease: Any = UNSET) -> Call[bool]:
    deleted = lambda reply: bool(reply["deleted"])  # noqa: E731
    return make("checkpoint_delete", deleted, kind=kind, key=key, lease=lease_arg(lease))


def checkpoint_scan(
    kind: str,
    prefix: str = "",
    after: str | None = None,
    before: str | None = None,
    limit: int | None = None,
    reverse: bool = False,
    values: bool = True,
    refresh_ttl_s: Any = UNSET,
) -> Call[KeyPage]:
    return make(
        "checkpoint_scan",
        refresh_ttl_s=refresh_ttl_s,
        kind=kind,
        prefix=prefix,
        after=UNSET if after is None else after,
        before=UNSET if before is None else before,
        limit=UNSET if limit is None else limit,
        reverse=reverse,
        values=values,
    )


def checkpoint_rank(
    kind: str, prefix: str, query: Any, limit: Any = UNSET, field: Any = UNSET
) -> Call[Ranking]:
    return make("checkpoint_rank", kind=kind, prefix=prefix, query=query, limit=limit, field=field)


def txn(ops: list[dict[str, Any]], require: Any = UNSET, lease: Any = UNSET) -> Call[TxnResult]:
    return make("txn", ops=ops, require=require, lease=lease_arg(lease))


def lease_acquire(holder: str) -> Call[Lease]:
    return make("lease_acquire", holder=holder)


def lease_get() -> Call[Lease | None]:
    return make("lease_get", _field("lease"))


def lease_release(holder: str, epoch: int) -> Call[bool]:
    released = lambda reply: bool(reply["released"])  # noqa: E731
    return make("lease_release", released, holder=holder, epoch=epoch)


def stats() -> Call[Stats]:
    return make("stats")


def verify() -> Call[Verified]:
    return make("verify")


def compact() -> Call[Compaction]:
    return make("compact")
