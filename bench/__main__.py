# `make bench` (python -m bench): this daemon (plain, and sealed with a key),
# SQLite (WAL, synchronous=FULL) and the naive upstream algorithm on the same
# bytes, in one run on one disk.
# Prints a table and writes bench/results/latest.json. `--quick` is the short
# run that the README's foundation figures come from.
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.options import existing_dir

from . import (
    adapters,
    agent_frameworks,
    anchors,
    backup,
    cpu,
    expiry,
    floor_shapes,
    generations,
    item_cost,
    loop_stall,
    metrics_cost,
    pg_statements,
    postgres,
    space,
    store,
)
from .daemon import Daemon
from .frontend_cost import frontend_cost
from .load import run_clients, run_in_processes
from .plots import (
    write_figures,
    write_floor_shapes,
    write_item_cost,
    write_part,
    write_pg_statements,
    write_store,
)
from .rows import KIB, RESULTS, Row, format_row, percentile_ms, run_header
from .saves import anchor_rows, save_rows
from .sealing_cost import sealing_cost
from .targets import best_row, fast_path_targets, find_row, rate_of, targets
from .workload import make_snapshot, snapshot_bytes


def rss_soak(workdir: Path, seconds: float, clients: int = 64) -> dict[str, Any]:
    """64 clients saving for `seconds`, the daemon's RSS sampled every 10 s."""
    import threading

    daemon = Daemon(workdir)
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        started = time.monotonic()
        while not done.wait(10):
            samples.append((round(time.monotonic() - started), daemon.rss_kib()))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = run_clients(daemon.socket, "save", clients, 4 * KIB, seconds, "soak")
    finally:
        done.set()
        sampler.join()
        daemon.stop()
    rss = [kib for _, kib in samples]
    return {
        "seconds": seconds,
        "clients": clients,
        "saves": result.operations,
        "rss_kib_samples": samples,
        "rss_kib_first": rss[0] if rss else None,
        "rss_kib_last": rss[-1] if rss else None,
        "rss_kib_max": max(rss) if rss else None,
    }


def _cpu_costs(what: str, measure: Callable[[int], dict[str, float]]) -> dict[str, Any]:
    """In-process costs at 4 and 64 KiB, printed as `cpu: ...` lines."""
    costs = {f"{kib}KiB": measure(kib * KIB) for kib in (4, 64)}
    for size, cost in costs.items():
        figures = ", ".join(f"{name} {value:.1f}" for name, value in cost.items())
        print(f"cpu: {what.format(size)}: {figures}", flush=True)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="short run: 4 KiB, 1 and 64 clients")
    parser.add_argument(
        "--dir", default=None, type=existing_dir, help="where to put the stores (a real disk)"
    )
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--soak", type=float, default=0, help="also run the 64-client RSS soak")
    parser.add_argument(
        "--space-rounds",
        type=int,
        default=None,
        help="rewrite rounds of the space run (default 100; 0 with --quick)",
    )
    parser.add_argument("--space-sessions", type=int, default=10_000)
    parser.add_argument(
        "--expiry-documents",
        type=int,
        default=None,
        help="documents expiring at once in the sweep run (1,000,000; 100,000 with --quick)",
    )
    parser.add_argument(
        "--semantic-items",
        type=int,
        default=None,
        help="items of the semantic-search namespace (100,000; 10,000 with --quick)",
    )
    args = parser.parse_args()
    if args.semantic_items is None:
        args.semantic_items = 10_000 if args.quick else 100_000
    args.sizes = [4 * KIB] if args.quick else [4 * KIB, 64 * KIB]
    args.clients = [1, 64] if args.quick else [1, 8, 64]
    args.seconds = args.seconds or (3.0 if args.quick else 5.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.load_clients = 16
    if args.space_rounds is None:
        args.space_rounds = 0 if args.quick else 100
    if args.expiry_documents is None:
        args.expiry_documents = 100_000 if args.quick else 1_000_000
    base = Path(tempfile.mkdtemp(prefix="ssbench-", dir=args.dir))
    print(
        f"bench: stores under {base}; {args.seconds:.0f} s per point, median of {args.repeats}",
        flush=True,
    )
    rows: list[Row] = []
    try:
        floor_dir = base / "floor"
        floor_dir.mkdir()
        fsyncs = anchors.fsync_floor(str(floor_dir), 200)
        renames = anchors.rename_floor(str(floor_dir), snapshot_bytes("floor", 4 * KIB), 200)
        appends = anchors.append_floor(str(floor_dir), snapshot_bytes("floor", 4 * KIB), 2000)
        rows.append(
            Row(
                "floor: fsync",
                1,
                64,
                1 / statistics.median(fsyncs),
                percentile_ms(fsyncs, 0.5),
                percentile_ms(fsyncs, 0.99),
            )
        )
        rows.append(
            Row(
                "floor: append+fdatasync",
                1,
                4 * KIB,
                1 / statistics.median(appends),
                percentile_ms(appends, 0.5),
                percentile_ms(appends, 0.99),
            )
        )
        rows.append(
            Row(
                "floor: temp+fsync+rename+dir",
                1,
                4 * KIB,
                1 / statistics.median(renames),
                percentile_ms(renames, 0.5),
                percentile_ms(renames, 0.99),
            )
        )
        for row in rows:
            print(format_row(row), flush=True)
        sealing = _cpu_costs("sealing one {} document", sealing_cost)
        frontend = _cpu_costs("one {} save before the disk", frontend_cost)

        saves_dir = base / "saves"
        saves_dir.mkdir()
        rows += save_rows(saves_dir, args, sealed=True)
        db = str(saves_dir / "sessions.db")  # the SQLite anchor's, with its 64 sessions
        ids = [f"s{n}" for n in range(64)]
        deadline = time.perf_counter() + args.seconds
        loads = run_in_processes(anchors.sqlite_loads, [(db, ids, deadline)] * args.load_clients)
        rows.append(
            Row(
                "sqlite load",
                args.load_clients,
                4 * KIB,
                sum(loads) / args.seconds,
                float("nan"),
                float("nan"),
            )
        )
        print(format_row(rows[-1]), flush=True)

        naive_dir = base / "naive"
        naive_dir.mkdir()
        rows += anchor_rows(
            "naive upstream save",
            anchors.naive_saves,
            lambda size, n, deadline: (
                str(naive_dir),
                f"s{n}",
                make_snapshot(f"s{n}", size),
                deadline,
            ),
            args,
            [1, 64] if args.quick else [1, 8, 64],
        )
        (base / "cpu").mkdir()
        cpu_per_request = cpu.run(Daemon, base / "cpu", args.seconds)
        (base / "floor_shapes").mkdir()
        shapes = floor_shapes.run(Daemon, base / "floor_shapes", args.seconds)
        (base / "item_cost").mkdir()
        per_item = item_cost.run(base / "item_cost", args.seconds)
        (base / "adapters").mkdir()
        frameworks = adapters.main(Daemon, base / "adapters", args.seconds)
        for name, figures in frameworks.items():
            print(f"adapters: {name}: {json.dumps(figures)}", flush=True)
        (base / "agent_frameworks").mkdir()
        adk_strands = agent_frameworks.run(Daemon, base / "agent_frameworks", args.seconds)
        for name, figures in adk_strands.items():
            print(f"adk and strands: {name}: {json.dumps(figures)}", flush=True)
        (base / "store").mkdir()
        memory_store = store.run(Daemon, base / "store", args.seconds, args.semantic_items)
        for name, figures in memory_store.items():
            print(f"store: {name}: {json.dumps(figures)}", flush=True)
        (base / "postgres").mkdir()
        on_postgres = postgres.run(Daemon, base / "postgres", args.seconds)
        for name, figures in on_postgres.items():
            print(f"postgresql: {name}: {json.dumps(figures)}", flush=True)
        (base / "pg_statements").mkdir()
        statements = pg_statements.run(Daemon, base / "pg_statements", args.seconds)
        print(f"postgresql statements: {json.dumps(statements)}", flush=True)
        (base / "stall").mkdir()
        stall = loop_stall.run(Daemon, base / "stall", quick=args.quick)
        for name, figures in stall.items():
            print(f"loop stall: {name}: {json.dumps(figures)}", flush=True)
        (base / "backup").mkdir()
        documents = 5_000 if args.quick else 20_000
        backup_figures = backup.run(Daemon, base / "backup", documents)
        for name, figures in backup_figures.items():
            print(f"backup: {name}: {json.dumps(figures)}", flush=True)
        (base / "expiry").mkdir()
        sweep = expiry.run(Daemon, base / "expiry", args.expiry_documents)
        print(f"expiry sweep: {json.dumps(sweep)}", flush=True)
        (base / "metrics").mkdir()
        counting = metrics_cost.run(Daemon, base / "metrics", args.seconds)
        print(f"metrics: {json.dumps(counting)}", flush=True)
        (base / "generations").mkdir()
        kept = generations.run(Daemon, base / "generations", args.seconds)
        for name, figures in kept.items():
            print(f"generations: {name}: {json.dumps(figures)}", flush=True)
        space_result = None
        if args.space_rounds:
            (base / "space").mkdir()
            space_result = space.run(Daemon, base / "space", args.space_sessions, args.space_rounds)
            print(f"space: {json.dumps(space_result)}", flush=True)
        soak = None
        if args.soak:
            (base / "soak").mkdir()
            soak = rss_soak(base / "soak", args.soak)
            print(f"soak: {json.dumps({k: v for k, v in soak.items() if k != 'rss_kib_samples'})}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    out = {
        **run_header(" ".join(["python -m bench", *sys.argv[1:]])),
        "rows": [row.__dict__ for row in rows],
        "soak": soak,
        "space": space_result,
        "sealing_cpu_us": sealing,
        "frontend_cpu_us": frontend,
        "loop_stall": stall,
        "backup": backup_figures,
        "expiry_sweep": sweep,
        "generations": kept,
        "metrics_cost": counting,
        "adapters": frameworks,
        "agent_frameworks": adk_strands,
        "store": memory_store,
        "postgresql": on_postgres,
        "pg_statements": statements,
        "cpu_per_request": cpu_per_request,
        "floor_shapes": shapes,
        "targets": targets(rows),
        "fast_path_targets": fast_path_targets(rows, cpu_per_request, frameworks, on_postgres),
        "item_cost": per_item,
        "item_cost_targets": item_cost.targets(
            per_item,
            rate_of(find_row(rows, "sqlite WAL sync=FULL save", 64, 64 * KIB)),
            rate_of(best_row(rows, "sqlite WAL sync=FULL save", 4 * KIB)),
        ),
    }
    (RESULTS / "latest.json").write_text(json.dumps(out, indent=2))
    for line, value in out["targets"].items():
        print(f"target: {line}: {value}")
    print("fast path, this run:")
    for line, (value, judged) in out["fast_path_targets"].items():
        print(f"  {line:<70} {value:>8}  {judged}")
    print("cost per CBOR item, both helper paths, this run:")
    for line, (value, judged) in out["item_cost_targets"].items():
        print(f"  {line:<70} {value:>8}  {judged}")
    print(f"bench: wrote {RESULTS / 'latest.json'}")
    for path in write_figures(RESULTS / "latest.json"):
        print(f"bench: wrote {path}")
    parts = (("adapters", "adapters"), ("agent_frameworks", "agent_frameworks"),
             ("postgres", "postgresql"))  # fmt: skip
    for part, key in parts:
        if out[key]:  # each part's own picture and section, from this run
            part_file = RESULTS / f"{part}.json"
            part_file.write_text(json.dumps({**out, "figures": out[key]}))
            for path in write_part(part, part_file):
                print(f"bench: wrote {path}")
    store_file = RESULTS / "store.json"
    store_file.write_text(json.dumps({**out, "figures": out["store"]}))
    for path in write_store(store_file):
        print(f"bench: wrote {path}")
    statements_file = RESULTS / "pg_statements.json"
    statements_file.write_text(json.dumps({**out, "figures": out["pg_statements"]}))
    for path in write_pg_statements(statements_file):
        print(f"bench: wrote {path}")
    shapes_file = RESULTS / "floor_shapes.json"
    shapes_file.write_text(json.dumps({**out, "figures": out["floor_shapes"]}))
    for path in write_floor_shapes(shapes_file):
        print(f"bench: wrote {path}")
    if out["item_cost"]:
        cost_file = RESULTS / "item_cost.json"
        cost_file.write_text(json.dumps({**out, "figures": out["item_cost"]}))
        for path in write_item_cost(cost_file):
            print(f"bench: wrote {path}")


if __name__ == "__main__":
    main()
