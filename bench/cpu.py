# The daemon's CPU per request against the floor of its own stack, in one run:
# `ping`, a 1 KiB `kv` put, a 4 KiB save and a 64 KiB save, at 1 and at 64
# clients, sent to sessionstored and to bench/floor_server.py (a bare trio
# server of the same shape with no store); beside them, the CPU of one
# append + fdatasync alone. The servers' CPU is read per thread from
# /proc/PID/task (user + system), so the event loop, the writer's I/O thread
# and the rest show apart. Clients send pre-encoded requests here: what is
# measured is the server's side (the save throughput rows of `make bench`
# encode on the client, as users do).
#
#   python -m bench.cpu [--dir DIR] [--seconds S]
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import cbor2

from bench.options import existing_dir
from sessionstore.client import Client
from sessionstore.wire.protocol import RawCBOR

from .load import Sample, run_fixed
from .workload import snapshot_bytes

KIB = 1024
CLIENT_COUNTS = (1, 64)
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
KV_VALUE = {"note": "n" * 1000}  # canonical CBOR of about 1 KiB
FLOOR_COUNT = 2000


def _raw(encoder: Any, value: Any) -> None:
    encoder.write(value.data)


def request_for(name: str, client: int) -> bytes:
    if name == "ping":
        return cbor2.dumps({"op": "ping"})
    if name == "kv put 1 KiB":
        request = {"op": "checkpoint_put", "kind": "kv", "key": f"k{client}", "value": KV_VALUE}
        return cbor2.dumps(request, canonical=True)
    size = {"save 4 KiB": 4 * KIB, "save 64 KiB": 64 * KIB}[name]
    body = snapshot_bytes(f"cpu/{client}", size)
    return cbor2.dumps({"op": "save", "snapshot": RawCBOR(body)}, default=_raw)


REQUESTS = ("ping", "kv put 1 KiB", "save 4 KiB", "save 64 KiB")


def thread_cpu_s(pid: int) -> tuple[dict[str, float], dict[str, float]]:
    """CPU seconds so far per thread name (threads of one name summed): user plus system,
    and the system (kernel) part alone."""
    total: dict[str, float] = defaultdict(float)
    kernel: dict[str, float] = defaultdict(float)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                comm, rest = stat.read().rsplit(")", 1)
        except FileNotFoundError:  # ended meanwhile
            continue
        name = comm.split("(", 1)[1]
        fields = rest.split()
        total[name] += (int(fields[11]) + int(fields[12])) / TICKS_PER_S
        kernel[name] += int(fields[12]) / TICKS_PER_S
    return dict(total), dict(kernel)


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds so far of a process, of its children that ended (waited for), and of
    those still running: a PostgreSQL server's, given its postmaster."""

    def fields_of(stat_path: str) -> list[str] | None:
        try:
            with open(stat_path) as stat:
                return stat.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            return None

    own = fields_of(f"/proc/{pid}/stat")
    if own is None:
        return 0.0
    ticks = sum(int(field) for field in own[11:15])  # utime, stime, cutime, cstime
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            child = fields_of(f"/proc/{entry}/stat")
            if child is not None and int(child[1]) == pid:
                ticks += int(child[11]) + int(child[12])
    return ticks / TICKS_PER_S


def machine_busy_s() -> float:
    """CPU seconds so far that the machine's cores spent on anything but idle and
    waiting for I/O (/proc/stat)."""
    with open("/proc/stat") as stat:
        ticks = [int(value) for value in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICKS_PER_S


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after}


def _per_operation_us(cpu_s: dict[str, float], operations: int) -> dict[str, float]:
    return {
        thread: round(cpu / max(1, operations) * 1e6, 1)
        for thread, cpu in sorted(cpu_s.items(), key=lambda kv: -kv[1])
        if cpu > 0
    }


class FloorServer:
    """A bare server of bench/ in a process of its own, `python -m MODULE [ARGS] SOCKET
    WORKDIR`, started once it prints `ready`: bench.floor_server by default."""

    def __init__(self, workdir: Path, module: str = "bench.floor_server", *args: str) -> None:
        self.socket = str(workdir / "floor.sock")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args, self.socket, str(workdir)],
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            raise SystemExit(f"bench: {module} {' '.join(args)} did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def measure(pid: int, socket_path: str, name: str, clients: int, seconds: float) -> dict[str, Any]:
    requests = [request_for(name, n) for n in range(clients)]
    run_fixed(socket_path, requests, 0.5)  # warm up: connections, caches, the first segment
    before, kernel_before = thread_cpu_s(pid)
    sample: Sample = run_fixed(socket_path, requests, seconds)
    after, kernel_after = thread_cpu_s(pid)
    threads, kernel = _delta(before, after), _delta(kernel_before, kernel_after)
    if sample.errors:
        raise SystemExit(f"bench: {sample.errors} failed requests ({name}, {clients} clients)")
    total = sum(threads.values())
    ordered = sorted(sample.latencies_s)
    return {
        "requests": sample.operations,
        "ops_per_s": round(sample.operations / seconds, 1),
        "p50_ms": round(ordered[len(ordered) // 2] * 1000, 3) if ordered else None,
        "cpu_us": round(total / max(1, sample.operations) * 1e6, 1),
        "threads_us": _per_operation_us(threads, sample.operations),
        "threads_kernel_us": _per_operation_us(kernel, sample.operations),
    }


def append_fdatasync_cpu(directory: str, body: bytes, count: int = FLOOR_COUNT) -> dict[str, float]:
    """One pwrite + fdatasync into a preallocated file: CPU and wall time per call."""
    path = os.path.join(directory, "append-cpu.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        page = bytes(4096)
        for _ in range(-(-len(body) * count // len(page))):
            os.write(fd, page)
        os.fsync(fd)
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        for n in range(count):
            os.pwrite(fd, body, n * len(body))
            os.fdatasync(fd)
        cpu = time.process_time() - cpu_before
        wall = time.perf_counter() - wall_before
    finally:
        os.close(fd)
    return {"cpu_us": round(cpu / count * 1e6, 1), "wall_us": round(wall / count * 1e6, 1)}


def _batches(socket_path: str) -> tuple[int, int]:
    """The daemon's batches so far, and how many of them the event loop waited for
    itself (a lone save's commit, short enough not to hand to trio)."""
    with Client(socket_path) as client:
        stats = client.stats()
    return stats["batches"], stats["batches_waited_on_loop"]


def _measure_all(
    label: str, pid: int, socket_path: str, seconds: float, results: dict[str, Any]
) -> None:
    daemon = label == "sessionstored"
    for name in REQUESTS:
        for clients in CLIENT_COUNTS:
            before = _batches(socket_path) if daemon else (0, 0)
            figures = measure(pid, socket_path, name, clients, seconds)
            if daemon:
                (batches_after, on_loop_after), (batches_before, on_loop_before) = (
                    _batches(socket_path),
                    before,
                )
                batches, on_loop = batches_after - batches_before, on_loop_after - on_loop_before
                figures["batches_waited_on_loop_share"] = round(on_loop / max(1, batches), 3)
            floor = results.get(f"floor server: {name}, {clients} clients")
            if floor is not None:
                figures["x_floor_server"] = round(figures["cpu_us"] / floor["cpu_us"], 2)
            results[f"{label}: {name}, {clients} clients"] = figures
            print(f"cpu: {label}: {name}, {clients} clients: {json.dumps(figures)}", flush=True)


def run(daemon_factory: Any, workdir: Path, seconds: float) -> dict[str, Any]:
    results: dict[str, Any] = {
        "append+fdatasync 4 KiB": append_fdatasync_cpu(str(workdir), snapshot_bytes("f", 4 * KIB))
    }
    # the floor first: the daemon's figures are divided by its
    for label, start in (("floor server", FloorServer), ("sessionstored", daemon_factory)):
        server_dir = workdir / label.replace(" ", "-")
        server_dir.mkdir()
        server = start(server_dir)
        try:
            _measure_all(label, server.proc.pid, server.socket, seconds, results)
        finally:
            server.stop()
    return results


def main() -> None:
    from .daemon import Daemon

    parser = argparse.ArgumentParser(prog="python -m bench.cpu")
    parser.add_argument(
        "--dir", default=None, type=existing_dir, help="where to put the stores (a real disk)"
    )
    parser.add_argument("--seconds", type=float, default=3.0)
    options = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ssbench-", dir=options.dir))
    try:
        run(Daemon, base, options.seconds)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
