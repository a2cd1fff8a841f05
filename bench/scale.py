# The scale figures: restart-to-serving time and RSS with 100,000
# sessions, and one client's save latency after 1,000,000 past commits against
# a fresh store. `python -m bench.scale [--sessions N] [--commits N]`.
#
# Writing a million commits durably would take an hour, so the *setup* writes
# the history in-process through UnsafeNoSyncFileSystem (no fsync at all), then
# syncs the whole filesystem once. Everything measured afterwards is the real
# daemon on the real filesystem, with every durability step in place.
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.options import existing_dir
from sessionstore.client import Client
from sessionstore.wire.canonical import canonical_dumps, digest_bytes_of_canonical
from sessionstored.storage.log.fs import RealFileSystem
from sessionstored.storage.log.recovery import open_store
from sessionstored.storage.mutations import Put

from .workload import make_snapshot

RESULTS = Path(__file__).resolve().parent / "results"
SETUP_BATCH = 2000


class UnsafeNoSyncFileSystem(RealFileSystem):
    """Benchmark setup only: never syncs. Not durable; never used by the daemon."""

    def fsync(self, fd: int) -> None:
        return None

    def fdatasync(self, fd: int) -> None:
        return None

    def fsync_dir(self, path: str) -> None:
        return None


def build_history(state: Path, sessions: int, commits: int) -> float:
    started = time.monotonic()
    state.mkdir(parents=True, exist_ok=True)
    store, _ = open_store(UnsafeNoSyncFileSystem(), str(state))
    template = make_snapshot("x", 1024)
    done = 0
    while done < commits:
        batch = []
        for n in range(done, min(commits, done + SETUP_BATCH)):
            session_id = f"tenant-{n % sessions % 97}/session-{n % sessions:07d}"
            template["session"]["id"] = session_id
            template["session"]["config"]["name"] = f"gen-{n // sessions}"
            body = canonical_dumps(template)
            batch.append(Put("s", session_id, body, digest_bytes_of_canonical(body)))
        store.commit(batch)
        done += len(batch)
        if store.compactor.due():
            store.compact()
        elif store.checkpointing.due():
            store.checkpointing.write()
    store.close()
    os.sync()
    return time.monotonic() - started


def start_daemon(state: Path, workdir: Path) -> tuple[subprocess.Popen[bytes], float, str]:
    notify_path = str(workdir / "notify")
    if os.path.exists(notify_path):
        os.unlink(notify_path)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(120)
    sock = str(workdir / "sock")
    env = {**os.environ, "NOTIFY_SOCKET": notify_path}
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sessionstored",
            "--state-dir",
            str(state),
            "--socket",
            sock,
            "--log-level",
            "warning",
        ],
        env=env,
        stderr=open(workdir / "daemon.log", "ab"),  # noqa: SIM115 - lives with the daemon
    )
    while b"READY=1" not in notify.recv(4096):
        pass
    ready_after = time.monotonic() - started
    notify.close()
    return proc, ready_after, sock


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def save_latencies(sock: str, count: int) -> list[float]:
    body = make_snapshot("latency-probe", 4096)
    latencies = []
    with Client(sock) as client:
        for n in range(count):
            body["session"]["config"]["name"] = f"probe-{n}"
            started = time.perf_counter()
            client.save(body)
            latencies.append(time.perf_counter() - started)
    return latencies


def measure(state: Path, workdir: Path, saves: int) -> dict[str, Any]:
    proc, ready_s, sock = start_daemon(state, workdir)
    try:
        rss = rss_mib(proc.pid)
        with Client(sock) as client:
            stats = client.stats()
        latencies = save_latencies(sock, saves)
    finally:
        proc.terminate()
        proc.wait(60)
    return {
        "restart_to_ready_s": round(ready_s, 3),
        "rss_mib_after_start": round(rss, 1),
        "sessions": stats["sessions"],
        "seq": stats["seq"],
        "recovery": stats["recovery"],
        "save_p50_ms": round(statistics.median(latencies) * 1000, 3),
        "save_mean_ms": round(statistics.mean(latencies) * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale")
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=1_000_000)
    parser.add_argument("--saves", type=int, default=1000, help="saves timed per store")
    parser.add_argument("--dir", default=None, type=existing_dir)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ssscale-", dir=args.dir))
    try:
        print(
            f"scale: writing {args.commits} commits over {args.sessions} sessions (setup)",
            flush=True,
        )
        setup_s = build_history(base / "big", args.sessions, args.commits)
        print(f"scale: setup took {setup_s:.0f} s", flush=True)
        # fresh, large, fresh: the disk may still be busy after the setup's million
        # files (freed blocks are trimmed), so the large store is compared with
        # fresh runs on either side of it
        (base / "fresh").mkdir()
        fresh_before = measure(base / "fresh", base, args.saves)
        print(f"scale: fresh store {json.dumps(fresh_before)}", flush=True)
        big = measure(base / "big", base, args.saves)
        print(f"scale: large store {json.dumps(big)}", flush=True)
        shutil.rmtree(base / "fresh")
        (base / "fresh").mkdir()
        fresh = measure(base / "fresh", base, args.saves)
        print(f"scale: fresh store again {json.dumps(fresh)}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["python -m bench.scale", *sys.argv[1:]]),
        "large": big,
        "fresh": fresh,
        "fresh_before": fresh_before,
        "latency_ratio_p50": round(
            big["save_p50_ms"]
            / statistics.mean([fresh["save_p50_ms"], fresh_before["save_p50_ms"]]),
            3,
        ),
        "setup_s": round(setup_s, 1),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scale.json").write_text(json.dumps(out, indent=2))
    print(json.dumps({k: out[k] for k in ("latency_ratio_p50",)}))


if __name__ == "__main__":
    main()
