# `sessionstore top`: a live view of one daemon, refreshed from `stats` every
# interval: requests per second and the p50 and p99 of the recent ones, by op;
# the recent batches' size and fdatasync; connections, watchers and the log.
# On a terminal each view replaces the last; piped, views follow each other.
# Ctrl-C ends it, with status 0. The table shows the busiest MAX_OP_ROWS ops, each
# name printable and cut to its column, whatever names the daemon reports.
from __future__ import annotations

import time
from typing import Any, TextIO

from ..client import Client

CLEAR = "\x1b[H\x1b[2J"
MAX_OP_ROWS = 40  # more than a daemon has ops (and its `(unknown)` and `(none)`)
OP_COLUMN = 18


def render(stats: dict[str, Any], rates: dict[str, float]) -> str:
    batches = stats.get("recent_batches") or {}
    lines = [
        f"sessionstored  seq {stats.get('seq')}  sessions {stats.get('sessions')}  "
        f"uptime {stats.get('uptime_s', 0):.0f} s",
        f"connections {stats.get('connections')}  watchers {stats.get('watchers')} "
        f"(lagged {stats.get('watchers_cut_off')}, dropped {stats.get('watchers_dropped')})  "
        f"log {stats.get('wal_bytes', 0) / 1e6:.1f} MB",
        f"batches: {batches.get('jobs_per_batch_mean', '-')} writes each, fdatasync p50 "
        f"{batches.get('fdatasync_p50_ms', '-')} ms, p99 {batches.get('fdatasync_p99_ms', '-')} ms",
        "",
        f"{'op':<{OP_COLUMN}}{'ops/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>10}",
    ]
    requests: dict[str, dict[str, Any]] = stats.get("requests") or {}
    busiest = sorted(requests, key=lambda name: (-rates.get(name, 0.0), name))
    for op in busiest[:MAX_OP_ROWS]:
        figures = requests[op]
        lines.append(
            f"{_shown(op):<{OP_COLUMN}}{rates.get(op, 0.0):>10.1f}"
            f"{figures.get('p50_ms', 0):>10.3f}{figures.get('p99_ms', 0):>10.3f}"
            f"{figures.get('errors', 0):>10}"
        )
    if len(busiest) > MAX_OP_ROWS:
        lines.append(f"... {len(busiest) - MAX_OP_ROWS} more ops")
    return "\n".join(lines) + "\n"


def _shown(op: str) -> str:
    """The name as the table shows it: nothing the terminal would act on, and room
    left for the column after it."""
    return "".join(char if char.isprintable() else "?" for char in op)[: OP_COLUMN - 1]


def run(client: Client, out: TextIO, interval_s: float, count: int | None) -> int:
    """count: views to show (None: until Ctrl-C). The view's own `stats` is not counted."""
    previous: tuple[float, dict[str, dict[str, Any]]] | None = None
    clear = CLEAR if out.isatty() else ""
    shown = 0
    try:
        while count is None or shown < count:
            stats = client.call("stats")  # every field the engine reports
            now = time.monotonic()
            requests = stats.get("requests") or {}
            rates: dict[str, float] = {}
            if previous is not None:
                elapsed = max(now - previous[0], 1e-9)
                for op, figures in requests.items():
                    before = previous[1].get(op, {}).get("count", 0)
                    own = 1 if op == "stats" else 0  # this view's own request
                    rates[op] = max(0, figures.get("count", 0) - before - own) / elapsed
            out.write(clear + render(stats, rates) + ("" if clear else "\n"))
            out.flush()
            previous = (now, requests)
            shown += 1
            if count is None or shown < count:
                time.sleep(interval_s)
    except KeyboardInterrupt:
        out.write("\n")
        out.flush()
    return 0
