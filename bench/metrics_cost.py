# What the metrics cost. The daemon counts every reply whether or not it serves
# /metrics (`stats` and `sessionstore top` read the counts), so the counting's
# own cost is measured alone: COUNTED replies through the same calls the daemon
# makes per reply, set against the daemon CPU per request (from /proc) of a
# `ping` at 32 clients (the cheapest request, where counting weighs most) and
# of a 4 KiB save at 64 clients. The target: within 3%. The daemon with and
# without --metrics-listen (the exporter, and a scrape every SCRAPE_S seconds)
# is also compared on the same requests, each the mean of ROUNDS daemons in
# ABBA order; runs of one setting differ by up to 20% on a small VM.
from __future__ import annotations

import socket
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import cbor2

from .load import run_clients, run_fixed

ROUNDS = 2
SCRAPE_S = 1.0
COUNTED = 200_000


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _scraping(port: int, stop: threading.Event) -> None:
    while not stop.wait(SCRAPE_S):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            reply.read()


def _measure(daemon: Any, seconds: float) -> dict[str, float]:
    ping = cbor2.dumps({"op": "ping"})
    before = daemon.cpu_s()
    pings = run_fixed(daemon.socket, [ping] * 32, seconds)
    middle = daemon.cpu_s()
    saves = run_clients(daemon.socket, "save", 64, 4096, seconds, f"m{time.monotonic_ns()}")
    after = daemon.cpu_s()
    return {
        "ping_cpu_us": (middle - before) / max(1, pings.operations) * 1e6,
        "save_cpu_us": (after - middle) / max(1, saves.operations) * 1e6,
        "pings_per_s": pings.operations / pings.elapsed_s,
        "saves_per_s": saves.operations / saves.elapsed_s,
    }


def counting_us() -> float:
    """Microseconds the daemon spends counting one reply (server.py's _count_answer)."""
    from sessionstored.front.metrics import Metrics
    from sessionstored.ops import REGISTRY

    metrics = Metrics(REGISTRY)
    response: dict[str, Any] = {"ok": True, "seq": 1}
    started = time.perf_counter()
    for _ in range(COUNTED):
        began = time.perf_counter()
        error = response.get("error")
        code = error.get("code", "internal") if isinstance(error, dict) else "ok"
        metrics.request("save", str(code), time.perf_counter() - began)
    return (time.perf_counter() - started) / COUNTED * 1e6


def run(daemon_type: Any, workdir: Path, seconds: float) -> dict[str, Any]:
    measured: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for round_ in range(ROUNDS):
        for setting in ("on", "off") if round_ % 2 == 0 else ("off", "on"):  # ABBA
            where = workdir / f"{setting}-{round_}"
            where.mkdir()
            port = _free_port()
            extra = ("--metrics-listen", f"127.0.0.1:{port}") if setting == "on" else ()
            daemon = daemon_type(where, *extra)
            stop = threading.Event()
            scraper = threading.Thread(target=_scraping, args=(port, stop))
            if setting == "on":
                scraper.start()
            try:
                measured[setting].append(_measure(daemon, seconds))
            finally:
                stop.set()
                if setting == "on":
                    scraper.join()
                daemon.stop()
    result: dict[str, Any] = {}
    for setting, runs in measured.items():
        result[setting] = {k: round(statistics.mean(r[k] for r in runs), 1) for k in runs[0]}
    counting = counting_us()
    result["counting_us_per_request"] = round(counting, 2)
    for figure in ("ping_cpu_us", "save_cpu_us"):
        result[f"{figure}_ratio"] = round(result["on"][figure] / result["off"][figure], 3)
        result[f"counting_share_of_{figure}"] = round(counting / result["off"][figure], 4)
    return result


def main() -> None:
    from .standalone import run_alone

    run_alone("python -m bench.metrics_cost", run, 5.0)


if __name__ == "__main__":
    main()
