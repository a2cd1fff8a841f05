# `python -m bench.headline`: the headline figures alone, in a few minutes: durable
# saves a second and their latency for sessionstored against SQLite (WAL,
# synchronous=FULL), Redis (appendfsync always) and the one-fdatasync floor, on the
# same clients and bytes, at 4 and 64 KiB and 1, 8 and 64 clients. Writes
# bench/results/headline.json and the pictures (bench/plots.py). `make bench` draws
# the same pictures from its full run.
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench.options import existing_dir

from . import anchors, redis_anchor
from .plots import write_figures
from .rows import KIB, RESULTS, Row, percentile_ms, run_header
from .saves import save_rows
from .workload import snapshot_bytes


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.headline")
    parser.add_argument(
        "--dir", default=None, type=existing_dir, help="where to put the stores (a real disk)"
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    args.sizes, args.clients, args.load_clients = [4 * KIB, 64 * KIB], [1, 8, 64], 16
    base = Path(tempfile.mkdtemp(prefix="ssbench-", dir=args.dir))
    try:
        appends = anchors.append_floor(str(base), snapshot_bytes("floor", 4 * KIB), 2000)
        rows = [
            Row("floor: append+fdatasync", 1, 4 * KIB, 1 / statistics.median(appends),
                percentile_ms(appends, 0.5), percentile_ms(appends, 0.99))
        ]  # fmt: skip
        rows += save_rows(base, args, sealed=False)
    finally:
        shutil.rmtree(base, ignore_errors=True)  # the stores: hundreds of MB a run
    RESULTS.mkdir(exist_ok=True)
    result_file = RESULTS / "headline.json"
    command = " ".join(["python -m bench.headline", *sys.argv[1:]])
    missing = redis_anchor.available()
    result = {**run_header(command), "redis": missing or "included"}
    result_file.write_text(json.dumps({**result, "rows": [row.__dict__ for row in rows]}, indent=2))
    for path in write_figures(result_file):
        print(f"bench: wrote {path}", flush=True)


if __name__ == "__main__":
    main()
