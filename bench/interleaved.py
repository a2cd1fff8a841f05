# The save rows of sessionstored and its anchors, taken in turns: for each size
# and client count, repeat 1 of every system, then repeat 2 of every system,
# and so on, each server running from the start to the end. A shared machine's
# speed drifts by tens of percent over minutes; taken one system after another,
# the drift lands on whichever system ran in the slow minutes, and a ratio
# between them measures the machine. In turns, every system meets the same
# minutes. Each row is the median of its repeats, with its server's CPU per
# save from /proc (none for SQLite: it runs in the clients' processes).
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import anchors
from .daemon import Daemon
from .load import Sample, run_clients, run_in_processes
from .redis_anchor import REDIS_ROW, RedisServer, run_redis_clients
from .rows import Row, format_row, row_of
from .workload import make_snapshot

MakeArgs = Callable[[int, int, float], tuple[Any, ...]]  # (size, client, deadline) -> args


@dataclass
class System:
    name: str
    sample: Callable[[int, int, float, str], Sample]  # (size, clients, seconds, tag)
    cpu_s: Callable[[], float] | None  # the server's CPU so far


def daemon_system(name: str, daemon: Daemon) -> System:
    def sample(size: int, clients: int, seconds: float, tag: str) -> Sample:
        return run_clients(daemon.socket, "save", clients, size, seconds, f"{name}/{tag}")

    return System(f"{name} save", sample, daemon.cpu_s)


def redis_system(server: RedisServer) -> System:
    def sample(size: int, clients: int, seconds: float, tag: str) -> Sample:
        return run_redis_clients(server.socket, clients, size, seconds, tag)

    return System(REDIS_ROW, sample, server.cpu_s)


def process_system(name: str, target: Callable[..., list[float]], make_args: MakeArgs) -> System:
    """A store that runs in its clients' processes (SQLite, the naive upstream store): one
    process a client, each running target(*make_args(size, n, deadline)), which returns
    its latencies."""

    def sample(size: int, clients: int, seconds: float, tag: str) -> Sample:
        deadline = time.perf_counter() + seconds
        arguments = [make_args(size, n, deadline) for n in range(clients)]
        latencies = [lat for lats in run_in_processes(target, arguments) for lat in lats]
        return Sample(len(latencies), seconds, latencies, 0)

    return System(name, sample, None)


def sqlite_system(db: str) -> System:
    return process_system(
        "sqlite WAL sync=FULL save",
        anchors.sqlite_saves,
        lambda size, n, deadline: (db, f"s{n}", make_snapshot(f"s{n}", size), deadline),
    )


def interleaved_rows(
    systems: Sequence[System],
    sizes: Sequence[int],
    clients: Sequence[int],
    seconds: float,
    repeats: int,
) -> list[Row]:
    rows: list[Row] = []
    for size in sizes:
        for count in clients:
            samples: dict[str, list[Sample]] = {system.name: [] for system in systems}
            cpu: dict[str, float] = dict.fromkeys(samples, 0.0)
            for repeat in range(repeats):
                for system in systems:
                    before = system.cpu_s() if system.cpu_s else 0.0
                    samples[system.name].append(
                        system.sample(size, count, seconds, f"{size}-{count}-{repeat}")
                    )
                    if system.cpu_s:
                        cpu[system.name] += system.cpu_s() - before
            for system in systems:
                row = row_of(system.name, count, size, samples[system.name])
                cpu_text = ""
                if system.cpu_s:
                    saves = sum(sample.operations for sample in samples[system.name])
                    per_save = round(cpu[system.name] / saves * 1e6, 1)
                    row.extra["daemon_cpu_us_per_save"] = per_save
                    cpu_text = f"  cpu {per_save} us/save"
                rows.append(row)
                print(format_row(row) + cpu_text, flush=True)
    return rows
