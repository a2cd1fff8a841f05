# Worker processes for the heavy steps of large requests (prepare.py), so that the
# event loop never holds the GIL for long. Started on first use from a fork
# server (never a fork of this multi-threaded process). What a worker may be
# asked to decode is bounded before it starts (MAX_REQUEST_ITEMS, counted as the
# item's framing is walked), and its address space is capped as a backstop: a
# request that still needs more fails in the worker with MemoryError, or kills
# only the worker, and the daemon answers `too_large` either way.
from __future__ import annotations

import contextlib
import functools
import multiprocessing
import multiprocessing.forkserver
import resource
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import trio

from .parent_death import die_with_parent

OFFLOAD_ABOVE_BYTES = 128 * 1024  # larger items are decoded in a worker
# where the compiled CBOR helper walks requests (byte_path.py), a canonical item is
# checked as it arrives and its documents are not decoded: only larger ones go to a
# worker, for the rules' decoding and the digest
OFFLOAD_CANONICAL_ABOVE_BYTES = 4 * 1024 * 1024
OFFLOAD_WORKERS = 2
WORKER_MEMORY_LIMIT_BYTES = 4 * 1024**3
# Decoded, a CBOR data item costs up to ~64 bytes (an empty list and its slot), and
# a worker must not reach its cap inside cbor2: its native code does not fail
# cleanly there (measured: the allocation-error handler deadlocks). So a large
# request may hold at most this many items, ~1.5 GiB decoded; a 63 MiB save of
# 4,400,000 two-key maps holds 22,000,000.
MAX_REQUEST_ITEMS = 24_000_000

T = TypeVar("T")


class WorkerLost(Exception):
    pass


def _start_worker(limit_bytes: int) -> None:
    die_with_parent()  # the fork server's SIGKILL reaches its workers
    # The shipped unit filters setrlimit (SystemCallFilter=~@resources): there the item
    # cap alone bounds a worker, and the service's cgroup the rest.
    with contextlib.suppress(OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["__main__", "sessionstored.workers.fork_server_preload"])


def ensure_fork_server() -> None:
    """Start the fork server if it is not running, from the calling thread: the event
    loop's, which lives as long as the daemon (parent_death.py says why that matters).
    One fork and exec, a few milliseconds, once."""
    multiprocessing.forkserver.ensure_running()


class Offload:
    def __init__(
        self,
        workers: int = OFFLOAD_WORKERS,
        memory_limit_bytes: int = WORKER_MEMORY_LIMIT_BYTES,
    ) -> None:
        self.workers = workers
        self.memory_limit_bytes = memory_limit_bytes
        self.calls = 0
        self._pool: ProcessPoolExecutor | None = None
        self._pool_lock = threading.Lock()  # callers are the loop's threads and the writer's

    def _submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Hand fn to a worker. Not on the event loop: the first call starts the fork
        server and the workers, and every call pickles fn's (large) arguments."""
        with self._pool_lock:
            self.calls += 1
            for _ in range(2):  # a pool broken since the last call is replaced, once
                if self._pool is None:
                    self._pool = ProcessPoolExecutor(
                        max_workers=self.workers,
                        mp_context=_CONTEXT,
                        initializer=_start_worker,
                        initargs=(self.memory_limit_bytes,),
                    )
                try:
                    return self._pool.submit(fn, *args, **kwargs)
                except BrokenProcessPool:
                    self._pool = None
            raise WorkerLost("the worker processes could not be started")

    def _result(self, future: Future[T]) -> T:
        try:
            return future.result()
        except BrokenProcessPool:
            self._pool = None  # a worker died (the OOM killer?): the next call starts afresh
            raise WorkerLost("a worker process died on this request") from None

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args) in a worker; the event loop waits on a thread, not on the GIL."""
        ensure_fork_server()
        call = functools.partial(self.run_blocking, fn, *args, **kwargs)
        return await trio.to_thread.run_sync(call, abandon_on_cancel=True)

    def run_blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """From a thread that may block (the writer's)."""
        return self._result(self._submit(fn, *args, **kwargs))

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
