# The save rows of a run: sessionstored's on a daemon of the bench's own (with its
# CPU per save from /proc), and an anchor's, its clients in processes of their own.
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from .daemon import Daemon
from .load import Sample, run_clients, run_in_processes
from .rows import KIB, Row, format_row, row_of


def bench_daemon(
    workdir: Path, args: argparse.Namespace, name: str = "sessionstored", *extra: str
) -> list[Row]:
    rows = []
    daemon = Daemon(workdir, *extra)
    try:
        for size in args.sizes:
            for clients in args.clients:
                cpu_before = daemon.cpu_s()
                samples = [
                    run_clients(
                        daemon.socket, "save", clients, size, args.seconds, f"{size}-{clients}-{r}"
                    )
                    for r in range(args.repeats)
                ]
                cpu = daemon.cpu_s() - cpu_before
                rows.append(row_of(f"{name} save", clients, size, samples))
                saves = sum(sample.operations for sample in samples)
                rows[-1].extra["daemon_cpu_us_per_save"] = round(cpu / saves * 1e6, 1)
                print(
                    format_row(rows[-1])
                    + f"  cpu {rows[-1].extra['daemon_cpu_us_per_save']} us/save",
                    flush=True,
                )
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
        rows.append(row_of(f"{name} load", args.load_clients, 4 * KIB, samples))
        rows[-1].extra["rss_kib_after"] = daemon.rss_kib()
        print(format_row(rows[-1]), flush=True)
    finally:
        daemon.stop()
    return rows


def anchor_rows(
    name: str, target: Any, make_args: Any, args: argparse.Namespace, process_counts: list[int]
) -> list[Row]:
    rows = []
    for size in args.sizes:
        for processes in process_counts:
            samples = []
            for _ in range(args.repeats):
                deadline = time.perf_counter() + args.seconds
                results = run_in_processes(
                    target, [make_args(size, n, deadline) for n in range(processes)]
                )
                latencies = [lat for lats in results for lat in lats]
                samples.append(Sample(len(latencies), args.seconds, latencies, 0))
            rows.append(row_of(name, processes, size, samples))
            print(format_row(rows[-1]), flush=True)
    return rows
