# The expiry sweep under a flood: N small kv documents (a million by default)
# written with ttls that make them all expire at one moment, then, from that
# moment until the sweep has removed every one: how fast the sweep goes, what a
# client's ping sees (one in flight, in a loop), and what a client's 4 KiB saves
# see meanwhile. `python -m bench.expiry [--documents N]` runs this part alone.
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from bench.options import existing_dir
from sessionstore.client import Client

from .loop_stall import summary_of
from .workload import make_snapshot

TXN_OPS = 10_000  # the daemon's largest txn
MARGIN_S = 5.0  # between the last write and the moment they all expire
POLL_S = 0.2  # how often the sweep's progress is read from stats


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _fill(socket_path: str, documents: int) -> tuple[int, float]:
    """Every document, expiring at one moment a little after the last is written:
    (that moment in ms, the seconds the writing took)."""
    started = time.monotonic()
    with Client(socket_path, timeout=600) as client:
        first = min(TXN_OPS, documents)
        probe = time.monotonic()
        client.txn([{"op": "put", "kind": "kv", "key": f"x/{n:07}", "value": {"n": n},
                     "ttl_s": 3600} for n in range(first)])  # fmt: skip
        per_txn_s = time.monotonic() - probe
        txns = -(-documents // TXN_OPS)
        at_ms = _now_ms() + int((per_txn_s * txns * 3 + MARGIN_S) * 1000)  # later txns are slower
        for start in range(0, documents, TXN_OPS):  # the first again, with the common moment
            puts = [
                {"op": "put", "kind": "kv", "key": f"x/{n:07}", "value": {"n": n},
                 "ttl_s": (at_ms - _now_ms()) / 1000}
                for n in range(start, min(documents, start + TXN_OPS))
            ]  # fmt: skip
            client.txn(puts)
    assert _now_ms() < at_ms, "writing took longer than foreseen: raise MARGIN_S"
    return at_ms, time.monotonic() - started


def _loop(socket_path: str, running: threading.Event, call: str) -> list[float]:
    latencies: list[float] = []
    snapshot = make_snapshot("during-sweep", 4 * 1024)
    with Client(socket_path, timeout=600) as client:
        while running.is_set():
            started = time.perf_counter()
            if call == "ping":
                client.ping()
            else:
                client.save(snapshot)
            latencies.append(time.perf_counter() - started)
    return latencies


def run(daemon_class: Any, workdir: Path, documents: int) -> dict[str, Any]:
    daemon = daemon_class(workdir)
    try:
        at_ms, fill_s = _fill(daemon.socket, documents)
        while _now_ms() < at_ms:
            time.sleep(0.01)
        running = threading.Event()
        running.set()
        found: dict[str, list[float]] = {}
        loops = [
            threading.Thread(
                target=lambda c=c: found.setdefault(c, _loop(daemon.socket, running, c))
            )
            for c in ("ping", "save")
        ]
        for thread in loops:
            thread.start()
        started = time.monotonic()
        cpu_before = daemon.cpu_s()
        with Client(daemon.socket, timeout=600) as client:
            while client.stats()["expirations"] < documents:
                time.sleep(POLL_S)
        sweep_s = time.monotonic() - started
        cpu_s = daemon.cpu_s() - cpu_before
        running.clear()
        for thread in loops:
            thread.join()
        saves = summary_of(found["save"])
        return {
            "documents": documents,
            "fill_s": round(fill_s, 1),
            "sweep_s": round(sweep_s, 1),
            "expired_per_s": round(documents / sweep_s),
            "daemon_cpu_us_per_expiry": round(cpu_s / documents * 1e6, 1),
            **summary_of(found["ping"]),
            "saves_during_sweep": saves["pings"],
            "save_p50_ms": saves["ping_p50_ms"],
            "save_p99_ms": saves["ping_p99_ms"],
        }
    finally:
        daemon.stop()


def main() -> None:
    import argparse
    import json
    import tempfile

    from .daemon import Daemon

    parser = argparse.ArgumentParser(prog="python -m bench.expiry")
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument(
        "--dir", default=None, type=existing_dir, help="where to put the store (a real disk)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="expiry-", dir=args.dir) as workdir:
        print(json.dumps(run(Daemon, Path(workdir), args.documents)))


if __name__ == "__main__":
    main()
