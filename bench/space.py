# The space target of the log engine: N sessions of 4 KiB each rewritten R
# times through the daemon (64 clients), then what the log keeps on disk
# against the live bytes, after the automatic compaction, and the write
# amplification: bytes the daemon wrote to disk / bytes of snapshots saved.
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sessionstore.client import Client

from .load import run_clients_over

KIB = 1024
SETTLE_S = 30.0  # compaction runs in the background: give the last one time to finish


def _log_files_bytes(state: Path) -> int:
    return sum(f.stat().st_size for f in (state / "log").iterdir() if f.suffix == ".seg")


def run(daemon_type: Any, workdir: Path, sessions: int, rounds: int) -> dict[str, Any]:
    daemon = daemon_type(workdir)
    try:
        written_before = daemon.written_bytes()
        started = time.monotonic()
        saved_bytes = run_clients_over(daemon.socket, 64, sessions, rounds, 4 * KIB)
        elapsed = time.monotonic() - started
        deadline = time.monotonic() + SETTLE_S
        with Client(daemon.socket) as client:
            while True:
                stats = client.stats()
                if stats["log_dead_share"] < 0.5 or time.monotonic() > deadline:
                    break
                time.sleep(1)
        written = daemon.written_bytes() - written_before
    finally:
        daemon.stop()
    state = workdir / "state"
    live = stats["live_bytes"]
    files = _log_files_bytes(state)
    return {
        "sessions": sessions,
        "rounds": rounds,
        "saves": sessions * rounds,
        "seconds": round(elapsed, 1),
        "saves_per_s": round(sessions * rounds / elapsed),
        "live_bytes": live,
        "log_record_bytes": stats["wal_bytes"],
        "log_records_over_live": round(stats["wal_bytes"] / live, 2),
        "log_file_bytes": files,
        "log_files_over_live": round(files / live, 2),
        "dead_share": stats["log_dead_share"],
        "compactions": stats["compactions"],
        "bytes_saved": saved_bytes,
        "bytes_written_to_disk": written,
        "write_amplification": round(written / saved_bytes, 2),
    }
