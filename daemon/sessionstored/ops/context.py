# What the op handlers share (OpContext): the engine, the writer, the watch
# broadcaster, the limits, the worker processes for heavy steps, and the ways
# a handler reads the committed state or turns a refusal into its reply.
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import trio

from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import Request, error_response, refusal_response
from sessionstore.wire.shared import Refusal

from ..storage.documents import Document, Entry
from ..storage.engine import Engine
from ..storage.errors import CorruptRecord
from ..storage.generations import generation_at
from ..storage.mutations import Mutation, Outcome, Rewrite
from ..workers.offload import OFFLOAD_ABOVE_BYTES, Offload
from ..writer.jobs import MutationJob
from ..writer.writer import Writer
from .steps import Reply, Response, Step, Write
from .watch import Broadcaster

log = logging.getLogger("sessionstored.ops")
T = TypeVar("T")


def same_body(current: bytes | None, _source: bytes | None) -> bytes | None:
    return current  # None: nothing there, nothing written


class OpContext:
    def __init__(
        self,
        store: Engine,
        writer: Writer,
        broadcaster: Broadcaster,
        *,
        max_snapshot_bytes: int,
        max_request_bytes: int,
        stats_extra: Callable[[], dict[str, Any]],
        offload: Offload | None = None,
        advance_clock: Callable[[int], int] | None = None,
    ) -> None:
        """advance_clock: moves the expiry clock forward by so many ms and says the time
        it reads then, on a daemon started with --UNSAFE-settable-clock; else None."""
        self.offload = offload or Offload()
        self.store = store
        self.writer = writer
        self.broadcaster = broadcaster
        self.max_snapshot_bytes = max_snapshot_bytes
        self.max_request_bytes = max_request_bytes
        self.stats_extra = stats_extra
        self.advance_clock = advance_clock
        self.started = time.monotonic()
        self.internal_errors = 0  # our bugs answered as `internal`; the tests watch it

    def handled(self, request: Request, build: Callable[[], Step]) -> Step:
        """build()'s step, or the reply that its refusal (or our bug) makes."""
        try:
            return build()
        except Refusal as error:
            return Reply(request, refusal_response(request, error))
        except Exception as error:  # our bug, not the client's: answer it, keep the connection
            return Reply(request, self.internal_error(request, error, "dispatching"))

    def internal_error(self, request: Request | None, error: BaseException, doing: str) -> Response:
        """Our bug, never the client's: logged, counted in `stats`, answered."""
        self.internal_errors += 1
        log.error("internal error %s %r", doing, request and request.op, exc_info=error)
        return error_response(request, ErrorCode.INTERNAL, f"internal error: {error}")

    # -- what the handlers share ---------------------------------------------------

    async def refresh_expiry(self, kind: str, ids: Sequence[str], expires_at_ms: int) -> set[str]:
        """A read's refresh_ttl_s: each of these documents that has an expiry gets this
        one, as a new generation (durable before the read answers); the ids refreshed.
        Refusal when the writer refused one (a full disk, say)."""
        jobs = [
            (doc_id, MutationJob(Rewrite(kind, doc_id, same_body, expires_at_ms=expires_at_ms,
                                         refresh=True)))
            for doc_id in ids
        ]  # fmt: skip
        for _, job in jobs:
            await self.writer.enqueue(job)
        refreshed = set()
        for doc_id, job in jobs:
            await job.wait()
            outcome = job.outcome
            assert outcome is not None
            if outcome.refused is not None:
                raise outcome.refused
            if outcome.changed:
                refreshed.add(doc_id)
        return refreshed

    def mutation(
        self, request: Request, mutation: Mutation, respond: Callable[[Outcome], Response]
    ) -> Step:
        return Write(request, MutationJob(mutation), respond)

    async def query(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), a read of the committed state: inline from the log engine's index,
        in a thread when the backend's reads are network round trips (PostgreSQL)."""
        if self.store.blocking_reads:
            return await trio.to_thread.run_sync(fn, *args)
        return fn(*args)

    def current_lease(self) -> Awaitable[dict[str, Any] | None]:
        return self.query(self.store.reads.current_lease)

    def read_document(self, kind: str, doc_id: str) -> Callable[[], Awaitable[Document | None]]:
        """A reader of the committed generation; returns the Document or None. A large
        one is read, decrypted and checked in a thread (those release the GIL), so the
        event loop goes on meanwhile; the read cache is only touched here, on the loop."""

        async def read() -> Document | None:
            if self.store.blocking_reads:
                return await trio.to_thread.run_sync(self.store.reads.read, kind, doc_id)
            entry = self.store.reads.head(kind, doc_id)
            if entry is None or entry.size <= OFFLOAD_ABOVE_BYTES:
                return self.store.reads.read(kind, doc_id)
            hit = self.store.reads.cached(kind, doc_id, entry)
            if hit is not None:
                return hit
            doc = await self.read_off_loop(
                [entry], self.store.reads.read_entry, kind, doc_id, entry
            )
            self.store.reads.remember(doc)
            return doc

        return read

    async def read_at(self, kind: str, doc_id: str, at: int) -> Document | None:
        """The generation that was current at seq `at` (generations.py), None when the
        session does not exist; Refusal compacted when it is no longer kept."""
        store = self.store
        if store.blocking_reads:
            entries = await trio.to_thread.run_sync(store.reads.generations, kind, doc_id)
        else:
            entries = store.reads.generations(kind, doc_id)
        entry = generation_at(entries, at, doc_id)
        if entry is None:
            return None
        if store.blocking_reads:
            return await trio.to_thread.run_sync(store.reads.read_generation, kind, doc_id, entry)
        if entry.size <= OFFLOAD_ABOVE_BYTES:  # as a load's: a small one on the loop
            return store.reads.read_generation(kind, doc_id, entry)
        return await self.read_off_loop([entry], store.reads.read_generation, kind, doc_id, entry)

    async def read_off_loop(self, entries: Sequence[Entry], fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) in a thread, reading these entries: their files stay alive meanwhile,
        however compaction goes on."""
        self.store.reads.pin(entries)
        try:
            return await trio.to_thread.run_sync(fn, *args)
        finally:
            self.store.reads.unpin(entries)

    async def guarded_read(
        self, request: Request, produce: Callable[[], Awaitable[Response]]
    ) -> Response:
        try:
            return await produce()
        except Refusal as error:
            return refusal_response(request, error)
        except (CorruptRecord, OSError) as error:
            log.error("%s: %s", request.op, error)
            return error_response(request, ErrorCode.IO_ERROR, str(error))

    def heavy(self, size: int, fn: Callable[..., bytes], *args: Any) -> bytes:
        """fn(*args) inline, or in a worker when its input is large (the writer's thread
        waits; the event loop does not)."""
        if size <= OFFLOAD_ABOVE_BYTES:
            return fn(*args)
        return self.offload.run_blocking(fn, *args)
