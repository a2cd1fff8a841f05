# A LangGraph checkpointer on sessionstore: `SessionStoreSaver`, sync and
# async, with the extended capabilities (delete_for_runs, copy_thread, prune).
#
# Layout, all `kv` documents under one prefix (default "langgraph/"), each
# part of a key encoded by keyparts.key_part:
#   c/THREAD/NS/CHECKPOINT             a checkpoint, its metadata, its parent
#   w/THREAD/NS/CHECKPOINT/TASK/IDX    one pending write
#   r/RUN/THREAD/NS/CHECKPOINT         "this run wrote this checkpoint"
#   t/THREAD/RUN                       "this thread has checkpoints of this run"
# Checkpoint ids are uuid6 text, so key order is time order within a
# namespace and "newest first" is a reverse range read.
#
# Every call is one round trip or a few, and every write is one `txn`: all of
# its documents commit together or none does. A write of more documents than one
# txn takes (TXN_OPS, the daemon's limit: put_writes of over 10,000 writes,
# copy_thread or prune of a thread with thousands of checkpoints) is sent as
# several, in an order that keeps what a reader sees whole if the daemon dies
# between them: a copy puts the writes before the checkpoints they belong to, so
# a checkpoint is never seen without its writes; a prune deletes checkpoints
# before their writes; a put_writes cut short is finished by the task's next run
# (regular writes are stored only where absent).
#
# Deleted stays deleted. delete_thread, prune and delete_for_runs leave
# tombstones (d/THREAD and d/THREAD/NS: every checkpoint up to an id; x/...:
# one checkpoint), and a checkpoint put on a parent that is not stored is
# refused (DeletedCheckpoint) when a tombstone covers that parent, so a run
# that goes on after its checkpoints were removed recreates nothing. A parent
# that was never stored is taken, as every LangGraph saver takes it (the put
# then requires the tombstones as they were read, so a deletion meanwhile is
# not missed). The fast path, a parent that is stored, is one round trip. Its put_writes are not
# chained (with durability="async" they may arrive before their checkpoint),
# so they cannot be told from late ones and are stored; a write is only ever
# read with its checkpoint, so a late one is never seen, and delete_thread and
# prune remove it. put_writes is idempotent: a regular write is stored only
# where absent; the special channels (ERROR, INTERRUPT, ...) overwrite, as in
# LangGraph's own savers. A stored value that cannot be deserialised raises
# CorruptCheckpoint, never None.
#
# The decisions are written once, as plans: generators that yield the calls
# they need (sent pipelined) and get the results back. The sync methods run
# them on the blocking client, the async ones on the asyncio client.
from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.serde.base import SerializerProtocol

from .. import requests as r
from ..errors import Conflict, SessionStoreError
from ..requests import Call
from . import plans
from .keyparts import key_part
from .lifetime import (
    Items,
    Lifetime,
    Members,
    digest_of,
    every_item,
    group_gone,
    in_txns,
    now_ms,
    timed,
)
from .plans import KIND, SCAN_PAGE, TXN_OPS, Plan, delete_op, delete_prefix_op, put_op

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


class _Keys:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def thread_checkpoints(self, thread: str) -> str:
        return f"{self.prefix}c/{key_part(thread)}/"

    def namespace_checkpoints(self, thread: str, ns: str) -> str:
        return f"{self.thread_checkpoints(thread)}{key_part(ns)}/"

    def checkpoint(self, thread: str, ns: str, checkpoint_id: str) -> str:
        return f"{self.namespace_checkpoints(thread, ns)}{key_part(checkpoint_id)}"

    def thread_writes(self, thread: str) -> str:
        return f"{self.prefix}w/{key_part(thread)}/"

    def checkpoint_writes(self, thread: str, ns: str, checkpoint_id: str) -> str:
        return f"{self.thread_writes(thread)}{key_part(ns)}/{key_part(checkpoint_id)}/"

    def write(self, thread: str, ns: str, checkpoint_id: str, task_id: str, idx: int) -> str:
        return f"{self.checkpoint_writes(thread, ns, checkpoint_id)}{key_part(task_id)}/{idx}"

    def run_checkpoints(self, run_id: str) -> str:
        return f"{self.prefix}r/{key_part(run_id)}/"

    def run_marker(self, run_id: str, thread: str, ns: str, checkpoint_id: str) -> str:
        where = f"{key_part(thread)}/{key_part(ns)}/{key_part(checkpoint_id)}"
        return f"{self.run_checkpoints(run_id)}{where}"

    def thread_runs(self, thread: str) -> str:
        return f"{self.prefix}t/{key_part(thread)}/"

    def thread_run(self, thread: str, run_id: str) -> str:
        return f"{self.thread_runs(thread)}{key_part(run_id)}"

    def lifetime(self, thread: str) -> str:
        """{"horizon": ms}: with a ttl, the thread lives while this does (lifetime.py)."""
        return f"{self.prefix}l/{key_part(thread)}"

    # tombstones: what was deleted, so that a checkpoint built on it is refused while
    # one whose parent was never stored is taken, as every LangGraph saver takes it
    def thread_deleted(self, thread: str) -> str:
        """{"upto": id}: delete_thread removed every checkpoint up to that id."""
        return f"{self.prefix}d/{key_part(thread)}"

    def namespace_pruned(self, thread: str, ns: str) -> str:
        """{"upto": id}: prune removed every checkpoint of the namespace up to that id."""
        return f"{self.prefix}d/{key_part(thread)}/{key_part(ns)}"

    def checkpoint_deleted(self, thread: str, ns: str, checkpoint_id: str) -> str:
        """delete_for_runs removed this one."""
        return f"{self.prefix}x/{key_part(thread)}/{key_part(ns)}/{key_part(checkpoint_id)}"


def _exists(key: str) -> dict[str, Any]:
    return {"kind": KIND, "key": key, "exists": True}


def _scan(prefix: str, **options: Any) -> Call[Any]:
    return r.checkpoint_scan(KIND, prefix, **options)


class SessionStoreSaver(BaseCheckpointSaver[int]):
    """LangGraph checkpoints in a sessionstore daemon, shared by every process on the
    machine that talks to it; see the module comment for what it guarantees."""

    def __init__(
        self,
        socket_path: str | None = None,
        *,
        prefix: str = "langgraph/",
        serde: SerializerProtocol | None = None,
        timeout: float | None = 60.0,
        ttl: Mapping[str, Any] | None = None,
        client: plans.AnyClient | None = None,
    ) -> None:
        """ttl: {"default_ttl": minutes, "refresh_on_read": bool}, as RedisSaver takes
        it: a thread is gone that long after its last write (and read, with
        refresh_on_read), every document of it at once. client: a Client (for the sync
        methods) or an AsyncClient (for the async ones, on its event loop) to use
        instead of the saver's own; the caller closes it."""
        super().__init__(serde=serde)
        self.socket_path = plans.socket_of(socket_path, client)
        self.keys = _Keys(prefix)
        self.lifetime = _lifetime(ttl)
        self._runner = plans.Runner(self.socket_path, timeout, client)
        self.timeout = self._runner.timeout

    def close(self) -> None:
        self._runner.close()

    async def aclose(self) -> None:
        await self._runner.aclose()

    # -- running plans ------------------------------------------------------------

    def _run(self, plan: Plan[T]) -> T:
        return self._runner.run(plan)

    async def _arun(self, plan: Plan[T]) -> T:
        return await self._runner.arun(plan)

    # -- the saver's methods -------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._run(self._get_tuple(config))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._arun(self._get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        listing = _Listing(self, config, filter, before, limit)
        while not listing.done:
            yield from self._run(listing.next_page())

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        listing = _Listing(self, config, filter, before, limit)
        while not listing.done:
            for item in await self._arun(listing.next_page()):
                yield item

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._run(self.put_op(config, checkpoint, metadata))

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._arun(self.put_op(config, checkpoint, metadata))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._run(self._put_writes(config, _pairs(writes), task_id, task_path))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._arun(self._put_writes(config, _pairs(writes), task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._run(self._delete_threads([thread_id]))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._arun(self._delete_threads([thread_id]))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run(self._delete_for_runs(_ids(run_ids, "run_ids")))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._arun(self._delete_for_runs(_ids(run_ids, "run_ids")))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(self._copy_thread(source_thread_id, target_thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._arun(self._copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run(self._prune(_ids(thread_ids, "thread_ids"), strategy))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._arun(self._prune(_ids(thread_ids, "thread_ids"), strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._run(self._delta_history(config, _ids(channels, "channels")))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await self._arun(self._delta_history(config, _ids(channels, "channels")))

    def _delta_history(
        self, config: RunnableConfig, channels: Sequence[str]
    ) -> Plan[dict[str, DeltaChannelHistory]]:
        """The base class's contract, walked with a guard: a parent chain that comes back
        to a checkpoint already seen (a put that made one its own ancestor) ends there,
        where the inherited walk went round for ever."""
        if not channels:
            return {}
        writes: dict[str, Any] = {channel: [] for channel in channels}
        seeds: dict[str, Any] = {}
        remaining: set[str] = set(channels)
        target = yield from self._get_tuple(config)
        seen = {target.checkpoint["id"]} if target is not None else set()
        cursor = target.parent_config if target is not None else None
        while cursor is not None and remaining:
            ancestor = yield from self._get_tuple(cursor)
            if ancestor is None or ancestor.checkpoint["id"] in seen:
                break
            seen.add(ancestor.checkpoint["id"])
            for write in reversed(ancestor.pending_writes or []):
                if write[1] in remaining:
                    writes[write[1]].append(write)
            values = ancestor.checkpoint["channel_values"]
            for channel in [c for c in remaining if c in values]:
                seeds[channel] = values[channel]
                remaining.discard(channel)
            cursor = ancestor.parent_config
        history: dict[str, DeltaChannelHistory] = {}
        for channel in channels:
            entry: DeltaChannelHistory = {"writes": writes[channel][::-1]}
            if channel in seeds:
                entry["seed"] = seeds[channel]
            history[channel] = entry
        return history

    def get_next_version(self, current: int | None, channel: None) -> int:
        return 1 if current is None else int(current) + 1

    # -- plans ---------------------------------------------------------------------

    def _get_tuple(self, config: RunnableConfig) -> Plan[CheckpointTuple | None]:
        configurable = config["configurable"]
        thread, ns = str(configurable["thread_id"]), configurable.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        guard = self._guards([thread])  # with a ttl, read with the thread's documents
        if checkpoint_id:
            key = self.keys.checkpoint(thread, ns, checkpoint_id)
            writes_prefix = self.keys.checkpoint_writes(thread, ns, checkpoint_id)
            # a range from the key, whose first item is the key itself when it is stored
            *life, found, writes = yield [*guard, _scan(key, limit=1), _first_page(writes_prefix)]
            items = [item for item in found["items"] if item["key"] == key]
        else:
            *life, found = yield [
                *guard,
                _scan(self.keys.namespace_checkpoints(thread, ns), reverse=True, limit=1),
            ]
            items = found["items"]
            if items:
                checkpoint_id = items[0]["value"]["checkpoint_id"]
                writes_prefix = self.keys.checkpoint_writes(thread, ns, checkpoint_id)
                (writes,) = yield [_first_page(writes_prefix)]
        if not items:
            return None
        item_writes = yield from _whole(writes_prefix, writes)
        if (yield from self._gone_threads({thread: items + item_writes}, life)):
            return None
        return self._tuple(items[0]["key"], items[0]["value"], item_writes)

    # -- a thread's lifetime (see lifetime.py) -------------------------------------

    def _guards(self, threads: Sequence[str]) -> Calls:
        """With a ttl: the reads of the threads' lifetimes, to send with their documents'."""
        if self.lifetime is None:
            return []
        return [self.lifetime.guard(self.keys.lifetime(thread)) for thread in threads]

    def _gone_threads(
        self, items: dict[str, Items], lives: Sequence[Any] | None = None
    ) -> Plan[set[str]]:
        """Of the threads whose documents were just read, those that have expired.
        lives: their lifetimes as _guards read them, when it was sent."""
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
                *(f"{self.keys.prefix}r/{run}/{key_part(thread)}/" for run in runs),
            ]
            found: Items = []
            for prefix in prefixes:
                found += yield from every_item(prefix, values=False)
            return found

        return members

    def _write(self, thread: str, ops: Items, require: Items | None = None) -> Plan[None]:
        """One thread's ops, in txns under require; with a ttl each renews the thread's
        lifetime, and its documents expire with the thread."""
        if self.lifetime is None:
            yield from in_txns(ops, require)
            return
        life_key, members = self.keys.lifetime(thread), self._members(thread)
        for start in range(0, len(ops), TXN_OPS - 1):  # one op of each is the lifetime's
            chunk = ops[start : start + TXN_OPS - 1]
            yield from self.lifetime.commit(life_key, chunk, require or [], members)

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
        pages = yield [_scan(prefix, values=False, limit=SCAN_PAGE) for prefix in prefixes]
        runs: RunsByThread = {}
        for thread, prefix, page in zip(threads, prefixes, pages, strict=True):
            items = yield from _whole(prefix, page)
            runs[thread] = [item["key"][len(prefix) :] for item in items]
        return runs

    def _delete_threads(self, threads: Sequence[str]) -> Plan[None]:
        if not threads:
            return
        runs = yield from self._runs_of(threads)
        ops = []
        upto = str(uuid6())  # later than every checkpoint id made so far
        for thread in threads:
            ops.append(put_op(self.keys.thread_deleted(thread), {"upto": upto}))
            ops.append(delete_op(self.keys.lifetime(thread)))
            ops.append(delete_prefix_op(self.keys.thread_checkpoints(thread)))
            ops.append(delete_prefix_op(self.keys.thread_writes(thread)))
            ops.append(delete_prefix_op(self.keys.thread_runs(thread)))
            for encoded_run in runs[thread]:
                ops.append(
                    delete_prefix_op(f"{self.keys.prefix}r/{encoded_run}/{key_part(thread)}/")
                )
        yield from in_txns(ops)

    def _delete_for_runs(self, run_ids: Sequence[str]) -> Plan[None]:
        if not run_ids:
            return
        ops: list[dict[str, Any]] = []
        for run_id in run_ids:
            prefix = self.keys.run_checkpoints(run_id)
            threads: set[str] = set()
            for item in (yield from every_item(prefix, values=False)):
                thread, ns, checkpoint = item["key"][len(prefix) :].split("/")
                ops.append(put_op(f"{self.keys.prefix}x/{thread}/{ns}/{checkpoint}", {}))
                ops.append(delete_op(f"{self.keys.prefix}c/{thread}/{ns}/{checkpoint}"))
                ops.append(delete_prefix_op(f"{self.keys.prefix}w/{thread}/{ns}/{checkpoint}/"))
                threads.add(thread)
            ops.append(delete_prefix_op(prefix))
            ops += [
                delete_op(f"{self.keys.prefix}t/{t}/{key_part(run_id)}") for t in sorted(threads)
            ]
        yield from in_txns(ops)

    def _copy_thread(self, source: str, target: str) -> Plan[None]:
        checkpoints = yield from every_item(self.keys.thread_checkpoints(source))
        writes = yield from every_item(self.keys.thread_writes(source))
        if not checkpoints or (yield from self._gone_threads({source: checkpoints + writes})):
            return
        ops = []  # the writes first: a checkpoint is never seen without its writes
        source_writes = self.keys.thread_writes(source)
        for item in writes:
            ops.append(
                put_op(
                    self.keys.thread_writes(target) + item["key"][len(source_writes) :],
                    item["value"],
                )
            )
        for run_id in sorted({i["value"]["run_id"] for i in checkpoints} - {None}):
            ops.append(put_op(self.keys.thread_run(target, run_id), {}))
        for item in checkpoints:
            value = {**item["value"], "thread_id": target}
            ns, checkpoint_id = value["checkpoint_ns"], value["checkpoint_id"]
            run_id = value.get("run_id")
            if run_id is not None:
                ops.append(put_op(self.keys.run_marker(run_id, target, ns, checkpoint_id), {}))
            ops.append(put_op(self.keys.checkpoint(target, ns, checkpoint_id), value))
        yield from self._write(target, ops)

    def _prune(self, threads: Sequence[str], strategy: str) -> Plan[None]:
        """keep_latest: per namespace, the newest checkpoint stays, as the head of its
        thread (its parent_config becomes None, as PostgresSaver makes it), with every
        write put for it, before or after it was stored; the older checkpoints and their
        writes go. A thread whose graph uses a DeltaChannel is refused (nothing pruned,
        NotImplementedError, as PostgresSaver does): its latest state is rebuilt from
        older checkpoints' writes, which keep_latest would drop."""
        if strategy == "delete":
            yield from self._delete_threads(threads)
            return
        if strategy != "keep_latest":
            raise ValueError(f"unknown prune strategy {strategy!r}: 'keep_latest' or 'delete'")
        stored = {}
        for thread in threads:
            stored[thread] = yield from every_item(self.keys.thread_checkpoints(thread))
        for thread in (yield from self._gone_threads(stored)):  # expired: nothing to prune
            del stored[thread]
        for thread, checkpoints in stored.items():
            if any(self._uses_delta(item) for item in checkpoints):
                raise NotImplementedError(
                    f"prune keep_latest of thread {thread!r}: it uses a DeltaChannel, whose "
                    "latest value is rebuilt from older checkpoints; nothing was pruned"
                )
        ops: list[dict[str, Any]] = []
        for thread, checkpoints in stored.items():
            newest: dict[str, dict[str, Any]] = {}
            for item in checkpoints:  # key order: per namespace, oldest first
                newest[item["value"]["checkpoint_ns"]] = item
            upto: dict[str, str] = {}  # per namespace, the newest pruned id (key order)
            for item in checkpoints:
                value = item["value"]
                ns, checkpoint_id = value["checkpoint_ns"], value["checkpoint_id"]
                if newest[ns] is item:
                    if value.get("parent_checkpoint_id") is not None:  # now the head
                        rewrite = put_op(item["key"], {**value, "parent_checkpoint_id": None})
                        ops.append(_keeping_expiry(rewrite, item))
                    continue
                ops.append(delete_op(item["key"]))
                upto[ns] = checkpoint_id
                if value.get("run_id") is not None:
                    ops.append(
                        delete_op(self.keys.run_marker(value["run_id"], thread, ns, checkpoint_id))
                    )
            for ns, checkpoint_id in upto.items():
                ops.append(put_op(self.keys.namespace_pruned(thread, ns), {"upto": checkpoint_id}))
            kept = {
                key_part(ns): key_part(item["value"]["checkpoint_id"])
                for ns, item in newest.items()
            }
            writes_prefix = self.keys.thread_writes(thread)
            writes = yield from every_item(writes_prefix, values=False)
            for write in writes:
                ns_part, checkpoint_part, _ = write["key"][len(writes_prefix) :].split("/", 2)
                head = kept.get(ns_part)
                # older than the head: a pruned checkpoint's, or a late one for a checkpoint
                # gone earlier; a write for the head, or for a checkpoint not stored yet
                # (durability="async" sends writes first: uuid6 ids sort by time), stays
                if head is not None and checkpoint_part < head:
                    ops.append(delete_op(write["key"]))
        yield from in_txns(ops)  # each thread's checkpoints before their writes

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


def _keeping_expiry(op: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """A put that rewrites the item keeps the expiry the item had."""
    if "expires_at_ms" not in item:
        return op
    return {**op, "ttl_s": max(0.001, (item["expires_at_ms"] - now_ms()) / 1000)}


# what the items of each id argument are, in PostgresSaver's words for thread_ids
_ITEMS = {"thread_ids": "thread IDs", "run_ids": "run IDs", "channels": "channel names"}


def _ids(values: Sequence[str], name: str) -> list[str]:
    """A sequence of ids as a list; a lone string is refused (iterating it would act on
    one id per character) with the words PostgresSaver uses, which the frameworks'
    own tests match."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        kind = type(values).__name__
        article = "an" if kind[0] in "aeiou" else "a"
        raise TypeError(f"{name} must be a sequence of {_ITEMS[name]}, not {article} {kind}")
    return [str(value) for value in values]


def _pairs(writes: Sequence[tuple[str, Any]]) -> Sequence[tuple[str, Any]]:
    if isinstance(writes, (str, bytes, dict)) or not isinstance(writes, Iterable):
        raise TypeError(
            f"writes must be a sequence of (channel, value), not {type(writes).__name__}"
        )
    return writes


def _address(value: dict[str, Any]) -> tuple[str, str, str]:
    return value["thread_id"], value["checkpoint_ns"], value["checkpoint_id"]


def _first_page(prefix: str) -> Call[Any]:
    """The first page of a range (most checkpoints' writes fit in it; _whole reads on)."""
    return _scan(prefix, limit=SCAN_PAGE)


def _whole(prefix: str, page: dict[str, Any]) -> Plan[list[dict[str, Any]]]:
    """A range's items: the first page read already, and any pages after it."""
    rest = [] if page["next"] is None else (yield from every_item(prefix, page["next"]))
    return [*page["items"], *rest]


class _Listing:
    """list()'s state between pages: newest first, filtered, limited."""

    def __init__(
        self,
        saver: SessionStoreSaver,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> None:
        self.saver = saver
        self.filter = filter or {}
        self.remaining = limit
        self.before_id = get_checkpoint_id(before) if before else None
        self.only_id: str | None = None
        configurable = (config or {}).get("configurable", {})
        keys = saver.keys
        if "thread_id" not in configurable:
            self.prefix = f"{keys.prefix}c/"
        elif "checkpoint_ns" in configurable:
            thread, ns = str(configurable["thread_id"]), configurable["checkpoint_ns"]
            self.prefix = keys.namespace_checkpoints(thread, ns)
            self.only_id = get_checkpoint_id(config) if config else None
        else:
            self.prefix = keys.thread_checkpoints(str(configurable["thread_id"]))
        # one namespace is one key range in time order; more are merged in memory
        self.one_namespace = "checkpoint_ns" in configurable
        self.cursor: str | None = None
        if self.one_namespace and self.before_id is not None:
            self.cursor = self.prefix + key_part(self.before_id)
        self.done = limit is not None and limit <= 0

    def next_page(self) -> Plan[list[CheckpointTuple]]:
        if self.one_namespace:
            (page,) = yield [_scan(self.prefix, reverse=True, limit=PAGE, before=self.cursor)]
            items = page["items"]
            self.cursor = page["next"]
            self.done = self.cursor is None
        else:
            items = yield from every_item(self.prefix)
            items.sort(key=lambda i: i["value"]["checkpoint_id"], reverse=True)
            self.done = True
        candidates = []
        for item in items:
            value = item["value"]
            if self.only_id is not None and value["checkpoint_id"] != self.only_id:
                continue
            if self.before_id is not None and value["checkpoint_id"] >= self.before_id:
                continue
            candidates.append(item)
        by_thread: dict[str, Items] = {}
        for item in candidates:
            by_thread.setdefault(item["value"]["thread_id"], []).append(item)
        if candidates:
            gone = yield from self.saver._gone_threads(by_thread)
            candidates = [i for i in candidates if i["value"]["thread_id"] not in gone]
        prefixes = [self.saver.keys.checkpoint_writes(*_address(i["value"])) for i in candidates]
        pages: list[Any] = []
        if candidates:
            pages = yield [_first_page(prefix) for prefix in prefixes]
        found = []
        for item, prefix, page in zip(candidates, prefixes, pages, strict=True):
            item_writes = yield from _whole(prefix, page)
            tup = self.saver._tuple(item["key"], item["value"], item_writes)
            if any(tup.metadata.get(k) != v for k, v in self.filter.items()):
                continue
            found.append(tup)
            if self.remaining is not None:
                self.remaining -= 1
                if self.remaining <= 0:
                    self.done = True
                    break
        return found
