# Prometheus metrics (`sessionstored --metrics-listen ADDR:PORT`, off unless
# given), in the text format of the prometheus-client library.
#
# What moves with every request or batch is counted as it happens, in the
# event loop's thread (requests, their latency by op, batch sizes and commit
# and fdatasync times), in plain counts that the scrape turns into metric
# families: counting one request is two set and three dict lookups, a bisect
# and three additions, with no lock (only that thread counts; the library's own
# metric objects take a lock and scan their buckets, 1.5 us a request here).
# Everything else is read when Prometheus scrapes: the same snapshot `stats`
# answers (the log's bytes, watchers, connections, refusals, the last
# recovery, expirations, PostgreSQL's follower lag and counter wait), so it
# costs the requests nothing.
#
# Every label value comes from a fixed set: an op of the daemon's op table,
# UNKNOWN for any other op text a client sends, NOT_A_REQUEST; `ok` or a code
# of the wire's table. So what a client sends never grows the counts, the text
# or the memory, and is never published to whoever can reach the port.
#
# /metrics is served by the daemon's own trio task. A scrape copies the counts
# on the event loop (only that thread changes them) and takes the `stats`
# snapshot there (a dict built for it); the text is made from those copies in a
# thread, one scrape at a time, so the event loop serves requests meanwhile.
from __future__ import annotations

import bisect
import contextlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from sessionstore.wire.codes import ErrorCode

from ..writer.writer import quantiles_ms

log = logging.getLogger("sessionstored.metrics")

LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
RECENT = 1024  # latencies kept per op for `stats`' p50 and p99
MAX_REQUEST_HEAD_BYTES = 8192
REQUEST_HEAD_TIMEOUT_S = 5.0
# scrapers served at once; past it a connection is closed unread, so that a flood of
# idle ones holds neither memory nor the daemon's file descriptors
MAX_METRICS_CONNECTIONS = 16

UNKNOWN = "(unknown)"  # the op of a request naming no op of the daemon (or a stray code)
NOT_A_REQUEST = "(none)"  # the op of an item refused before it was a request
CODES = frozenset({"ok", *ErrorCode})

# stats fields read at scrape time: (field, metric name, help); counters end in _total
GAUGES = (
    ("sessions", "sessionstore_sessions", "Sessions stored"),
    ("seq", "sessionstore_seq", "The store's seq: every change up to it is acknowledged"),
    ("uptime_s", "sessionstore_uptime_seconds", "Seconds since the daemon started"),
    ("connections", "sessionstore_connections", "Client connections open now"),
    ("watchers", "sessionstore_watchers", "Watch streams open now"),
    ("wal_bytes", "sessionstore_log_bytes", "Bytes of the log (of ss_documents on PostgreSQL)"),
    ("live_bytes", "sessionstore_log_live_bytes", "Bytes of the log's live records"),
    ("log_dead_share", "sessionstore_log_dead_share", "Share of the sealed segments' bytes dead"),
    ("keep_generations", "sessionstore_keep_generations", "Earlier generations kept per session"),
    (
        "expiry_schedule_entries",
        "sessionstore_expiry_schedule_entries",
        "Entries of the log's expiry schedule (a few per live document that expires)",
    ),
)
COUNTERS = (
    ("connections_total", "sessionstore_connections_accepted", "Connections accepted"),
    ("batches", "sessionstore_batches", "Batches committed"),
    ("committed", "sessionstore_committed_writes", "Writes committed"),
    ("compactions", "sessionstore_compactions", "Log compactions"),
    ("checkpoints", "sessionstore_index_checkpoints", "Index checkpoints written"),
    ("watchers_cut_off", "sessionstore_watchers_lagged", "Watchers cut off for lagging"),
    ("watchers_dropped", "sessionstore_watchers_dropped", "Watchers dropped"),
    ("expirations", "sessionstore_expirations", "Documents removed by the expiry sweep"),
    ("internal_errors", "sessionstore_internal_errors", "Requests answered `internal`"),
)


class _Histogram:
    """Counts per bucket (bisect, no lock: only the event loop's thread counts), a sum."""

    __slots__ = ("counts", "total")

    def __init__(self, counts: list[int], total: float = 0.0) -> None:
        self.counts = counts  # one per bound, and the last: above every bound
        self.total = total

    @staticmethod
    def empty(bounds: tuple[float, ...]) -> _Histogram:
        return _Histogram([0] * (len(bounds) + 1))

    def observe(self, bounds: tuple[float, ...], value: float) -> None:
        self.counts[bisect.bisect_left(bounds, value)] += 1
        self.total += value

    def copy(self) -> _Histogram:
        return _Histogram(list(self.counts), self.total)

    def buckets(self, bounds: tuple[float, ...]) -> list[tuple[str, float]]:
        running, out = 0, list[tuple[str, float]]()
        for bound, count in zip((*bounds, math.inf), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == math.inf else repr(float(bound)), float(running)))
        return out


@dataclass(frozen=True)
class _Counts:
    """A scrape's copy of the counts, for the thread that makes the text."""

    codes: dict[tuple[str, str], int]
    latency: dict[str, _Histogram]
    batch_size: _Histogram
    batch_seconds: _Histogram
    sync_seconds: _Histogram


class Metrics:
    def __init__(self, ops: Collection[str]) -> None:
        self.ops = frozenset((*ops, NOT_A_REQUEST))  # every op label but UNKNOWN
        self.codes: dict[tuple[str, str], int] = {}  # (op, code) -> requests answered
        self.latency: dict[str, _Histogram] = {}  # op -> its requests' seconds
        self.batch_size = _Histogram.empty(BATCH_SIZE_BUCKETS)
        self.batch_seconds = _Histogram.empty(LATENCY_BUCKETS_S)
        self.sync_seconds = _Histogram.empty(LATENCY_BUCKETS_S)
        self.recent: dict[str, deque[float]] = {}  # op -> its last RECENT latencies
        self._rendering = trio.CapacityLimiter(1)  # one scrape's text at a time

    def request(self, op: str, code: str, seconds: float) -> None:
        if op not in self.ops:
            op = UNKNOWN
        key = (op, code if code in CODES else UNKNOWN)
        self.codes[key] = self.codes.get(key, 0) + 1
        timed = self.latency.get(op)
        if timed is None:
            timed = self.latency[op] = _Histogram.empty(LATENCY_BUCKETS_S)
        timed.observe(LATENCY_BUCKETS_S, seconds)
        recent = self.recent.get(op)
        if recent is None:
            recent = self.recent[op] = deque(maxlen=RECENT)
        recent.append(seconds)

    def batch(self, size: int, commit_s: float, sync_s: float) -> None:
        self.batch_size.observe(BATCH_SIZE_BUCKETS, size)
        self.batch_seconds.observe(LATENCY_BUCKETS_S, commit_s)
        if sync_s:
            self.sync_seconds.observe(LATENCY_BUCKETS_S, sync_s)

    def stats(self) -> dict[str, Any]:
        """For `stats` (and `sessionstore top`): requests by op, with the p50 and p99 of
        their last RECENT latencies (the recent batches' figures are the writer's)."""
        requests: dict[str, dict[str, Any]] = {}
        for (op, code), count in self.codes.items():
            entry = requests.setdefault(op, {"count": 0, "errors": 0})
            entry["count"] += count
            if code != "ok":
                entry["errors"] += count
        for op, recent in self.recent.items():
            requests[op].update(quantiles_ms(list(recent)))
        return {"requests": requests}

    async def exposition(self, stats: dict[str, Any]) -> bytes:
        """The text, from the `stats` snapshot taken for this scrape (a dict of its own)
        and a copy of the counts: made in a thread, it reads nothing the loop changes."""
        counts = _Counts(
            dict(self.codes),
            {op: timed.copy() for op, timed in self.latency.items()},
            self.batch_size.copy(),
            self.batch_seconds.copy(),
            self.sync_seconds.copy(),
        )
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Scrape(counts, stats))
        return await trio.to_thread.run_sync(generate_latest, registry, limiter=self._rendering)


class _Scrape:
    """One scrape's metric families, from its copy of the counts and its snapshot."""

    def __init__(self, counts: _Counts, stats: dict[str, Any]) -> None:
        self.counts = counts
        self.stats = stats

    def describe(self) -> list[Metric]:
        return []  # unchecked: these names are this collector's alone

    def collect(self) -> Iterator[Metric]:
        yield from self._counted()
        stats = self.stats
        for field, name, text in GAUGES:
            if isinstance(stats.get(field), int | float):
                yield GaugeMetricFamily(name, text, value=stats[field])
        for field, name, text in COUNTERS:
            if isinstance(stats.get(field), int | float):
                yield CounterMetricFamily(name, text, value=stats[field])
        refused = CounterMetricFamily(
            "sessionstore_refusals", "Connections and requests turned away, by reason",
            labels=["reason"],
        )  # fmt: skip
        for reason, count in (stats.get("refused") or {}).items():
            refused.add_metric([str(reason)], count)
        yield refused
        recovery = GaugeMetricFamily(
            "sessionstore_last_recovery", "What the last start's recovery did, by figure",
            labels=["what"],
        )  # fmt: skip
        for what, value in (stats.get("recovery") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                recovery.add_metric([what], value)
            elif isinstance(value, bool | list | dict) or value is None:
                recovery.add_metric([what], float(bool(value)))
        yield recovery
        yield from _postgresql(stats)

    def _counted(self) -> Iterator[Metric]:
        metrics = self.counts
        requests = CounterMetricFamily(
            "sessionstore_requests",
            "Requests answered, by op and by code (ok, or the error code)",
            labels=["op", "code"],
        )
        for (op, code), count in sorted(metrics.codes.items()):
            requests.add_metric([op, code], count)
        yield requests
        latency = HistogramMetricFamily(
            "sessionstore_request_seconds",
            "Seconds from a request's start to its reply, by op",
            labels=["op"],
        )
        for op, timed in sorted(metrics.latency.items()):
            latency.add_metric([op], timed.buckets(LATENCY_BUCKETS_S), timed.total)
        yield latency
        for name, text, histogram, bounds in (
            ("sessionstore_batch_size", "Writes per committed batch",
             metrics.batch_size, BATCH_SIZE_BUCKETS),
            ("sessionstore_batch_commit_seconds",
             "Seconds a batch took in the storage engine (its transaction on PostgreSQL)",
             metrics.batch_seconds, LATENCY_BUCKETS_S),
            ("sessionstore_fdatasync_seconds", "Seconds of the log's fdatasync, per batch",
             metrics.sync_seconds, LATENCY_BUCKETS_S),
        ):  # fmt: skip
            family = HistogramMetricFamily(name, text)
            family.add_metric([], histogram.buckets(bounds), histogram.total)
            yield family


def _postgresql(stats: dict[str, Any]) -> Iterator[Metric]:
    if "follower_lag_seqs" in stats:
        yield GaugeMetricFamily(
            "sessionstore_postgresql_follower_lag_seqs",
            "Changes committed in the database that this daemon has not followed yet",
            value=stats["follower_lag_seqs"],
        )
    timing = stats.get("batch_transactions") or {}
    if "counter_wait_ms_mean" in timing:
        yield GaugeMetricFamily(
            "sessionstore_postgresql_counter_wait_seconds",
            "Mean seconds the recent batches waited for the counter row's lock",
            value=timing["counter_wait_ms_mean"] / 1000,
        )


Render = Callable[[], Awaitable[bytes]]


async def serve_metrics(listeners: list[trio.SocketListener], render: Render) -> None:
    """GET /metrics over HTTP/1.0 on the listeners (bound at start: a taken address
    is a start's one-line refusal, cli.py)."""
    serving = 0

    async def answer(stream: trio.SocketStream) -> None:
        nonlocal serving
        if serving >= MAX_METRICS_CONNECTIONS:
            await stream.aclose()
            return
        serving += 1
        try:
            await _answer(stream, render)
        finally:
            serving -= 1

    await trio.serve_listeners(answer, listeners)


async def _answer(stream: trio.abc.Stream, render: Render) -> None:
    async with stream:
        head = b""
        with trio.move_on_after(REQUEST_HEAD_TIMEOUT_S):
            while b"\r\n\r\n" not in head and len(head) < MAX_REQUEST_HEAD_BYTES:
                data = await stream.receive_some(4096)
                if not data:
                    break
                head += data
        line = head.split(b"\r\n", 1)[0].split()
        if len(line) < 2 or line[0] not in (b"GET", b"HEAD"):
            await _send(stream, b"405 Method Not Allowed", b"text/plain", b"GET /metrics\n")
            return
        if line[1].split(b"?", 1)[0] != b"/metrics":
            await _send(stream, b"404 Not Found", b"text/plain", b"see /metrics\n")
            return
        try:
            body = await render()
        except Exception as error:  # our bug: say so to the scraper, keep serving
            log.exception("rendering /metrics")
            await _send(stream, b"500 Internal Server Error", b"text/plain", f"{error}\n".encode())
            return
        await _send(
            stream, b"200 OK", CONTENT_TYPE_LATEST.encode(), b"" if line[0] == b"HEAD" else body
        )


async def _send(stream: trio.abc.Stream, status: bytes, kind: bytes, body: bytes) -> None:
    head = (
        b"HTTP/1.0 " + status + b"\r\nContent-Type: " + kind
        + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
    )  # fmt: skip
    with trio.move_on_after(REQUEST_HEAD_TIMEOUT_S):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(head + body)
