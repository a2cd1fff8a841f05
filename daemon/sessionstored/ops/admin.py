# The daemon's own ops: hello and ping, the watch stream, stats, verify and compact;
# and advance_clock, on a daemon whose clock tests may move (--UNSAFE-settable-clock).
from __future__ import annotations

import time
from typing import Any

from sessionstore import build
from sessionstore.version import __version__
from sessionstore.wire import cbor_bytes
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import PROTOCOL_VERSION, Request, error_response, ok_response
from sessionstore.wire.shared import Refusal

from ..storage.errors import DiskFull, InjectedFault
from ..writer.jobs import ExclusiveJob
from .context import OpContext
from .registry import Op
from .snapshot import is_int
from .steps import Exclusive, Read, Reply, Response, Step, Stream
from .vectors import numpy_installed_and_not_refused
from .watch import Sink


def ping(_ops: OpContext, request: Request) -> Step:
    return Reply(request, ok_response(request))


def hello(ops: OpContext, request: Request) -> Step:
    return Reply(
        request,
        ok_response(
            request,
            protocol=PROTOCOL_VERSION,
            server=f"sessionstored/{__version__}",
            capabilities={
                "atomic_session_snapshots": True,
                "aggregate_cas": True,
                "append_only_event_log": True,
                "lease_fencing": True,
                "encrypted_at_rest": ops.store.encrypted,
                "watch": True,
                "keyed_documents": True,  # ours: kind kv and checkpoint_scan
                "txn": True,  # ours
                "txn_keep": True,  # ours: a txn put's `keep`
                "expiry": True,  # ours: ttl_s, expire, refresh_ttl_s
                "vector_rank": numpy_installed_and_not_refused(),  # ours: checkpoint_rank
                "history": True,  # ours: history, revert, load and fork at a seq
            },
            cbor_helper=cbor_bytes.IMPLEMENTATION,  # ours: "compiled" or "python"
            build=build.running("sessionstored"),  # ours: "compiled" or "interpreted"
            limits={
                "max_request_bytes": ops.max_request_bytes,
                "max_snapshot_bytes": ops.max_snapshot_bytes,
                "keep_generations": ops.store.keep_generations,  # ours
            },
        ),
    )


def watch(ops: OpContext, request: Request) -> Step:
    since = request.args.get("since")
    if since is not None and (not is_int(since) or since < 0):
        raise Refusal(ErrorCode.BAD_REQUEST, "since must be a non-negative integer")

    async def stream(sink: Sink) -> None:
        current = ops.store.seq
        if since is not None:
            oldest = ops.broadcaster.compacted_before(since)
            if oldest is not None:
                await sink.send(
                    error_response(
                        request,
                        ErrorCode.COMPACTED,
                        f"history before seq {oldest} is no longer retained",
                        oldest_seq=oldest,
                    )
                )
                return
        await sink.send(ok_response(request, watching=True, seq=current))
        await ops.broadcaster.stream(current if since is None else since, sink)

    return Stream(request, stream)


async def stats_snapshot(ops: OpContext) -> dict[str, Any]:
    """What `stats` answers (and /metrics reads at each scrape)."""
    store_stats = await ops.query(ops.store.stats)
    return {
        "sessions": await ops.query(ops.store.reads.session_count),
        "seq": ops.store.acknowledged_seq,
        "uptime_s": round(time.monotonic() - ops.started, 3),
        "watchers": ops.broadcaster.watchers,
        "watchers_cut_off": ops.broadcaster.cut_off,
        "watchers_dropped": ops.broadcaster.dropped,
        "internal_errors": ops.internal_errors,
        "lease_epoch": (ops.store.lease or {}).get("epoch"),
        "cbor_helper": cbor_bytes.IMPLEMENTATION,
        "build": build.running("sessionstored"),
        "keep_generations": ops.store.keep_generations,
        **store_stats,
        **ops.stats_extra(),
    }


def stats(ops: OpContext, request: Request) -> Step:
    async def read() -> Response:
        return ok_response(request, **(await stats_snapshot(ops)))

    return Read(request, lambda: ops.guarded_read(request, read))


def verify(ops: OpContext, request: Request) -> Step:
    def run_check() -> Response:
        checked, problems = ops.store.verify()
        return ok_response(request, checked=checked, problems=[p.as_wire() for p in problems])

    return Exclusive(request, ExclusiveJob(run_check))


def compact(ops: OpContext, request: Request) -> Step:
    def run_compact() -> Response:
        try:
            result = ops.store.compact()
        except DiskFull as error:
            return error_response(request, ErrorCode.NO_SPACE, f"compaction did not run: {error}")
        except InjectedFault as error:
            return error_response(request, ErrorCode.IO_ERROR, f"compaction did not run: {error}")
        return ok_response(
            request,
            seq=result.seq,
            wal_bytes_before=result.wal_bytes_before,
            wal_bytes_after=result.wal_bytes_after,
            segments_replaced=result.segments_replaced,
        )

    return Exclusive(request, ExclusiveJob(run_compact))


def advance_clock(ops: OpContext, request: Request) -> Step:
    if ops.advance_clock is None:
        message = "this daemon's clock is not settable (start it with --UNSAFE-settable-clock)"
        raise Refusal(ErrorCode.BAD_REQUEST, message)
    by_ms = request.args.get("by_ms")
    if not is_int(by_ms) or by_ms < 0:
        raise Refusal(ErrorCode.BAD_REQUEST, "by_ms must be a non-negative integer")
    return Reply(request, ok_response(request, now_ms=ops.advance_clock(by_ms)))


OPS = (
    Op("hello", hello, set(), read_only=True),
    Op("ping", ping, set(), read_only=True),
    Op("watch", watch, {"since"}, read_only=True),
    Op("stats", stats, set(), read_only=True),
    Op("verify", verify, set(), read_only=True),
    Op("compact", compact, set()),
    Op("advance_clock", advance_clock, {"by_ms"}),
)
