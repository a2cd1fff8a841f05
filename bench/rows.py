# One measured line of a run (Row): a workload at a client count and a size, its
# operations a second and latency percentiles, and how it prints.
from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .load import Sample

KIB = 1024
RESULTS = Path(__file__).resolve().parent / "results"  # where a run writes its JSON
SPREAD = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999)  # the latency distribution kept per row


@dataclass
class Row:
    name: str
    clients: int
    size: int
    ops_per_s: float
    p50_ms: float
    p99_ms: float
    extra: dict[str, Any] = field(default_factory=dict)


def percentile_ms(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def row_of(name: str, clients: int, size: int, samples: list[Sample]) -> Row:
    rates = [s.operations / s.elapsed_s for s in samples]
    latencies = [lat for s in samples for lat in s.latencies_s]
    errors = sum(s.errors for s in samples)
    if errors:
        raise SystemExit(f"bench: {name} had {errors} failed requests")
    row = Row(
        name,
        clients,
        size,
        statistics.median(rates),
        percentile_ms(latencies, 0.5),
        percentile_ms(latencies, 0.99),
    )
    row.extra["percentiles_ms"] = {
        f"p{q * 100:g}": round(percentile_ms(latencies, q), 3) for q in SPREAD
    }
    return row


def format_row(row: Row) -> str:
    return (
        f"{row.name:<28} {row.clients:>4} {row.size // KIB:>4} KiB "
        f"{row.ops_per_s:>10.0f}/s  p50 {row.p50_ms:>7.2f} ms  p99 {row.p99_ms:>7.2f} ms"
    )


def run_header(command: str) -> dict[str, Any]:
    """What every result file of a run starts with: when, the command, the machine."""
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": command,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kernel": platform.release(),
        },
    }
