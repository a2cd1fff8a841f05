# Backup and restore figures: a store of DOCUMENTS sessions of 4 KiB,
# then `sessionstore backup` while one client pings (one ping in flight) and
# another saves in a loop: the backup's MB/s, and how long the others waited
# meanwhile; then `sessionstored restore` into a new state directory, its MB/s.
#
#   python -m bench.backup [--dir DIR] [--documents N]
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.options import existing_dir
from sessionstore.client import Client

from .loop_stall import summary_of

KIB = 1024


def _fill(socket_path: str, documents: int) -> None:
    with Client(socket_path, timeout=600) as client:
        for n in range(documents):
            client.save({"schema_version": 1, "session": {"id": f"s{n:07}", "pad": "p" * 4000}})


def _busy(socket_path: str, running: threading.Event, out: dict[str, list[float]]) -> None:
    def pinger() -> None:
        with Client(socket_path, timeout=600) as client:
            while running.is_set():
                started = time.perf_counter()
                client.ping()
                out["ping"].append(time.perf_counter() - started)

    def saver() -> None:
        with Client(socket_path, timeout=600) as client:
            n = 0
            while running.is_set():
                started = time.perf_counter()
                client.save({"schema_version": 1, "session": {"id": f"w{n % 100}", "n": n}})
                out["save"].append(time.perf_counter() - started)
                n += 1

    for work in (pinger, saver):
        threading.Thread(target=work, daemon=True).start()


def run(daemon_class: Any, workdir: Path, documents: int) -> dict[str, Any]:
    (workdir / "source").mkdir()
    daemon = daemon_class(workdir / "source")
    results: dict[str, Any] = {"documents": documents, "document_bytes": 4 * KIB}
    try:
        _fill(daemon.socket, documents)
        waits: dict[str, list[float]] = {"ping": [], "save": []}
        running = threading.Event()
        running.set()
        _busy(daemon.socket, running, waits)  # a ping and a save in flight all along
        backup = subprocess.run(
            [sys.executable, "-m", "sessionstore.tools.cli", "--socket", daemon.socket,
             "--json", "backup", str(workdir / "b.bak")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        running.clear()
        summary = json.loads(backup.stdout)
        results["backup"] = {
            "seconds": summary["seconds"],
            "payload_mb": round(summary["payload_bytes"] / 1e6, 1),
            "mb_per_s": summary["mb_per_s"],
            "ping_during": summary_of(waits["ping"]) if waits["ping"] else None,
            "save_during": summary_of(waits["save"]) if waits["save"] else None,
        }
    finally:
        daemon.stop()
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "sessionstored", "restore", str(workdir / "b.bak"),
         "--state-dir", str(workdir / "restored")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    size = (workdir / "b.bak").stat().st_size
    results["restore"] = {"seconds": round(seconds, 2), "mb_per_s": round(size / seconds / 1e6, 1)}
    return results


def main() -> None:
    from .daemon import Daemon

    parser = argparse.ArgumentParser(prog="python -m bench.backup")
    parser.add_argument(
        "--dir", default=None, type=existing_dir, help="where to put the stores (a real disk)"
    )
    parser.add_argument("--documents", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="backup-", dir=args.dir) as workdir:
        figures = run(Daemon, Path(workdir), args.documents)
    for name, value in figures.items():
        print(f"backup: {name}: {json.dumps(value)}", flush=True)


if __name__ == "__main__":
    main()
