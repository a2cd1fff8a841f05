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

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
)
from langgraph.checkpoint.base.id import uuid6

from .keyparts import key_part
from .langgraph_saver_core import (
    PAGE,
    SaverCore,
    address_of,
    checked_ids,
    checked_pairs,
    first_page,
    keeping_expiry,
    scan_call,
    whole_range,
)
from .lifetime import (
    Items,
    every_item,
    untimed,
)
from .plans import Plan, delete_op, delete_prefix_op, put_op


class SessionStoreSaver(SaverCore):
    """LangGraph checkpoints in a sessionstore daemon, shared by every process on the
    machine that talks to it; see the module comment for what it guarantees."""

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
        self._run(self._put_writes(config, checked_pairs(writes), task_id, task_path))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._arun(self._put_writes(config, checked_pairs(writes), task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._run(self._delete_threads([thread_id]))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._arun(self._delete_threads([thread_id]))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run(self._delete_for_runs(checked_ids(run_ids, "run_ids")))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._arun(self._delete_for_runs(checked_ids(run_ids, "run_ids")))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(self._copy_thread(source_thread_id, target_thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._arun(self._copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run(self._prune(checked_ids(thread_ids, "thread_ids"), strategy))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._arun(self._prune(checked_ids(thread_ids, "thread_ids"), strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._run(self._delta_history(config, checked_ids(channels, "channels")))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await self._arun(self._delta_history(config, checked_ids(channels, "channels")))

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

    def _delete_threads(self, threads: Sequence[str]) -> Plan[None]:
        if not threads:
            return
        runs = yield from self._runs_of(threads)
        removals: dict[str, list[dict[str, Any]]] = {}
        upto = str(uuid6())  # later than every checkpoint id made so far
        for thread in threads:
            removals[self.keys.owner(thread)] = [
                put_op(self.keys.thread_deleted(thread), {"upto": upto}),
                delete_op(self.keys.lifetime(thread)),
                delete_prefix_op(self.keys.thread_checkpoints(thread)),
                delete_prefix_op(self.keys.thread_writes(thread)),
                delete_prefix_op(self.keys.thread_runs(thread)),
                delete_prefix_op(self.keys.effects(thread)),
                *(
                    delete_prefix_op(f"{self.keys.prefix}r/{encoded_run}/{key_part(thread)}/")
                    for encoded_run in runs[thread]
                ),
            ]
        yield from self._remove(removals)

    def _delete_for_runs(self, run_ids: Sequence[str]) -> Plan[None]:
        removals: dict[str, list[dict[str, Any]]] = {}
        for run_id in run_ids:
            prefix = self.keys.run_checkpoints(run_id)
            threads: set[str] = set()
            for item in (yield from every_item(prefix, values=False)):
                thread, ns, checkpoint = item["key"][len(prefix) :].split("/")
                removals.setdefault(self.keys.owner_of_part(thread), []).extend([
                    put_op(f"{self.keys.prefix}x/{thread}/{ns}/{checkpoint}", {}),
                    delete_op(f"{self.keys.prefix}c/{thread}/{ns}/{checkpoint}"),
                    delete_prefix_op(f"{self.keys.prefix}w/{thread}/{ns}/{checkpoint}/"),
                ])  # fmt: skip
                threads.add(thread)
            for thread in sorted(threads):  # the run's markers, and the thread's of the run
                removals[self.keys.owner_of_part(thread)] += [
                    delete_prefix_op(f"{prefix}{thread}/"),
                    delete_op(f"{self.keys.prefix}t/{thread}/{key_part(run_id)}"),
                ]
        yield from self._remove(removals)

    def _copy_thread(self, source: str, target: str) -> Plan[None]:
        checkpoints = yield from every_item(self.keys.thread_checkpoints(source))
        writes = yield from every_item(self.keys.thread_writes(source))
        effects = yield from every_item(self.keys.effects(source))
        if (yield from self._expired_threads({source: checkpoints + writes + effects})):
            checkpoints, writes, effects = untimed(checkpoints), untimed(writes), untimed(effects)
        if not checkpoints:
            return
        source_effects = self.keys.effects(source)
        ops = [  # the effects its checkpoints' runs had, then the writes: a checkpoint is
            # never seen without its writes
            put_op(self.keys.effects(target) + item["key"][len(source_effects) :], item["value"])
            for item in effects
        ]
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
        for thread in (yield from self._expired_threads(stored)):  # the leftovers stay out
            stored[thread] = untimed(stored[thread])
        for thread, checkpoints in stored.items():
            if any(self._uses_delta(item) for item in checkpoints):
                raise NotImplementedError(
                    f"prune keep_latest of thread {thread!r}: it uses a DeltaChannel, whose "
                    "latest value is rebuilt from older checkpoints; nothing was pruned"
                )
        removals: dict[str, list[dict[str, Any]]] = {}
        for thread, checkpoints in stored.items():
            ops = removals[self.keys.owner(thread)] = []
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
                        ops.append(keeping_expiry(rewrite, item))
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
        yield from self._remove(removals)  # each thread's checkpoints before their writes


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
            (page,) = yield [scan_call(self.prefix, reverse=True, limit=PAGE, before=self.cursor)]
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
        prefixes = [self.saver.keys.checkpoint_writes(*address_of(i["value"])) for i in candidates]
        pages: list[Any] = []
        if candidates:
            pages = yield [first_page(prefix) for prefix in prefixes]
        writes: list[Items] = []
        by_thread: dict[str, Items] = {}
        for item, prefix, page in zip(candidates, prefixes, pages, strict=True):
            writes.append((yield from whole_range(prefix, page)))
            by_thread.setdefault(item["value"]["thread_id"], []).extend([item, *writes[-1]])
        expired = (yield from self.saver._expired_threads(by_thread)) if candidates else set()
        found = []
        for item, item_writes in zip(candidates, writes, strict=True):
            if item["value"]["thread_id"] in expired:
                if "expires_at_ms" in item:  # a leftover of the expired lifetime
                    continue
                item_writes = untimed(item_writes)
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
