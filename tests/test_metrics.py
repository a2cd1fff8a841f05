# /metrics (sessionstored --metrics-listen), through real daemons on both engines:
# the text parses with prometheus-client's own parser, and every metric moves
# when something drives it: requests by op and code and their latency, batches,
# fdatasync (the log), the log's bytes and its compactions, watchers,
# connections and refusals, the last recovery, expirations, and on PostgreSQL
# the follower's lag and the counter row's wait. What a client sends never
# becomes a label: unknown ops count under one, and the text stays as small;
# scrapers past the limit are closed unread, and the daemon serves on; the text
# is made in a thread, from a copy of the counts, while the event loop runs on.
from __future__ import annotations

import select
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import trio

from contrib.grafana.panels import samples_of  # prometheus-client's parser
from sessionstore.client import Client
from sessionstore.errors import Overloaded, SessionStoreError
from sessionstored.front.metrics import MAX_METRICS_CONNECTIONS, Metrics
from sessionstored.ops import REGISTRY

from .conftest import DaemonProcess, snapshot
from .waiting import until


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        return str(reply.read().decode())


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return samples_of(_scrape_text(port))


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _until(port: int, name: str, at_least: float, **labels: str) -> dict[Any, float]:
    deadline = time.monotonic() + 60
    while True:
        samples = _scrape(port)
        if _value(samples, name, **labels) >= at_least:
            return samples
        assert time.monotonic() < deadline, f"{name}{labels} never reached {at_least}"
        time.sleep(0.2)


def test_every_metric_moves_when_driven(daemon: DaemonProcess, backend: str) -> None:
    port = _free_port()
    daemon.start(
        "--metrics-listen", f"127.0.0.1:{port}", "--max-connections", "4", "--segment-mib", "1"
    )
    before = _scrape(port)
    assert _value(before, "sessionstore_requests_total", op="save", code="ok") == 0
    with daemon.client() as client:
        for n in range(40):  # 100 KiB generations of one session: segments die
            client.save(snapshot("big", n=n, pad="x" * 100_000))
        client.load("big")
        many = [
            {"op": "put", "kind": "kv", "key": f"m{n}", "value": {"p": "x" * 100}}
            for n in range(1500)
        ]
        client.txn(many)  # so many ops: prepared in a thread before it is started
        with pytest.raises(SessionStoreError):
            client.call("load")  # no session_id: bad_request
        with socket.socket(socket.AF_UNIX) as raw:  # not a request at all
            raw.connect(daemon.socket_path)
            raw.sendall(b"\x01\n")
            raw.recv(1000)
        client.save(snapshot("short"), ttl_s=0.2)
        watcher = Client(daemon.socket_path, timeout=None)
        events = watcher.watch()
        next(events)  # the first event: the watch is open
        held = [daemon.client() for _ in range(2)]
        for extra in held:
            extra.ping()
        with pytest.raises(Overloaded):  # the fifth connection is turned away
            daemon.client().ping()
        samples = _until(port, "sessionstore_expirations_total", 1)
        assert _value(samples, "sessionstore_requests_total", op="save", code="ok") >= 41
        assert _value(samples, "sessionstore_requests_total", op="load", code="bad_request") == 1
        assert _value(samples, "sessionstore_requests_total", op="(none)", code="bad_request") >= 1
        assert _value(samples, "sessionstore_request_seconds_count", op="load") == 2
        assert _value(samples, "sessionstore_request_seconds_bucket", op="save", le="+Inf") >= 41
        assert _value(samples, "sessionstore_request_seconds_count", op="txn") == 1
        assert _value(samples, "sessionstore_request_seconds_sum", op="txn") < 60
        assert _value(samples, "sessionstore_batch_size_count") >= 41
        assert _value(samples, "sessionstore_batch_commit_seconds_count") >= 41
        assert _value(samples, "sessionstore_watchers") == 1
        assert _value(samples, "sessionstore_connections") >= 4
        assert _value(samples, "sessionstore_connections_accepted_total") >= 5
        assert _value(samples, "sessionstore_refusals_total", reason="overloaded") == 1
        assert _value(samples, "sessionstore_log_bytes") > 0
        assert _value(samples, "sessionstore_sessions") >= 1
        assert _value(samples, "sessionstore_keep_generations") == 4
        schedule = ("sessionstore_expiry_schedule_entries", ())
        assert (schedule in samples) == (backend == "log")  # PostgreSQL sweeps by a query
        assert ("sessionstore_last_recovery", (("what", "seq"),)) in samples
        if backend == "log":
            assert _value(samples, "sessionstore_fdatasync_seconds_count") >= 41
            _until(port, "sessionstore_compactions_total", 1)  # the writer's own
        else:
            assert _value(samples, "sessionstore_postgresql_follower_lag_seqs") >= 0
            assert ("sessionstore_postgresql_counter_wait_seconds", ()) in samples
        for extra in held:
            extra.close()
        events.close()  # the watch's own connection
        watcher.close()
    # the teardown's own connection counts against --max-connections 4: it waits until
    # the daemon has seen every connection of the test closed
    _until_at_most(port, "sessionstore_connections", 0)


def _until_at_most(port: int, name: str, at_most: float) -> None:
    deadline = time.monotonic() + 60
    while _value(_scrape(port), name) > at_most:
        assert time.monotonic() < deadline, f"{name} never came down to {at_most}"
        time.sleep(0.05)


def test_only_metrics_is_served(daemon: DaemonProcess) -> None:
    port = _free_port()
    daemon.start("--metrics-listen", str(port))  # a port alone: loopback
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=30)
    assert missing.value.code == 404
    assert _scrape(port)  # and the daemon serves on
    with daemon.client() as client:
        client.ping()


@pytest.mark.log_only
def test_a_taken_metrics_port_stops_the_start_with_one_line(daemon: DaemonProcess) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        daemon.start("--metrics-listen", f"127.0.0.1:{taken.getsockname()[1]}", wait=False)
        assert daemon.wait_exit() != 0
    assert "metrics" in daemon.log().strip().splitlines()[-1]


def test_a_watcher_that_reads_nothing_is_counted_lagged(daemon: DaemonProcess) -> None:
    port = _free_port()
    daemon.start("--metrics-listen", f"127.0.0.1:{port}", "--watch-max-lag", "100")
    silent = Client(daemon.socket_path, timeout=None)
    (first,) = silent._send_raw([{"op": "watch"}])  # then it reads nothing more
    assert first["watching"] is True
    with daemon.client() as client:
        ops = [{"op": "put", "kind": "kv", "key": f"k{n}", "value": {"n": n}} for n in range(1000)]
        client.txn(ops)  # 1,000 changes at once: far past the lag it may have
    samples = _until(port, "sessionstore_watchers_lagged_total", 1)
    assert _value(samples, "sessionstore_watchers") == 0
    silent.close()


def test_a_watcher_that_reads_nothing_for_the_send_timeout_is_counted_dropped(
    daemon: DaemonProcess,
) -> None:
    port = _free_port()
    # cut off once 15,000 behind, with its socket full: the lagged notice cannot go
    daemon.start(
        "--metrics-listen", f"127.0.0.1:{port}", "--watch-max-lag", "15000",
        "--watch-send-timeout-seconds", "2",
    )  # fmt: skip
    silent = Client(daemon.socket_path, timeout=None)
    (first,) = silent._send_raw([{"op": "watch"}])  # then it reads nothing more
    assert first["watching"] is True
    with daemon.client() as client:
        for start in range(0, 30_000, 10_000):  # events past what the socket buffers
            ops = [{"op": "put", "kind": "kv", "key": f"k{n}", "value": {"n": n}}
                   for n in range(start, start + 10_000)]  # fmt: skip
            client.txn(ops)
    until(  # the daemon waits 2 s for it, as told
        lambda: _value(_scrape(port), "sessionstore_watchers_dropped_total") >= 1,
        "the silent watcher dropped",
    )
    silent.close()


def test_unknown_ops_count_under_one_label_and_the_text_stays_small(
    daemon: DaemonProcess,
) -> None:
    port = _free_port()
    daemon.start("--metrics-listen", f"127.0.0.1:{port}")
    with daemon.client() as client:
        client.save(snapshot("known"))
        client.call("stats")
        known_size = len(_scrape_text(port))
        sent = 5000
        replies = client._send_raw([{"op": f"no-such-op-{n}-{'x' * 40}"} for n in range(sent)])
        assert {reply["error"]["code"] for reply in replies} == {"unknown_op"}
        stats = client.call("stats")
    text = _scrape_text(port)
    samples = samples_of(text)
    ops = {dict(labels)["op"] for _, labels in samples if "op" in dict(labels)}
    assert ops == {"save", "stats", "(unknown)"}
    assert _value(samples, "sessionstore_requests_total", op="(unknown)", code="unknown_op") == sent
    assert _value(samples, "sessionstore_request_seconds_count", op="(unknown)") == sent
    # one more op's lines (its requests and its latency histogram), whatever was sent
    assert len(text) < known_size + 4096, (known_size, len(text))
    assert set(stats["requests"]) == {"save", "stats", "(unknown)"}
    assert stats["requests"]["(unknown)"]["errors"] == sent


def test_scrapers_past_the_limit_are_closed_unread(daemon: DaemonProcess) -> None:
    port = _free_port()
    daemon.start("--metrics-listen", f"127.0.0.1:{port}")
    limit, extra = MAX_METRICS_CONNECTIONS, 8
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(limit + extra)]
    try:
        answered: dict[socket.socket, bytes] = {}
        deadline = time.monotonic() + 60
        while len(answered) < extra:  # the daemon closes those past the limit
            assert time.monotonic() < deadline, f"{len(answered)} of {extra} closed"
            ready, _, _ = select.select([s for s in idle if s not in answered], [], [], 1)
            for sock in ready:
                answered[sock] = sock.recv(4096)
        closed_unread = [sock for sock, data in answered.items() if data == b""]
        assert len(closed_unread) == extra, answered  # the rest: held, or timed out (405)
        with daemon.client() as client:
            client.ping()
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 60
    while True:  # once the daemon has seen them go, a scrape is served again
        try:
            assert _scrape(port)
            break
        except OSError:  # closed unread: some are not seen gone yet
            assert time.monotonic() < deadline, "no scrape served after the idle ones left"
            time.sleep(0.1)


async def test_the_text_is_made_in_a_thread_from_a_copy_while_the_loop_runs_on() -> None:
    reading, counted = threading.Event(), threading.Event()

    class Refusals(dict[str, int]):
        """The snapshot's refusals, held while the thread reads them until the loop has
        counted a request: made on the loop, the text would hold it, and wait in vain."""

        def items(self) -> Any:
            reading.set()
            assert counted.wait(60), "the event loop did not run while the text was made"
            return super().items()

    metrics = Metrics(REGISTRY)
    texts: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def scrape() -> None:
            texts.append(await metrics.exposition({"refused": Refusals(overloaded=1)}))

        nursery.start_soon(scrape)
        assert await trio.to_thread.run_sync(reading.wait, 60)
        metrics.request("ping", "ok", 0.0)  # on the loop, while the text is being made
        counted.set()
    assert b'sessionstore_refusals_total{reason="overloaded"} 1.0' in texts[0]
    assert b'op="ping"' not in texts[0]  # made from the counts as the scrape began
    assert b'op="ping"' in await metrics.exposition({})
