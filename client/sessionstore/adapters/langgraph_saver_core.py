# What SessionStoreSaver (langgraph.py, which says what it guarantees) stands on: the
# key layout of its documents, its clients and plans, a thread's lifetime guards, the
# writes of checkpoints and their writes, and reading stored values back.
from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from .. import requests as r
from ..effects import AsyncLedger, Ledger, Scope
from ..errors import Conflict, SessionStoreError
from ..requests import Call
from . import plans
from .keyparts import key_part
from .langgraph_keys import SaverKeys
from .lifetime import (
    Items,
    Lifetime,
    Members,
    digest_of,
    every_item,
    group_gone,
    in_txns,
    lapsed,
    now_ms,
    timed,
    untimed,
)
from .ownership import LEASE_TTL_S, Commit, fenced_txn, one_txn, owner_of, take_over
from .plans import KIND, SCAN_PAGE, TXN_OPS, Plan, put_op

T = TypeVar("T")
RunsByThread = dict[str, list[str]]
Calls = list[Call[Any]]

PAGE = 100  # checkpoints per range read when listing
MINUTE_S = 60  # the ttl config counts minutes, as RedisSaver's does
DELTA_METADATA = "counters_since_delta_snapshot"  # a checkpoint of a DeltaChannel graph
PUT_ATTEMPTS = 8  # a put whose parent was never stored, while deletions change meanwhile


class DeletedCheckpoint(SessionStoreError):
    """A write built on a checkpoint that is no longer stored (the thread was deleted
    or pruned after the write began): refused, so the deletion stands."""

    code = "deleted_checkpoint"


class CorruptCheckpoint(SessionStoreError):
    """A stored checkpoint or write that cannot be deserialised."""

    code = "corrupt_checkpoint"


def _exists(key: str) -> dict[str, Any]:
    return {"kind": KIND, "key": key, "exists": True}


def scan_call(prefix: str, **options: Any) -> Call[Any]:
    return r.checkpoint_scan(KIND, prefix, **options)


class SaverCore(plans.OnRunner, BaseCheckpointSaver[int]):
    """The saver's state and the plans its public methods share."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        prefix: str = "langgraph/",
        serde: SerializerProtocol | None = None,
        timeout: float | None = 60.0,
        ttl: Mapping[str, Any] | None = None,
        client: plans.AnyClient | None = None,
        owner: str | None = None,
        lease_ttl_s: float = LEASE_TTL_S,
    ) -> None:
        """ttl: {"default_ttl": minutes, "refresh_on_read": bool}, as RedisSaver takes
        it: a thread is gone that long after its last write (and read, with
        refresh_on_read), every document of it at once. client: a Client (for the sync
        methods) or an AsyncClient (for the async ones, on its event loop) to use
        instead of the saver's own; the caller closes it. owner: this saver's name as the
        owner of the threads it writes (ownership.py): once another owner has taken a
        thread over, this saver's writes to it raise StaleOwner and change nothing."""
        super().__init__(serde=serde)
        self.keys = SaverKeys(prefix)
        self.lifetime = _lifetime(ttl)
        self.owner = owner_of(owner, lease_ttl_s)
        self._start_runner(socket_path, timeout, client)

    def take_over(self, thread_id: str) -> None:
        """This saver's owner takes the thread, at the next epoch: its previous owner's
        next write is refused with StaleOwner (owner= needed)."""
        self._run(take_over(self.owner, self.keys.owner(thread_id)))

    async def atake_over(self, thread_id: str) -> None:
        await self._arun(take_over(self.owner, self.keys.owner(thread_id)))

    def effects(self, thread_id: str) -> Ledger:
        """The thread's tool-effect ledger (sessionstore.effects), for blocking nodes and
        tools: its records are writes to the thread (under this saver's owner, expiring
        with the thread), removed with it and copied with it."""
        return Ledger.of_adapter(self._effects_scope(thread_id), self._runner)

    def aeffects(self, thread_id: str) -> AsyncLedger:
        """effects(), for async nodes and tools."""
        return AsyncLedger.of_adapter(self._effects_scope(thread_id), self._runner)

    def _effects_scope(self, thread: str) -> Scope:
        write = functools.partial(self._write, thread)
        expired = functools.partial(lapsed, self.lifetime, self.keys.lifetime(thread))
        return Scope(self.keys.effects(thread), write, expired)

    # -- running plans ------------------------------------------------------------

    def _run(self, plan: Plan[T]) -> T:
        return self._runner.run(plan)

    async def _arun(self, plan: Plan[T]) -> T:
        return await self._runner.arun(plan)

    def get_next_version(self, current: int | None, channel: None) -> int:
        return 1 if current is None else int(current) + 1

    # -- plans ---------------------------------------------------------------------

    def _get_tuple(self, config: RunnableConfig) -> Plan[CheckpointTuple | None]:
        configurable = config["configurable"]
        thread, ns = str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        latest = not checkpoint_id
        guard = self._guards([thread])  # with a ttl, read with the thread's documents
        if checkpoint_id:
            key = self.keys.checkpoint(thread, ns, checkpoint_id)
            writes_prefix = self.keys.checkpoint_writes(thread, ns, checkpoint_id)
            # a range from the key, whose first item is the key itself when it is stored
            *life, found, writes = yield [
                *guard,
                scan_call(key, limit=1),
                first_page(writes_prefix),
            ]
            items = [item for item in found["items"] if item["key"] == key]
        else:
            *life, found = yield [
                *guard,
                scan_call(self.keys.namespace_checkpoints(thread, ns), reverse=True, limit=1),
            ]
            items = found["items"]
            if items:
                checkpoint_id = items[0]["value"]["checkpoint_id"]
                writes_prefix = self.keys.checkpoint_writes(thread, ns, checkpoint_id)
                (writes,) = yield [first_page(writes_prefix)]
        if not items:
            return None
        item_writes = yield from whole_range(writes_prefix, writes)
        if (yield from self._expired_threads({thread: items + item_writes}, life)):
            items, item_writes = untimed(items), untimed(item_writes)
            if not items and latest:  # the newest is a leftover: the newest written since
                newest = yield from self._newest_untimed(
                    self.keys.namespace_checkpoints(thread, ns)
                )
                if newest is None:
                    return None
                at = {**configurable, "checkpoint_ns": ns, "checkpoint_id": newest}
                return (yield from self._get_tuple({"configurable": at}))
            if not items:
                return None
        return self._tuple(items[0]["key"], items[0]["value"], item_writes)

    def _newest_untimed(self, prefix: str) -> Plan[str | None]:
        """The id of the newest checkpoint in the range that has no expiry, if any."""
        before: str | None = None
        while True:
            (page,) = yield [
                scan_call(prefix, reverse=True, limit=SCAN_PAGE, before=before, values=False)
            ]
            for item in untimed(page["items"]):
                (value,) = yield [r.checkpoint_get(KIND, item["key"])]
                if value is not None:  # else deleted meanwhile
                    return str(value["checkpoint_id"])
            before = page["next"]
            if before is None:
                return None

    # -- a thread's lifetime (see lifetime.py) -------------------------------------

    def _guards(self, threads: Sequence[str]) -> Calls:
        """With a ttl: the reads of the threads' lifetimes, to send with their documents'."""
        if self.lifetime is None:
            return []
        return [self.lifetime.guard(self.keys.lifetime(thread)) for thread in threads]

    def _expired_threads(
        self, items: dict[str, Items], lives: Sequence[Any] | None = None
    ) -> Plan[set[str]]:
        """Of the threads whose documents were just read, those whose lifetime has
        expired: of their documents, only the untimed() ones are read. lives: their
        lifetimes as _guards read them, when it was sent."""
        threads = list(items)
        if lives is None or not lives:
            asked = [t for t in threads if self.lifetime is not None or timed(items[t])]
            if self.lifetime is None:  # a reader without a ttl asks only of expiring threads
                gone = set()
                for thread in asked:
                    if (yield from group_gone(self.keys.lifetime(thread), items[thread])):
                        gone.add(thread)
                return gone
            lives = (yield self._guards(asked)) if asked else []
            threads = asked
        assert self.lifetime is not None
        gone = set()
        for thread, life in zip(threads, lives, strict=True):
            if self.lifetime.gone(life, items[thread]):
                gone.add(thread)
            else:
                key = self.keys.lifetime(thread)
                yield from self.lifetime.after_read(key, life, self._members(thread))
        return gone

    def _members(self, thread: str) -> Members:
        """Every document of the thread, values left out: what its lifetime covers."""

        def members() -> Plan[Items]:
            runs = (yield from self._runs_of([thread]))[thread]
            prefixes = [
                self.keys.thread_checkpoints(thread),
                self.keys.thread_writes(thread),
                self.keys.thread_runs(thread),
                self.keys.effects(thread),
                *(f"{self.keys.prefix}r/{run}/{key_part(thread)}/" for run in runs),
            ]
            found: Items = []
            for prefix in prefixes:
                found += yield from every_item(prefix, values=False)
            return found

        return members

    def _write(self, thread: str, ops: Items, require: Items | None = None) -> Plan[None]:
        """One thread's ops, in txns under require, each under the owner's lease on the
        thread (with owner=); with a ttl each renews the thread's lifetime, and its
        documents expire with the thread."""
        scope = self.keys.owner(thread)
        if self.lifetime is None:
            yield from self._fenced(scope, ops, require or [], one_txn, TXN_OPS)
            return
        life_key, members = self.keys.lifetime(thread), self._members(thread)
        renewing = functools.partial(self.lifetime.commit, life_key, members=members)
        yield from self._fenced(scope, ops, require or [], renewing, TXN_OPS - 1)

    def _remove(self, removals: dict[str, Items]) -> Plan[None]:
        """Removals from threads, by the key of each one's owner document: not renewing a
        lifetime, and with owner= each thread's in txns under the owner's lease on it."""
        if self.owner is None:  # as few txns as the removals fill
            yield from in_txns([op for ops in removals.values() for op in ops])
            return
        for scope, ops in removals.items():
            yield from self._fenced(scope, ops, [], one_txn, TXN_OPS)

    def _fenced(
        self, scope: str, ops: Items, require: Items, commit: Commit, per_txn: int
    ) -> Plan[None]:
        per_txn -= self.owner is not None  # one op of each is the lease's
        for start in range(0, len(ops), per_txn):
            chunk = ops[start : start + per_txn]
            yield from fenced_txn(self.owner, scope, chunk, require, commit)

    def put_op(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> Plan[RunnableConfig]:
        configurable = config["configurable"]
        thread, ns = str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")
        parent_id = configurable.get("checkpoint_id")
        checkpoint_id = checkpoint["id"]
        checkpoint_type, checkpoint_bytes = self.serde.dumps_typed(checkpoint)
        stored_metadata = get_serializable_checkpoint_metadata(config, metadata)
        metadata_type, metadata_bytes = self.serde.dumps_typed(stored_metadata)
        run_id = stored_metadata.get("run_id")
        value = {
            "thread_id": thread,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
            "parent_checkpoint_id": parent_id,
            "run_id": None if run_id is None else str(run_id),
            "type": checkpoint_type,
            "checkpoint": checkpoint_bytes,
            "metadata_type": metadata_type,
            "metadata": metadata_bytes,
            "delta": DELTA_METADATA in stored_metadata,  # prune refuses such threads
        }
        ops = [put_op(self.keys.checkpoint(thread, ns, checkpoint_id), value)]
        if run_id is not None:
            ops.append(put_op(self.keys.run_marker(str(run_id), thread, ns, checkpoint_id), {}))
            ops.append(put_op(self.keys.thread_run(thread, str(run_id)), {}, if_absent=True))
        require = [] if not parent_id else [_exists(self.keys.checkpoint(thread, ns, parent_id))]
        for _attempt in range(PUT_ATTEMPTS):
            try:
                yield from self._write(thread, ops, require)
                break
            except Conflict as error:
                assert parent_id
                # the parent is not stored: deleted (refused, so that the deletion stands),
                # or never stored (taken, on the tombstones as they are now)
                require = yield from self._never_deleted(thread, ns, parent_id, error)
        else:
            raise SessionStoreError("the thread's tombstones kept changing under this put")
        return {
            "configurable": {
                "thread_id": thread,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }

    def _never_deleted(
        self, thread: str, ns: str, parent_id: str, conflict: Conflict
    ) -> Plan[Items]:
        """Requirements that hold while no tombstone covers parent_id: the tombstones as
        they are now. DeletedCheckpoint if one covers it."""
        keys = [
            self.keys.thread_deleted(thread),
            self.keys.namespace_pruned(thread, ns),
            self.keys.checkpoint_deleted(thread, ns, parent_id),
        ]
        values = yield [r.checkpoint_get(KIND, key) for key in keys]
        thread_gone, ns_pruned, checkpoint_gone = values
        if (
            checkpoint_gone is not None
            or (thread_gone is not None and parent_id <= thread_gone["upto"])
            or (ns_pruned is not None and parent_id <= ns_pruned["upto"])
        ):
            raise DeletedCheckpoint(
                f"checkpoint {parent_id!r} of thread {thread!r} (namespace {ns!r}) was deleted; "
                "a checkpoint built on it is refused so that the deletion stands",
                conflict.details,
            ) from conflict
        return [
            {"kind": KIND, "key": key, "exists": False}
            if value is None
            else {"kind": KIND, "key": key, "digest": digest_of(value)}
            for key, value in zip(keys, values, strict=True)
        ]

    def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> Plan[None]:
        if not writes:
            return
        configurable = config["configurable"]
        thread, ns = str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")
        checkpoint_id = str(configurable["checkpoint_id"])
        ops = []
        for position, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, position)
            value_type, value_bytes = self.serde.dumps_typed(value)
            document = {
                "task_id": task_id,
                "task_path": task_path,
                "idx": idx,
                "channel": channel,
                "type": value_type,
                "value": value_bytes,
            }
            key = self.keys.write(thread, ns, checkpoint_id, task_id, idx)
            ops.append(put_op(key, document, if_absent=idx >= 0))
        yield from self._write(thread, ops)

    def _runs_of(self, threads: Sequence[str]) -> Plan[RunsByThread]:
        """The runs of each thread, as encoded key parts."""
        prefixes = [self.keys.thread_runs(thread) for thread in threads]
        pages = yield [scan_call(prefix, values=False, limit=SCAN_PAGE) for prefix in prefixes]
        runs: RunsByThread = {}
        for thread, prefix, page in zip(threads, prefixes, pages, strict=True):
            items = yield from whole_range(prefix, page)
            runs[thread] = [item["key"][len(prefix) :] for item in items]
        return runs

    def _uses_delta(self, item: dict[str, Any]) -> bool:
        """Whether a stored checkpoint's metadata counts DeltaChannel snapshots."""
        value = item["value"]
        if "delta" in value:
            return bool(value["delta"])
        metadata = self._loads("metadata", item["key"], value["metadata_type"], value["metadata"])
        return DELTA_METADATA in metadata

    # -- reading stored values ------------------------------------------------------

    def _loads(self, what: str, key: str, value_type: Any, data: Any) -> Any:
        try:
            return self.serde.loads_typed((value_type, data))
        except Exception as error:
            raise CorruptCheckpoint(
                f"cannot deserialise the {what} stored at {key!r}: {error}"
            ) from error

    def _tuple(self, key: str, value: Any, writes: Items) -> CheckpointTuple:
        try:
            thread, ns = value["thread_id"], value["checkpoint_ns"]
            checkpoint_id, parent_id = value["checkpoint_id"], value["parent_checkpoint_id"]
            checkpoint = self._loads("checkpoint", key, value["type"], value["checkpoint"])
            metadata = self._loads("metadata", key, value["metadata_type"], value["metadata"])
            ordered: Items = sorted(
                writes,
                key=lambda w: (w["value"]["task_path"], w["value"]["task_id"], w["value"]["idx"]),
            )
            pending = [
                (
                    w["value"]["task_id"],
                    w["value"]["channel"],
                    self._loads("write", w["key"], w["value"]["type"], w["value"]["value"]),
                )
                for w in ordered
            ]
        except (KeyError, TypeError) as error:
            raise CorruptCheckpoint(
                f"the document at {key!r} is not a checkpoint: {error!r}"
            ) from error
        parent = None
        if parent_id:
            parent = {
                "configurable": {
                    "thread_id": thread,
                    "checkpoint_ns": ns,
                    "checkpoint_id": parent_id,
                }
            }
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id,
                }
            },
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=parent,  # type: ignore[arg-type]
            pending_writes=pending,
        )


def _lifetime(ttl: Mapping[str, Any] | None) -> Lifetime | None:
    if ttl is None:
        return None
    unknown = set(ttl) - {"default_ttl", "refresh_on_read"}
    if unknown:
        raise ValueError(f"unknown ttl settings {sorted(unknown)}: default_ttl, refresh_on_read")
    minutes = ttl.get("default_ttl")
    if minutes is None:
        return None  # as RedisSaver: no default_ttl, nothing expires
    if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not minutes > 0:
        raise ValueError(f"default_ttl must be a number of minutes above 0, not {minutes!r}")
    return Lifetime(minutes * MINUTE_S, bool(ttl.get("refresh_on_read", False)))


def keeping_expiry(op: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """A put that rewrites the item keeps the expiry the item had."""
    if "expires_at_ms" not in item:
        return op
    return {**op, "ttl_s": max(0.001, (item["expires_at_ms"] - now_ms()) / 1000)}


# what the items of each id argument are, in PostgresSaver's words for thread_ids
_ITEMS = {"thread_ids": "thread IDs", "run_ids": "run IDs", "channels": "channel names"}


def checked_ids(values: Sequence[str], name: str) -> list[str]:
    """A sequence of ids as a list; a lone string is refused (iterating it would act on
    one id per character) with the words PostgresSaver uses, which the frameworks'
    own tests match."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        kind = type(values).__name__
        article = "an" if kind[0] in "aeiou" else "a"
        raise TypeError(f"{name} must be a sequence of {_ITEMS[name]}, not {article} {kind}")
    return [str(value) for value in values]


def checked_pairs(writes: Sequence[tuple[str, Any]]) -> Sequence[tuple[str, Any]]:
    if isinstance(writes, (str, bytes, dict)) or not isinstance(writes, Iterable):
        raise TypeError(
            f"writes must be a sequence of (channel, value), not {type(writes).__name__}"
        )
    return writes


def address_of(value: dict[str, Any]) -> tuple[str, str, str]:
    return value["thread_id"], value["checkpoint_ns"], value["checkpoint_id"]


def first_page(prefix: str) -> Call[Any]:
    """The first page of a range (most checkpoints' writes fit in it; whole_range reads on)."""
    return scan_call(prefix, limit=SCAN_PAGE)


def whole_range(prefix: str, page: dict[str, Any]) -> Plan[list[dict[str, Any]]]:
    """A range's items: the first page read already, and any pages after it."""
    rest = [] if page["next"] is None else (yield from every_item(prefix, page["next"]))
    return [*page["items"], *rest]
