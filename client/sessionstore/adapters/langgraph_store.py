# LangGraph's long-term memory store on sessionstore: `SessionStoreStore`, a
# `BaseStore` whose batch and abatch run GetOp, PutOp, SearchOp and
# ListNamespacesOp, so every derived method (put, get, delete, search,
# list_namespaces, and their async twins) works as LangGraph documents it.
#
# Layout: each item is one `kv` document under PREFIX + "i/", at its namespace's
# labels, each percent-encoded and followed by "/", then "|" and the item's key
# as a key part (keyparts.py):  store/i/users/42/|prefs. "|" never appears in
# an encoded label, so a namespace's items are one key range, a namespace
# prefix's are another, and the namespaces can be listed by skipping from one
# namespace's items to the next. The value holds the namespace and key as
# given, the item's value, created_at and updated_at (microseconds since the
# epoch) and its ttl in minutes, if any.
#
# Behaviour is PostgresStore's where the stores differ:
#   - a batch reads first and writes after, all of its puts (and deletes) in
#     one txn (several past TXN_OPS), the last put of a key winning;
#   - an update keeps created_at: a batch reads the items it writes first;
#   - search without a query orders by updated_at, newest first;
#   - a filter compares as InMemoryStore does ($eq, $ne, $gt, $gte, $lt, $lte,
#     nested maps, lists whole), except that an order comparison with a value
#     that is not a number is false, as in PostgreSQL, not an exception;
#   - ttl: an item expires `ttl` minutes after its put (TTLConfig.default_ttl
#     when the put gives none), as a document of the daemon, which removes it;
#     a read with refresh_ttl sets it ttl from now again.
from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)

from .. import requests as r
from ..asyncio_client import ClientPerLoop
from ..client import Client
from . import plans
from .keyparts import key_part
from .lifetime import every_item, in_txns
from .plans import KIND, Plan

ITEM_SEPARATOR = "|"  # between a namespace's labels and an item's key: never encoded
AFTER_NAMESPACE = "}"  # sorts after the separator: an `after` that skips a namespace
MINUTE_S = 60
NAMESPACE_PAGE = 256  # keys per range read when listing namespaces


def _now_us() -> int:
    return time.time_ns() // 1000


def _time(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC)


class SessionStoreStore(BaseStore):
    """LangGraph's BaseStore in a sessionstore daemon, shared by every process that
    talks to it; see the module comment for what it guarantees."""

    supports_ttl = True

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        index: Any = None,
        ttl: TTLConfig | None = None,
        prefix: str = "store/",
        timeout: float | None = 60.0,
    ) -> None:
        if index is not None:
            raise NotImplementedError("SessionStoreStore has no semantic search (index) yet")
        self.socket_path = socket_path
        self.timeout = timeout
        self.ttl_config = _checked_ttl_config(ttl)
        self.items_prefix = f"{prefix}i/"
        self._client: Client | None = None
        self._client_lock = threading.Lock()
        self._async_clients = ClientPerLoop(socket_path, timeout)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        await self._async_clients.aclose()

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        plan = self._batch(list(ops))
        with self._client_lock:
            if self._client is None:
                self._client = Client(self.socket_path, timeout=self.timeout)
            return plans.run(self._client, plan)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await plans.arun(self._async_clients.current(), self._batch(list(ops)))

    # -- keys -----------------------------------------------------------------------

    def _namespace_prefix(self, labels: Sequence[str]) -> str:
        return self.items_prefix + "".join(f"{quote(label, safe='')}/" for label in labels)

    def _item_key(self, namespace: Sequence[str], key: str) -> str:
        return f"{self._namespace_prefix(namespace)}{ITEM_SEPARATOR}{key_part(key)}"

    def _namespace_of(self, document_key: str) -> tuple[str, ...]:
        encoded = document_key[len(self.items_prefix) :].split(ITEM_SEPARATOR, 1)[0]
        return tuple(unquote(label) for label in encoded.split("/")[:-1])

    # -- the batch ------------------------------------------------------------------

    def _batch(self, ops: list[Op]) -> Plan[list[Result]]:
        for op in ops:
            if not isinstance(op, GetOp | PutOp | SearchOp | ListNamespacesOp):
                raise ValueError(f"Unknown operation type: {type(op)}")
            validate_op_namespace(op)
        results: list[Result] = [None] * len(ops)
        puts: dict[str, PutOp] = {}  # the last put of each key wins
        for op in ops:
            if isinstance(op, PutOp):
                if op.value is not None and not isinstance(op.value, dict):
                    raise TypeError(f"a store value must be a dict, not {type(op.value).__name__}")
                puts.pop(self._item_key(op.namespace, op.key), None)
                puts[self._item_key(op.namespace, op.key)] = op
        gets = {n: op for n, op in enumerate(ops) if isinstance(op, GetOp)}
        get_keys = [self._item_key(op.namespace, op.key) for op in gets.values()]
        put_keys = [k for k, op in puts.items() if op.value is not None]
        found = yield [r.checkpoint_get(KIND, key) for key in get_keys + put_keys]
        read_puts = dict(zip(put_keys, found[len(get_keys) :], strict=True))
        refresh: dict[str, float] = {}  # document key: its ttl in seconds, to set again
        for (n, op), key, stored in zip(
            gets.items(), get_keys, found[: len(get_keys)], strict=True
        ):
            results[n] = None if stored is None else _item(stored)
            if stored is not None and op.refresh_ttl and "ttl" in stored:
                refresh[key] = stored["ttl"] * MINUTE_S
        for n, op in enumerate(ops):
            if isinstance(op, SearchOp):
                items = yield from self._search(op, refresh)
                results[n] = items
            elif isinstance(op, ListNamespacesOp):
                results[n] = yield from self._list_namespaces(op)
        if refresh:
            yield [r.expire(None, ttl_s, KIND, key) for key, ttl_s in refresh.items()]
        if puts:
            yield from self._commit(puts, read_puts)
        return results

    def _commit(self, puts: dict[str, PutOp], stored: dict[str, Any]) -> Plan[None]:
        """The puts and deletes in one txn (TXN_OPS each). A put keeps the created_at of
        the item it replaces, as read before: an item's created_at never changes while
        it exists, so no requirement guards it (two first puts racing keep the later's)."""
        ops: list[dict[str, Any]] = []
        now = _now_us()
        for key, op in puts.items():
            if op.value is None:
                ops.append({"op": "delete", "kind": KIND, "key": key})
                continue
            before = stored.get(key)
            document: dict[str, Any] = {
                "namespace": list(op.namespace),
                "key": op.key,
                "value": op.value,
                "created_at": now if before is None else before["created_at"],
                "updated_at": now,
            }
            put: dict[str, Any] = {"op": "put", "kind": KIND, "key": key, "value": document}
            if op.ttl is not None:
                document["ttl"] = op.ttl
                put["ttl_s"] = op.ttl * MINUTE_S
            ops.append(put)
        yield from in_txns(ops)

    def _search(self, op: SearchOp, refresh: dict[str, float]) -> Plan[list[SearchItem]]:
        if op.query:
            raise NotImplementedError("SessionStoreStore has no semantic search (query) yet")
        found = yield from every_item(self._namespace_prefix(op.namespace_prefix))
        matching = [i for i in found if _matches(i["value"]["value"], op.filter)]
        matching.sort(
            key=lambda i: (-i["value"]["updated_at"], i["value"]["namespace"], i["value"]["key"])
        )
        kept = matching[op.offset : op.offset + op.limit]
        if op.refresh_ttl:
            refresh.update({i["key"]: i["value"]["ttl"] * MINUTE_S
                            for i in kept if "ttl" in i["value"]})  # fmt: skip
        return [_search_item(i["value"]) for i in kept]

    def _list_namespaces(self, op: ListNamespacesOp) -> Plan[list[tuple[str, ...]]]:
        """Every namespace with an item, read a page of keys at a time, skipping the
        rest of each namespace's items; narrowed to a prefix condition's fixed labels."""
        fixed: list[str] = []
        for condition in op.match_conditions or ():
            if condition.match_type == "prefix":
                for label in condition.path:
                    if label == "*":
                        break
                    fixed.append(label)
                break
        start = self._namespace_prefix(fixed)
        namespaces: set[tuple[str, ...]] = set()
        after: str | None = None
        while True:
            (page,) = yield [
                r.checkpoint_scan(KIND, start, after, limit=NAMESPACE_PAGE, values=False)
            ]
            for item in page["items"]:
                namespaces.add(self._namespace_of(item["key"]))
            if page["next"] is None:
                break
            last = page["items"][-1]["key"]
            after = last.split(ITEM_SEPARATOR, 1)[0] + AFTER_NAMESPACE
        conditions = op.match_conditions or ()
        chosen = [ns for ns in namespaces if all(_matches_condition(c, ns) for c in conditions)]
        if op.max_depth is not None:
            chosen = [ns[: op.max_depth] for ns in chosen]
        return sorted(set(chosen))[op.offset : op.offset + op.limit]


def _checked_ttl_config(ttl: TTLConfig | None) -> TTLConfig | None:
    if ttl is None:
        return None
    unknown = set(ttl) - {"default_ttl", "refresh_on_read", "sweep_interval_minutes"}
    if unknown:
        raise ValueError(f"unknown ttl settings {sorted(unknown)}")
    minutes = ttl.get("default_ttl")
    if minutes is not None and (
        isinstance(minutes, bool) or not isinstance(minutes, int | float) or not minutes > 0
    ):
        raise ValueError(f"default_ttl must be a number of minutes above 0, not {minutes!r}")
    return ttl


def _item(stored: dict[str, Any]) -> Item:
    return Item(
        value=stored["value"],
        key=stored["key"],
        namespace=tuple(stored["namespace"]),
        created_at=_time(stored["created_at"]),
        updated_at=_time(stored["updated_at"]),
    )


def _search_item(stored: dict[str, Any], score: float | None = None) -> SearchItem:
    return SearchItem(
        namespace=tuple(stored["namespace"]),
        key=stored["key"],
        value=stored["value"],
        created_at=_time(stored["created_at"]),
        updated_at=_time(stored["updated_at"]),
        score=score,
    )


# -- filters, as InMemoryStore compares (order comparisons of non-numbers: false) --

ORDER_OPERATORS = {
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}


def _matches(value: dict[str, Any], filter: dict[str, Any] | None) -> bool:
    return not filter or all(_compare(value.get(k), wanted) for k, wanted in filter.items())


def _compare(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        if any(str(k).startswith("$") for k in wanted):
            return all(_operator(value, name, operand) for name, operand in wanted.items())
        return isinstance(value, dict) and all(_compare(value.get(k), w) for k, w in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(value, list | tuple)
            and len(value) == len(wanted)
            and all(_compare(v, w) for v, w in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)


def _operator(value: Any, name: str, operand: Any) -> bool:
    if name == "$eq":
        return bool(value == operand)
    if name == "$ne":
        return bool(value != operand)
    if name in ORDER_OPERATORS:
        number, bound = _number(value), _number(operand)
        return number is not None and bound is not None and ORDER_OPERATORS[name](number, bound)
    raise ValueError(f"Unsupported operator: {name}")


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _matches_condition(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    if not path:
        return True
    return all(want == "*" or want == label for want, label in zip(path, part, strict=True))
