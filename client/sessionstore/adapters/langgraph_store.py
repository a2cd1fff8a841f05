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
# Semantic search (index={"dims", "embed", "fields"}): the caller's embedding
# function runs here, in the client, on the texts at the fields of each put.
# The vectors go, as float32 byte strings, into a document beside the item
# under PREFIX + "v/" (same suffix), in the same txn as the item, with the
# same expiry. search(query=...) embeds the query and asks the daemon to rank
# the namespace's vector documents (checkpoint_rank): the cosine similarity of
# each item's best vector, as InMemoryStore scores, computed in the daemon, so
# only keys and scores come back; then the ranked items are read. With a
# filter, the ranking is widened (x4 at a time) until enough ranked items pass
# it, up to the 10,000 nearest. Items without a vector fill what is left of
# the page after every ranked one, as InMemoryStore fills it. A store made
# without an index searches as if no query were given, as InMemoryStore and
# PostgresStore do.
#
# Behaviour is PostgresStore's where the stores differ:
#   - a batch reads first and writes after, all of its puts (and deletes) in
#     one txn (several past TXN_OPS), the last put of a key winning;
#   - an update keeps created_at: the daemon keeps the stored item's as it decides
#     the put (a txn put's `keep`), so a batch of puts is one request;
#   - search without a query orders by updated_at, newest first;
#   - a filter compares as InMemoryStore does ($eq, $ne, $gt, $gte, $lt, $lte,
#     nested maps, dotted keys into them, lists whole), except that an order comparison with a value
#     that is not a number is false, as in PostgreSQL, not an exception;
#   - ttl: an item expires `ttl` minutes after its put (TTLConfig.default_ttl
#     when the put gives none), as a document of the daemon, which removes it;
#     a read with refresh_ttl sets it ttl from now again.
from __future__ import annotations

import concurrent.futures
import struct
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)
from langgraph.store.base.embed import ensure_embeddings, get_text_at_path, tokenize_path

from .. import requests as r
from . import plans
from .keyparts import key_part
from .lifetime import every_item, in_txns
from .plans import KIND, Plan
from .store_filters import matches, matches_condition

ITEM_SEPARATOR = "|"  # between a namespace's labels and an item's key: never encoded
AFTER_NAMESPACE = "}"  # sorts after the separator: an `after` that skips a namespace
MINUTE_S = 60
NAMESPACE_PAGE = 256  # keys per range read when listing namespaces
RANK_MAX_LIMIT = 10_000  # the daemon's widest ranking
KEPT_FIELDS = ["created_at"]  # of a stored item, through every later put
RANK_WIDENING = 4  # a filtered semantic search asks for this many times more each round

Vectors = dict[str, list[bytes]]  # document key of an item: its vectors, float32 bytes
Queries = dict[str, list[float]]  # a search's query text: its vector


def _now_us() -> int:
    return time.time_ns() // 1000


def _time(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC)


class SessionStoreStore(plans.OnRunner, BaseStore):
    """LangGraph's BaseStore in a sessionstore daemon, shared by every process that
    talks to it; see the module comment for what it guarantees."""

    supports_ttl = True

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        prefix: str = "store/",
        timeout: float | None = 60.0,
        client: plans.AnyClient | None = None,
    ) -> None:
        """index: {"dims": N, "embed": an Embeddings or a function, "fields": paths}, as
        InMemoryStore and PostgresStore take it (fields default to the whole value);
        ttl: a TTLConfig (minutes); the daemon sweeps by itself, so
        sweep_interval_minutes is taken and has nothing to set; client: a Client or an
        AsyncClient to use instead of the store's own, as SessionStoreSaver takes it."""
        self.index_config = index
        self.embeddings = None if index is None else ensure_embeddings(index.get("embed"))
        self.dims = 0 if index is None else _dims(index)
        fields = (index or {}).get("fields") or ["$"]
        self._fields = [(p, tokenize_path(p) if p != "$" else p) for p in fields]
        self.ttl_config = _checked_ttl_config(ttl)
        self.items_prefix = f"{prefix}i/"
        self.vectors_prefix = f"{prefix}v/"
        self._sweeper: concurrent.futures.Future[None] | None = None
        self._daemon_keeps: bool | None = None  # hello's txn_keep, asked before a first put
        self._start_runner(socket_path, timeout, client)

    # -- PostgresStore's sweeper methods: the daemon sweeps by itself ------------------

    def sweep_ttl(self) -> int:
        """0: the daemon removes each item the moment it expires (reads never see one
        after), so nothing is left for a caller to sweep."""
        return 0

    def start_ttl_sweeper(
        self, sweep_interval_minutes: int | None = None
    ) -> concurrent.futures.Future[None]:
        """What PostgresStore returns: a future that ends when stop_ttl_sweeper is called.
        Nothing runs meanwhile; the daemon's own sweep does the work."""
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = concurrent.futures.Future()
        return self._sweeper

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        if self._sweeper is not None and not self._sweeper.done():
            self._sweeper.set_result(None)
        return True

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        listed = list(ops)
        puts, texts, queries = self._to_embed(listed)
        vectors: Vectors = {}
        found: Queries = {}
        if self.embeddings is not None and texts:
            vectors = self._vectors(puts, texts, self.embeddings.embed_documents(_flat(texts)))
        if self.embeddings is not None and queries:
            found = {q: self.embeddings.embed_query(q) for q in queries}
        plan = self._batch(listed, vectors, found)
        return self._runner.run(plan)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        listed = list(ops)
        puts, texts, queries = self._to_embed(listed)
        vectors: Vectors = {}
        found: Queries = {}
        if self.embeddings is not None and texts:
            embedded = await self.embeddings.aembed_documents(_flat(texts))
            vectors = self._vectors(puts, texts, embedded)
        if self.embeddings is not None and queries:
            found = {q: await self.embeddings.aembed_query(q) for q in queries}
        plan = self._batch(listed, vectors, found)
        return await self._runner.arun(plan)

    # -- embedding, in the client -----------------------------------------------------

    def _to_embed(self, ops: list[Op]) -> tuple[list[str], list[list[str]], list[str]]:
        """The document keys of the puts to index (the last put of each key), the texts
        of each, and the distinct search queries."""
        if self.embeddings is None:
            return [], [], []
        queries = {op.query: None for op in ops if isinstance(op, SearchOp) and op.query}
        keys, texts = [], []
        for key, op in self._last_puts(ops).items():
            if op.value is None or op.index is False:
                continue
            paths = self._fields if op.index is None else [(p, tokenize_path(p)) for p in op.index]
            found = [text for _, path in paths for text in get_text_at_path(op.value, path)]
            if found:
                keys.append(key)
                texts.append(found)
        return keys, texts, list(queries)

    def _vectors(
        self, keys: list[str], texts: list[list[str]], embedded: list[list[float]]
    ) -> Vectors:
        if len(embedded) != sum(len(t) for t in texts):
            raise ValueError(f"the embedding function gave {len(embedded)} vectors "
                             f"for {sum(len(t) for t in texts)} texts")  # fmt: skip
        vectors: Vectors = {}
        position = 0
        for key, held in zip(keys, texts, strict=True):
            vectors[key] = [self._float32(v) for v in embedded[position : position + len(held)]]
            position += len(held)
        return vectors

    def _float32(self, vector: Sequence[float]) -> bytes:
        if len(vector) != self.dims:
            raise ValueError(f"an embedding of {len(vector)} dimensions; the index has {self.dims}")
        return struct.pack(f"<{len(vector)}f", *vector)

    # -- keys -----------------------------------------------------------------------

    def _namespace_prefix(self, labels: Sequence[str]) -> str:
        return self.items_prefix + "".join(f"{quote(label, safe='')}/" for label in labels)

    def _item_key(self, namespace: Sequence[str], key: str) -> str:
        return f"{self._namespace_prefix(namespace)}{ITEM_SEPARATOR}{key_part(key)}"

    def _last_puts(self, ops: list[Op]) -> dict[str, PutOp]:
        """The last put of each document key, in the order of those last puts."""
        last: dict[str, PutOp] = {}
        for op in ops:
            if isinstance(op, PutOp):
                key = self._item_key(op.namespace, op.key)
                last.pop(key, None)
                last[key] = op
        return last

    def _vector_key(self, item_key: str) -> str:
        return self.vectors_prefix + item_key[len(self.items_prefix) :]

    def _item_key_of_vector(self, vector_key: str) -> str:
        return self.items_prefix + vector_key[len(self.vectors_prefix) :]

    def _namespace_of(self, document_key: str) -> tuple[str, ...]:
        encoded = document_key[len(self.items_prefix) :].split(ITEM_SEPARATOR, 1)[0]
        return tuple(unquote(label) for label in encoded.split("/")[:-1])

    # -- the batch ------------------------------------------------------------------

    def _batch(self, ops: list[Op], vectors: Vectors, queries: Queries) -> Plan[list[Result]]:
        for op in ops:
            if not isinstance(op, GetOp | PutOp | SearchOp | ListNamespacesOp):
                raise ValueError(f"Unknown operation type: {type(op)}")
            validate_op_namespace(op)
        results: list[Result] = [None] * len(ops)
        for op in ops:
            if isinstance(op, PutOp) and op.value is not None and not isinstance(op.value, dict):
                raise TypeError(f"a store value must be a dict, not {type(op.value).__name__}")
        puts = self._last_puts(ops)
        gets = {n: op for n, op in enumerate(ops) if isinstance(op, GetOp)}
        get_keys = [self._item_key(op.namespace, op.key) for op in gets.values()]
        if puts and self._daemon_keeps is None:
            (hello,) = yield [r.hello()]
            self._daemon_keeps = bool(hello["capabilities"].get("txn_keep"))
        # a daemon that keeps created_at itself, as it decides the put, needs no read first
        put_keys = (
            [] if self._daemon_keeps else [k for k, op in puts.items() if op.value is not None]
        )
        found = (
            (yield [r.checkpoint_get(KIND, key) for key in get_keys + put_keys])
            if (get_keys or put_keys)
            else []
        )
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
                if op.query and op.query in queries:
                    ranked = yield from self._ranked(op, queries[op.query], refresh)
                    results[n] = ranked
                else:
                    results[n] = yield from self._search(op, refresh)
            elif isinstance(op, ListNamespacesOp):
                results[n] = yield from self._list_namespaces(op)
        if refresh:
            keys = [*refresh, *(self._vector_key(k) for k in refresh if self.embeddings)]
            ttls = [*refresh.values(), *(t for t in refresh.values() if self.embeddings)]
            yield [r.expire(None, ttl_s, KIND, key) for key, ttl_s in zip(keys, ttls, strict=True)]
        if puts:
            yield from self._commit(puts, read_puts, vectors)
        return results

    def _commit(
        self, puts: dict[str, PutOp], stored: dict[str, Any], vectors: Vectors
    ) -> Plan[None]:
        """The puts and deletes in one txn (TXN_OPS each). A put keeps the created_at of
        the item it replaces: the daemon keeps it as it decides the put (`keep`), or, on
        one without that, as read before (an item's created_at never changes while it
        exists, so no requirement guards it; two first puts racing keep the later's)."""
        ops: list[dict[str, Any]] = []
        now = _now_us()
        for key, op in puts.items():
            vector_key = self._vector_key(key)
            if op.value is None:
                ops.append({"op": "delete", "kind": KIND, "key": key})
                ops.append({"op": "delete", "kind": KIND, "key": vector_key})
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
            if self._daemon_keeps:
                put["keep"] = KEPT_FIELDS
            held = vectors.get(key)
            vector_put: dict[str, Any] = {"op": "put", "kind": KIND, "key": vector_key,
                                          "value": {"vectors": held}}  # fmt: skip
            if op.ttl is not None:
                document["ttl"] = op.ttl
                put["ttl_s"] = vector_put["ttl_s"] = op.ttl * MINUTE_S
            ops.append(put)
            if held:
                ops.append(vector_put)
            # a put that embeds nothing (index=False, or no text at the paths) leaves
            # the item's vectors as they were, as InMemoryStore and PostgresStore do
        yield from in_txns(ops)

    def _search(self, op: SearchOp, refresh: dict[str, float]) -> Plan[list[SearchItem]]:
        found = yield from every_item(self._namespace_prefix(op.namespace_prefix))
        matching = [i for i in found if matches(i["value"]["value"], op.filter)]
        matching.sort(
            key=lambda i: (-i["value"]["updated_at"], i["value"]["namespace"], i["value"]["key"])
        )
        kept = matching[op.offset : op.offset + op.limit]
        if op.refresh_ttl:
            refresh.update({i["key"]: i["value"]["ttl"] * MINUTE_S
                            for i in kept if "ttl" in i["value"]})  # fmt: skip
        return [_search_item(i["value"]) for i in kept]

    def _ranked(
        self, op: SearchOp, query: list[float], refresh: dict[str, float]
    ) -> Plan[list[SearchItem]]:
        """The items nearest to the query, ranked by the daemon, that pass the filter;
        then, past every ranked one, items without a vector (InMemoryStore's order)."""
        prefix = self._namespace_prefix(op.namespace_prefix)
        vectors_prefix = self._vector_key(prefix)
        wanted = op.offset + op.limit
        window = min(max(wanted, 1), RANK_MAX_LIMIT)
        while True:
            (ranking,) = yield [
                r.checkpoint_rank(KIND, vectors_prefix, self._float32(query), window)
            ]
            keys = [self._item_key_of_vector(i["key"]) for i in ranking["items"]]
            stored = (yield [r.checkpoint_get(KIND, key) for key in keys]) if keys else []
            candidates = [
                (item["score"], key, value)
                for item, key, value in zip(ranking["items"], keys, stored, strict=True)
                if value is not None and matches(value["value"], op.filter)
            ]
            every_ranked = len(ranking["items"]) >= ranking["ranked"]
            if len(candidates) >= wanted or every_ranked or window >= RANK_MAX_LIMIT:
                break
            window = min(window * RANK_WIDENING, RANK_MAX_LIMIT)
        kept = candidates[op.offset : op.offset + op.limit]
        results = [_search_item(value, score) for score, _, value in kept]
        if len(kept) < op.limit and every_ranked:  # then the items without a vector
            ranked = set(keys)
            unscored = [
                i for i in (yield from every_item(prefix))
                if i["key"] not in ranked and matches(i["value"]["value"], op.filter)
            ]  # fmt: skip
            for item in unscored[: op.limit - len(kept)]:
                results.append(_search_item(item["value"]))
                kept.append((0.0, item["key"], item["value"]))
        if op.refresh_ttl:
            refresh.update({key: value["ttl"] * MINUTE_S
                            for _, key, value in kept if "ttl" in value})  # fmt: skip
        return results

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
        chosen = [ns for ns in namespaces if all(matches_condition(c, ns) for c in conditions)]
        if op.max_depth is not None:
            chosen = [ns[: op.max_depth] for ns in chosen]
        return sorted(set(chosen))[op.offset : op.offset + op.limit]


def _dims(index: IndexConfig) -> int:
    dims = index.get("dims")
    if isinstance(dims, bool) or not isinstance(dims, int) or not 0 < dims <= 65_536:
        raise ValueError(f"index dims must be an integer from 1 to 65536, not {dims!r}")
    return dims


def _flat(texts: list[list[str]]) -> list[str]:
    return [text for held in texts for text in held]


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
