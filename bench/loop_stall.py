# How long one expensive request can keep the daemon from answering others: a
# client pings in a loop (one ping in flight) while another sends the most
# expensive requests within the limits we could construct, and the ping
# latencies during each are reported. Dense small maps are the worst case per
# byte for cbor2 (measured in prepare.py's comment). Then the same pings while
# one client saves, one save in flight: the writer waits for a lone client's
# commit on the event loop for at most 2 ms; on a disk whose every commit takes
# 20 ms longer (the test-only failpoint action `slow`) it waits through trio,
# and the pings go on.
from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cbor2

from sessionstore.client import Client
from sessionstore.wire.protocol import NEED_DATA, Connection, Mode

MIB = 1024 * 1024


SCAN_VALUES, SCAN_VALUE_BYTES = 64, 127 * 1024  # one reply's worth: 8 MiB


def _store_scan_values(socket_path: str) -> None:
    with Client(socket_path, timeout=600) as client:
        for n in range(SCAN_VALUES):
            client.checkpoint_put("kv", f"big/{n:02}", {"text": "x" * SCAN_VALUE_BYTES})


KV_KEYS, KV_TXN_OPS = 500_000, 10_000


def _store_kv_keys(socket_path: str) -> None:
    """500,000 small kv keys, k/000000 .. k/499999, in txns of 10,000."""
    with Client(socket_path, timeout=600) as client:
        for start in range(0, KV_KEYS, KV_TXN_OPS):
            puts = [
                {"op": "put", "kind": "kv", "key": f"k/{n:06}", "value": {"n": n}}
                for n in range(start, start + KV_TXN_OPS)
            ]
            client.txn(puts)


Heavy = tuple[bytes, Mode, Callable[[str], None] | None]  # request, its dialect, a setup


def _heavy_requests(quick: bool) -> dict[str, Heavy]:
    def save(events: list[Any]) -> bytes:
        snapshot = {"schema_version": 1, "session": {"id": "heavy"}, "events": events}
        return cbor2.dumps({"op": "save", "snapshot": snapshot})

    scan = {"op": "checkpoint_scan", "kind": "kv", "prefix": "big/", "limit": SCAN_VALUES}
    requests: dict[str, Heavy] = {
        # 15 bytes a map
        "3.6 MiB save of 250,000 small maps (float: the canonical slow path)": (
            save([{"b": 1, "a": 0.5}] * 250_000),
            Mode.CBOR,
            None,
        ),
        "JSON checkpoint_scan of 8 MiB (64 values)": (
            json.dumps(scan).encode() + b"\n",
            Mode.JSON,
            _store_scan_values,
        ),
    }
    # after the setup, 500,000 keys; k/1 holds 100,000 of them
    requests["txn: delete_prefix of 100,000 kv keys among 500,000"] = (
        cbor2.dumps({"op": "txn", "ops": [{"op": "delete_prefix", "kind": "kv", "prefix": "k/1"}]}),
        Mode.CBOR,
        _store_kv_keys,
    )
    sorting_first = [
        {"op": "put", "kind": "kv", "key": f"a/{n:05}", "value": {"n": n}}
        for n in range(KV_TXN_OPS)
    ]
    requests["txn: 10,000 puts that sort before 400,000 kv keys"] = (
        cbor2.dumps({"op": "txn", "ops": sorting_first}),
        Mode.CBOR,
        None,
    )
    if not quick:
        requests["63 MiB save of 4,400,000 small maps (near the 64 MiB request limit)"] = (
            save([{"b": 1, "a": 0.5}] * 4_400_000),
            Mode.CBOR,
            None,
        )
    return requests


def _send(socket_path: str, frame: bytes, mode: Mode, out: list[tuple[float, str]]) -> None:
    conn = Connection(max_message_bytes=1 << 30, mode=mode)
    started = time.perf_counter()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(600)
        sock.connect(socket_path)
        sock.sendall(frame)
        while (message := conn.next_message()) is NEED_DATA:
            conn.receive_data(sock.recv(64 * 1024))
    outcome = "ok" if message.get("ok") else message["error"]["code"]
    out.append((time.perf_counter() - started, outcome))


def _ping_while(socket_path: str, busy: Callable[[], bool]) -> list[float]:
    latencies = []
    with Client(socket_path, timeout=600) as client:
        while busy():
            started = time.perf_counter()
            client.ping()
            latencies.append(time.perf_counter() - started)
    return latencies


def run(daemon_class: Any, workdir: Path, *, quick: bool = False) -> dict[str, Any]:
    daemon = daemon_class(workdir)
    results: dict[str, Any] = {}
    try:
        idle_until = time.monotonic() + 1.0
        idle = _ping_while(daemon.socket, lambda: time.monotonic() < idle_until)
        results["idle"] = summary_of(idle)
        for name, (frame, mode, setup) in _heavy_requests(quick).items():
            if setup is not None:
                setup(daemon.socket)
            answer: list[tuple[float, str]] = []
            sender = threading.Thread(target=_send, args=(daemon.socket, frame, mode, answer))
            sender.start()
            pings = _ping_while(daemon.socket, sender.is_alive)
            sender.join()
            seconds, outcome = answer[0]
            results[name] = {"answered_s": round(seconds, 2), "reply": outcome, **summary_of(pings)}
    finally:
        daemon.stop()
    return {**results, **lone_saver(daemon_class, workdir)}


LONE_SAVES_S = 3.0
SLOW_DISK = {"SESSIONSTORED_FAILPOINTS": "before-commit-record=slow"}


def _save_for(socket_path: str, seconds: float, saved: list[int]) -> None:
    snapshot = {"schema_version": 1, "session": {"id": "lone"}, "artifacts": ["x" * 4000]}
    deadline = time.monotonic() + seconds
    with Client(socket_path, timeout=600) as client:
        while time.monotonic() < deadline:
            client.save(snapshot)
            saved[0] += 1


def lone_saver(daemon_class: Any, workdir: Path) -> dict[str, Any]:
    """Pings while one client saves 4 KiB snapshots, on this disk and on a slow one."""
    results: dict[str, Any] = {}
    disks: dict[str, dict[str, str]] = {
        "one client saving": {},
        "one client saving, every commit 20 ms slower": SLOW_DISK,
    }
    for name, env in disks.items():
        directory = workdir / ("slow-disk" if env else "lone-saver")
        directory.mkdir()
        daemon = daemon_class(directory, env=env)
        try:
            saved = [0]
            saver = threading.Thread(target=_save_for, args=(daemon.socket, LONE_SAVES_S, saved))
            saver.start()
            pings = _ping_while(daemon.socket, saver.is_alive)
            saver.join()
            results[name] = {"saves": saved[0], **summary_of(pings)}
        finally:
            daemon.stop()
    return results


def summary_of(latencies: list[float]) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {
        "pings": len(ordered),
        "ping_p50_ms": round(statistics.median(ordered) * 1e3, 2),
        "ping_p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1e3, 2),
        "ping_max_ms": round(ordered[-1] * 1e3, 2),
    }


def main() -> None:
    """`python -m bench.loop_stall [--quick]`: this part of `make bench` alone."""
    import argparse
    import tempfile

    from .daemon import Daemon

    parser = argparse.ArgumentParser(prog="python -m bench.loop_stall")
    parser.add_argument("--quick", action="store_true", help="without the 63 MiB save")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loop-stall-") as workdir:
        for name, figures in run(Daemon, Path(workdir), quick=args.quick).items():
            print(f"loop stall: {name}: {json.dumps(figures)}", flush=True)


if __name__ == "__main__":
    main()
