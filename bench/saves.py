# The save rows of a run: sessionstored's on daemons of the bench's own and the
# anchors', taken in turns (interleaved.py), each server's CPU per save from
# /proc; and an anchor's alone, its clients in processes of their own.
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from . import anchors, redis_anchor
from .daemon import Daemon
from .interleaved import (
    MakeArgs,
    daemon_system,
    interleaved_rows,
    process_system,
    redis_system,
    sqlite_system,
)
from .load import run_clients
from .rows import KIB, Row, format_row, row_of


def save_rows(base: Path, args: argparse.Namespace, *, sealed: bool) -> list[Row]:
    """sessionstored (and, with sealed, sessionstored with a key), SQLite and Redis, their
    saves taken in turns (interleaved.py), then each daemon's load row. Redis is left out,
    with a note, where redis-server is not installed."""
    daemons = {"sessionstored": _daemon(base / "daemon")}
    if sealed:
        key_file = base / "bench.key"
        key_file.write_bytes(os.urandom(32))
        daemons["sessionstored+key"] = _daemon(base / "sealed", "--key-file", str(key_file))
    redis = None
    missing = redis_anchor.available()
    if missing is None:
        redis = redis_anchor.RedisServer(base / "redis")
    else:
        print(f"bench: Redis left out: {missing}", flush=True)
    db = str(base / "sessions.db")
    anchors.open_sqlite(db).close()
    systems = [daemon_system(name, daemon) for name, daemon in daemons.items()]
    systems.append(sqlite_system(db))
    if redis is not None:
        systems.append(redis_system(redis))
    try:
        rows = interleaved_rows(systems, args.sizes, args.clients, args.seconds, args.repeats)
        for name, daemon in daemons.items():
            rows.append(load_row(daemon, args, name))
    finally:
        for daemon in daemons.values():
            daemon.stop()
        if redis is not None:
            redis.stop()
    return rows


def _daemon(workdir: Path, *extra: str) -> Daemon:
    workdir.mkdir(parents=True, exist_ok=True)
    return Daemon(workdir, *extra)


def load_row(daemon: Daemon, args: argparse.Namespace, name: str) -> Row:
    """Loads of 4 KiB snapshots by args.load_clients clients, and the daemon's RSS after."""
    samples = [
        run_clients(
            daemon.socket,
            "load",
            args.load_clients,
            4 * KIB,
            args.seconds,
            f"{4 * KIB}-{args.load_clients}-0",
        )
        for _ in range(args.repeats)
    ]
    row = row_of(f"{name} load", args.load_clients, 4 * KIB, samples)
    row.extra["rss_kib_after"] = daemon.rss_kib()
    print(format_row(row), flush=True)
    return row


def anchor_rows(
    name: str, target: Any, make_args: MakeArgs, args: argparse.Namespace, process_counts: list[int]
) -> list[Row]:
    """An anchor alone (the naive upstream store), its clients in processes of their own."""
    system = process_system(name, target, make_args)
    return interleaved_rows([system], args.sizes, process_counts, args.seconds, args.repeats)
