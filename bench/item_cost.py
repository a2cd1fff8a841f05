# The cost of a save against its bytes and its CBOR items, for each
# CBOR helper path: the compiled one and the pure-Python one, side by side in one
# `make bench` run. Each path runs in a process of its own (python -m
# bench.item_cost, with SESSIONSTORE_CBOR_HELPER set), so that the daemon, the
# saving clients and the in-process encode all take that path. Per path:
# - a daemon's CPU per save (from /proc, the whole process) and saves/s, at 4 KiB
#   and 64 KiB, 1 and 64 clients;
# - a 1 MiB save of small maps (trace events), one client: p50;
# - a client's encode of the 64 KiB save request, against json.dumps of the same
#   snapshot.
# The SQLite anchors are the main run's, and SQLite's commit of the 1 MiB
# snapshot is measured here.
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sessionstore.wire.cbor_bytes import ENVIRONMENT_VARIABLE
from sessionstore.wire.messages import encode_request
from sessionstore.wire.shared import Mode

from . import anchors
from .load import run_clients
from .sealing_cost import per_call_us
from .verdicts import verdict
from .workload import make_snapshot

KIB = 1024
MIB = 1024 * KIB
PATHS = ("compiled", "python")
ENCODE_ROUNDS = 200


def _p50_ms(latencies: list[float]) -> float:
    return round(statistics.median(latencies) * 1000, 2) if latencies else float("nan")


def measure_this_path(workdir: Path, seconds: float) -> dict[str, Any]:
    """Every figure of this process's helper path (run with the variable set)."""
    import json as json_module

    from sessionstore.wire import cbor_bytes

    from .daemon import Daemon

    figures: dict[str, Any] = {"helper": cbor_bytes.IMPLEMENTATION}
    daemon = Daemon(workdir)
    try:
        for size in (4 * KIB, 64 * KIB):
            for clients in (1, 64):
                before = daemon.cpu_s()
                tag = f"{size}-{clients}"
                sample = run_clients(daemon.socket, "save", clients, size, seconds, tag)
                cpu_s = daemon.cpu_s() - before
                if sample.errors:
                    raise SystemExit(f"item_cost: {sample.errors} failed saves")
                figures[f"save {size // KIB} KiB, {clients} clients"] = {
                    "saves_per_s": round(sample.operations / sample.elapsed_s),
                    "daemon_cpu_us_per_save": round(cpu_s / sample.operations * 1e6, 1),
                    "p50_ms": _p50_ms(sample.latencies_s),
                }
        large = run_clients(daemon.socket, "save", 1, MIB, seconds, "1MiB")
        if large.errors:
            raise SystemExit(f"item_cost: {large.errors} failed 1 MiB saves")
        figures["save 1 MiB, 1 client"] = {
            "saves_per_s": round(large.operations / large.elapsed_s, 1),
            "p50_ms": _p50_ms(large.latencies_s),
        }
    finally:
        daemon.stop()
    snapshot = make_snapshot("s0", 64 * KIB)
    request = {"op": "save", "snapshot": snapshot}
    figures["client encode 64 KiB"] = {
        "encode_request_us": round(
            per_call_us(lambda: encode_request(request, Mode.CBOR), ENCODE_ROUNDS), 1
        ),
        "json_dumps_us": round(per_call_us(lambda: json_module.dumps(snapshot), ENCODE_ROUNDS), 1),
    }
    return figures


def sqlite_large_commit(workdir: Path, seconds: float) -> dict[str, Any]:
    db = str(workdir / "large.db")
    anchors.open_sqlite(db).close()
    latencies = anchors.sqlite_saves(
        db, "s0", make_snapshot("s0", MIB), time.perf_counter() + seconds
    )
    return {"commits_per_s": round(len(latencies) / seconds, 1), "p50_ms": _p50_ms(latencies)}


def run(workdir: Path, seconds: float) -> dict[str, Any]:
    """Both paths, each in its own process; SQLite's 1 MiB commit beside them."""
    out: dict[str, Any] = {}
    for path in PATHS:
        (workdir / path).mkdir()
        environment = {**os.environ, ENVIRONMENT_VARIABLE: path}
        result = subprocess.run(
            [sys.executable, "-m", "bench.item_cost", str(workdir / path), str(seconds)],
            env=environment,
            check=True,
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        out[path] = json.loads(result.stdout.strip().splitlines()[-1])
        print(f"item cost: {path}: {json.dumps(out[path])}", flush=True)
    (workdir / "sqlite").mkdir()
    out["sqlite 1 MiB commit"] = sqlite_large_commit(workdir / "sqlite", seconds)
    print(f"item cost: sqlite 1 MiB commit: {json.dumps(out['sqlite 1 MiB commit'])}", flush=True)
    return out


def targets(
    figures: dict[str, Any], sqlite_64k_64: float | None, best_sqlite_4k: float | None
) -> dict[str, tuple[Any, str]]:
    """Issue 22's rows, for each path: (figure of this run, met or missed)."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    out: dict[str, tuple[Any, str]] = {}
    sqlite_large = figures.get("sqlite 1 MiB commit", {}).get("p50_ms")
    for path in PATHS:
        ours = figures.get(path)
        if not ours:
            continue

        def cpu(size: int, clients: int, ours: dict[str, Any] = ours) -> float:
            return float(ours[f"save {size} KiB, {clients} clients"]["daemon_cpu_us_per_save"])

        def rate(size: int, clients: int, ours: dict[str, Any] = ours) -> float:
            return float(ours[f"save {size} KiB, {clients} clients"]["saves_per_s"])

        encode = ours["client encode 64 KiB"]
        rows = {
            "64 KiB save CPU x 4 KiB's, 1 client": (ratio(cpu(64, 1), cpu(4, 1)), 4, True),
            "64 KiB save CPU x 4 KiB's, 64 clients": (ratio(cpu(64, 64), cpu(4, 64)), 4, True),
            "64 KiB save, 64 clients: x SQLite's commits/s": (
                ratio(rate(64, 64), sqlite_64k_64),
                1,
                False,
            ),
            "4 KiB save, 64 clients: x the best SQLite setup": (
                ratio(rate(4, 64), best_sqlite_4k),
                1.5,
                False,
            ),
            "1 MiB save, 1 client: p50 x SQLite's commit": (
                ratio(ours["save 1 MiB, 1 client"]["p50_ms"], sqlite_large),
                2,
                True,
            ),
            "client encode of 64 KiB x json.dumps": (
                ratio(encode["encode_request_us"], encode["json_dumps_us"]),
                2,
                True,
            ),
        }
        for label, (value, bound, at_most) in rows.items():
            out[f"{path}: {label}"] = verdict(value, bound, at_most)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.item_cost")
    parser.add_argument("workdir", type=Path)
    parser.add_argument("seconds", type=float)
    args = parser.parse_args()
    print(json.dumps(measure_this_path(args.workdir, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
