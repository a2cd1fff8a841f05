# The pictures of a run (matplotlib), from the rows `make bench` (or
# `python -m bench.headline`) wrote to bench/results: saves a second against
# clients for sessionstored and its anchors, and the latency distribution at 1 and
# 64 clients. Written next to the JSON, and into docs/performance/, which the
# performance page shows.
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .rows import KIB

PAGE = Path(__file__).resolve().parent.parent / "docs" / "performance.md"
DOCS = PAGE.parent / "performance"
SERIES = {  # row name -> label, in the order drawn
    "sessionstored save": "sessionstored",
    "sqlite WAL sync=FULL save": "SQLite (WAL, synchronous=FULL)",
    "redis appendfsync=always save": "Redis (appendfsync always)",
}
FLOOR = "floor: append+fdatasync"
# the measurements of a part that are an anchor's, not ours
ANCHORS = (
    "one prepared upsert per save",
    "Postgres",
    "SQLAlchemy",
    "Sqlite",
    "AsyncSqlite",
    "SQLite",
    "DatabaseSessionService",
    "FileSessionManager",
)
PERCENTILES = ("p10", "p25", "p50", "p75", "p90", "p99", "p99.9")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(plt: Any, figure: Any, title: str, out: list[Path]) -> None:
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    for path in out:
        figure.savefig(path, dpi=110)
    plt.close(figure)


def _title(what: str, result: dict[str, Any]) -> str:
    return f"{what}, {result['when'][:10]}: {result['command']}"


def _pictures(result_file: Path, stem: str) -> list[Path]:
    """Where a picture goes: beside the run's JSON, and into docs/performance/."""
    DOCS.mkdir(parents=True, exist_ok=True)
    return [result_file.parent / f"{stem}.png", DOCS / f"{stem}.png"]


def _made_by(result: dict[str, Any], what: str = "") -> str:
    """A section's first line: the command and the day that made its figures."""
    made = f"Made by `{result['command']}` on {result['when'][:10]}"
    return f"{made}: {what}" if what else f"{made}."


def _replace_section(name: str, lines: list[str]) -> Path:
    """The performance page's section between its `name` markers, replaced by lines."""
    begin, end = f"<!-- {name} figures: begin -->", f"<!-- {name} figures: end -->"
    text = PAGE.read_text()
    start, stop = text.index(begin), text.index(end) + len(end)
    PAGE.write_text(text[:start] + "\n".join([begin, *lines, end]) + text[stop:])
    return PAGE


def _rows(result: dict[str, Any], name: str, size: int) -> list[dict[str, Any]]:
    found = [r for r in result["rows"] if r["name"] == name and r["size"] == size]
    return sorted(found, key=lambda r: r["clients"])


def saves_figure(result: dict[str, Any], out: list[Path]) -> None:
    plt = _pyplot()
    sizes = sorted({r["size"] for r in result["rows"] if r["name"] in SERIES})
    figure, axes = plt.subplots(1, len(sizes), figsize=(5.2 * len(sizes), 4), squeeze=False)
    floor = [r for r in result["rows"] if r["name"] == FLOOR]
    for axis, size in zip(axes[0], sizes, strict=True):
        for name, label in SERIES.items():
            rows = _rows(result, name, size)
            if rows:
                clients = [r["clients"] for r in rows]
                axis.plot(clients, [r["ops_per_s"] for r in rows], marker="o", label=label)
        if floor and size == 4 * KIB:
            axis.axhline(floor[0]["ops_per_s"], color="grey", linestyle="--",
                         label="one fdatasync per save (this disk)")  # fmt: skip
        axis.set_xscale("log", base=2)
        counts = sorted({r["clients"] for r in result["rows"] if r["name"] in SERIES})
        axis.set_xticks(counts, [str(count) for count in counts])
        axis.set_yscale("log")
        axis.set_xlabel("clients, one save in flight each")
        axis.set_ylabel("durable saves a second")
        axis.set_title(f"{size // KIB} KiB snapshots")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    _finish(plt, figure, _title("Saves a second", result), out)


def latency_figure(result: dict[str, Any], out: list[Path]) -> None:
    plt = _pyplot()
    counts = [1, 64]
    figure, axes = plt.subplots(1, len(counts), figsize=(10.4, 4), squeeze=False)
    for axis, clients in zip(axes[0], counts, strict=True):
        for name, label in SERIES.items():
            rows = [r for r in _rows(result, name, 4 * KIB) if r["clients"] == clients]
            spread = rows[0]["extra"].get("percentiles_ms") if rows else None
            if spread:
                axis.plot(PERCENTILES, [spread[p] for p in PERCENTILES], marker="o", label=label)
        axis.set_yscale("log")
        axis.set_xlabel("percentile")
        axis.set_ylabel("save latency, ms")
        axis.set_title(f"4 KiB saves, {clients} client{'s' if clients > 1 else ''}")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    _finish(plt, figure, _title("Latency", result), out)


def write_figures(result_file: Path) -> list[Path]:
    """Every picture of the run in result_file, beside it and in docs/performance/."""
    result = json.loads(result_file.read_text())
    written: list[Path] = []
    for stem, draw in (("saves", saves_figure), ("latency", latency_figure)):
        paths = _pictures(result_file, stem)
        draw(result, paths)
        written += paths
    return [*written, _replace_section("headline", headline_section(result))]


def headline_section(result: dict[str, Any]) -> list[str]:
    """The page's section for this run: the command, the date, the pictures, and the
    figures they show as a table (saves a second, p50, server CPU per save)."""
    lines = [
        f"Made by `{result['command']}` on {result['when'][:10]} "
        f"({result['machine']['cpus']} CPUs, Linux {result['machine']['kernel']}, "
        f"Python {result['machine']['python']}); every row on the same disk, clients and "
        "bytes, the systems taking turns.",
        "",
        "![Durable saves a second against clients](performance/saves.png)",
        "",
        "![Save latency at 1 and 64 clients](performance/latency.png)",
        "",
        "| size | clients | " + " | ".join(SERIES.values()) + " |",
        "|---|---|" + "---|" * len(SERIES),
    ]
    sizes = sorted({r["size"] for r in result["rows"] if r["name"] in SERIES})
    counts = sorted({r["clients"] for r in result["rows"] if r["name"] in SERIES})
    for size in sizes:
        for count in counts:
            cells = []
            for name in SERIES:
                found = [r for r in _rows(result, name, size) if r["clients"] == count]
                if not found:
                    cells.append("left out")
                    continue
                row = found[0]
                cpu = row["extra"].get("daemon_cpu_us_per_save")
                cells.append(f"{row['ops_per_s']:,.0f}/s, p50 {row['p50_ms']:.2f} ms"
                             + (f", {cpu:,.0f} µs CPU" if cpu else ""))  # fmt: skip
            lines.append(f"| {size // KIB} KiB | {count} | " + " | ".join(cells) + " |")
    floor = [r for r in result["rows"] if r["name"] == FLOOR]
    if floor:
        lines += ["", f"The one-fdatasync floor of this disk: {floor[0]['ops_per_s']:,.0f} "
                  f"appends+fdatasync a second (p50 {floor[0]['p50_ms']:.3f} ms)."]  # fmt: skip
    if result.get("redis", "included") != "included":
        lines += ["", f"Redis is left out of this run: {result['redis']}."]
    return lines


def parts_figure(title: str, figures: dict[str, Any], out: list[Path]) -> None:
    """One bar per measurement of a part (the adapters against the frameworks' own
    backends, PostgreSQL): operations a second and p50 latency, ours in one colour."""
    plt = _pyplot()
    names = [n for n, f in figures.items() if isinstance(f, dict) and "ops_per_s" in f]
    ours = [not n.startswith(ANCHORS) for n in names]
    colours = ["tab:blue" if mine else "tab:orange" for mine in ours]
    height = 0.8 + 0.32 * len(names)
    figure, (rate, latency) = plt.subplots(1, 2, figsize=(11, height), sharey=True)
    rate.barh(names, [figures[n]["ops_per_s"] for n in names], color=colours)
    rate.set_xlabel("operations a second")
    latency.barh(names, [figures[n].get("p50_ms", 0) for n in names], color=colours)
    latency.set_xlabel("p50 latency, ms")
    for axis in (rate, latency):
        axis.grid(True, axis="x", alpha=0.3)
    rate.invert_yaxis()
    from matplotlib.patches import Patch

    latency.legend(
        handles=[Patch(color="tab:blue", label="sessionstore"),
                 Patch(color="tab:orange", label="an anchor, as its docs set it up")],
        loc="best", fontsize=8,
    )  # fmt: skip
    _finish(plt, figure, title, out)


def part_section(part: str, result: dict[str, Any]) -> list[str]:
    figures = result["figures"]
    lines = [
        _made_by(result),
        "",
        f"![{part}](performance/{part}.png)",
        "",
        "| measurement | a second | p50 |",
        "|---|---|---|",
    ]
    for name, value in figures.items():
        if isinstance(value, dict) and "ops_per_s" in value:
            p50 = value.get("p50_ms")
            at = "" if p50 is None else f"{p50:.2f} ms"  # a throughput alone has none
            lines.append(f"| {name} | {value['ops_per_s']:,.0f} | {at} |")
    return lines


def write_part(part: str, result_file: Path) -> list[Path]:
    """A part's picture, beside its JSON and in docs/performance/, and its section of the
    performance page (between its markers)."""
    result = json.loads(result_file.read_text())
    paths = _pictures(result_file, part)
    parts_figure(_title(part, result), result["figures"], paths)
    return [*paths, _replace_section(part, part_section(part, result))]


ITEM_COST_POINTS = (  # (measurement key of bench/item_cost.py, label)
    ("save 4 KiB, 1 clients", "4 KiB, 1 client"),
    ("save 4 KiB, 64 clients", "4 KiB, 64 clients"),
    ("save 64 KiB, 1 clients", "64 KiB, 1 client"),
    ("save 64 KiB, 64 clients", "64 KiB, 64 clients"),
)


def item_cost_figure(title: str, figures: dict[str, Any], out: list[Path]) -> None:
    """The daemon's CPU per save and saves a second, by size and client count, with the
    compiled CBOR helper and with its pure-Python twin."""
    plt = _pyplot()
    paths = [p for p in ("compiled", "python") if isinstance(figures.get(p), dict)]
    figure, (cpu, rate) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(paths))
    labels = [label for _, label in ITEM_COST_POINTS]
    for index, path in enumerate(paths):
        at = [n + index * width for n in range(len(ITEM_COST_POINTS))]
        points = [figures[path].get(key, {}) for key, _ in ITEM_COST_POINTS]
        cpu.bar(at, [p.get("daemon_cpu_us_per_save", 0) for p in points], width, label=path)
        rate.bar(at, [p.get("saves_per_s", 0) for p in points], width, label=path)
    for axis, unit in ((cpu, "daemon CPU per save, µs"), (rate, "saves a second")):
        centres = [n + width * (len(paths) - 1) / 2 for n in range(len(labels))]
        axis.set_xticks(centres, [label.replace(", ", "\n") for label in labels])
        axis.set_ylabel(unit)
        axis.grid(True, axis="y", alpha=0.3)
        axis.legend(title="CBOR helper", fontsize=8)
    _finish(plt, figure, title, out)


def write_item_cost(result_file: Path) -> list[Path]:
    """The cost per CBOR item's picture and its section of the performance page."""
    result = json.loads(result_file.read_text())
    figures = result["figures"]
    paths = _pictures(result_file, "item_cost")
    item_cost_figure(_title("cost per CBOR item", result), figures, paths)
    lines = [
        _made_by(result),
        "",
        "![Daemon CPU per save and saves a second, by CBOR helper](performance/item_cost.png)",
        "",
        "| save | compiled helper | pure Python |",
        "|---|---|---|",
    ]
    for key, label in ITEM_COST_POINTS:
        cells = []
        for path in ("compiled", "python"):
            point = (figures.get(path) or {}).get(key)
            cells.append(f"{point['saves_per_s']:,.0f}/s, {point['daemon_cpu_us_per_save']:,.0f}"
                         " µs CPU" if point else "not measured")  # fmt: skip
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    large = [(figures.get(p) or {}).get("save 1 MiB, 1 client") for p in ("compiled", "python")]
    if all(large):
        lines.append(f"| 1 MiB of small maps, 1 client, p50 | {large[0]['p50_ms']:.1f} ms | "
                     f"{large[1]['p50_ms']:.1f} ms |")  # fmt: skip
    sqlite = figures.get("sqlite 1 MiB commit")
    if sqlite:
        lines += ["", f"SQLite's commit of the same 1 MiB snapshot: p50 {sqlite['p50_ms']:.1f} ms."]
    return [*paths, _replace_section("item_cost", lines)]


def write_floor_shapes(result_file: Path) -> list[Path]:
    """The floors of the daemon's stack against sessionstored: its section of the page."""
    result = json.loads(result_file.read_text())
    lines = [
        _made_by(
            result,
            "64 clients (or one), pre-encoded 4 KiB saves (and sessionstored's pings), CPU"
            " per request from `/proc`, by thread, of it in the kernel in brackets, and the"
            " clients' p50 round trip.",
        ),
        "",
        "| server | requests a second | p50 | CPU per request | by thread (kernel) |",
        "|---|---|---|---|---|",
    ]
    for name, point in result["figures"].items():
        kernel = point.get("threads_kernel_us", {})
        threads = ", ".join(
            f"{thread} {us:,.0f} ({kernel.get(thread, 0):,.0f})"
            for thread, us in point["threads_us"].items()
        )
        lines.append(
            f"| {name} | {point['ops_per_s']:,.0f} | {point['p50_ms']:.3f} ms"
            f" | {point['cpu_us']:,.0f} µs | {threads} |"
        )
    return [_replace_section("floor_shapes", lines)]


def write_store(result_file: Path) -> list[Path]:
    """LangGraph's long-term memory stores, side by side: their section of the page."""
    result = json.loads(result_file.read_text())
    figures = result["figures"]
    lines = [
        _made_by(result, "1 KiB values; p50 at one caller, and puts a second of 8 processes."),
        "",
        "| store | put p50 | get p50 | search p50 | puts a second, 8 processes |",
        "|---|---|---|---|---|",
    ]
    for name, point in figures.items():
        if not name.endswith(" 1 caller") or not isinstance(point, dict) or "put" not in point:
            continue
        store = name.removesuffix(" 1 caller")
        processes = figures.get(f"{store} put 8 processes", {})
        lines.append(
            f"| {store} | {point['put']['p50_ms']:.2f} ms | {point['get']['p50_ms']:.2f} ms"
            f" | {point['search']['p50_ms']:.2f} ms | {processes.get('ops_per_s', 0):,.0f} |"
        )
    semantic = {n: p for n, p in figures.items() if n.endswith("semantic search")}
    if semantic:
        lines += ["", "| semantic search | items | p50 |", "|---|---|---|"]
        for name, point in semantic.items():
            if "search" in point:
                lines.append(f"| {name.removesuffix(' semantic search')} | {point['items']:,}"
                             f" | {point['search']['p50_ms']:.1f} ms |")  # fmt: skip
            else:
                why = point.get("skipped", point) if isinstance(point, dict) else point
                lines.append(f"| {name.removesuffix(' semantic search')} | | {why} |")
    return [_replace_section("store", lines)]


def write_pg_statements(result_file: Path) -> list[Path]:
    """A LangGraph put on PostgreSQL, statement by statement: its section of the page."""
    result = json.loads(result_file.read_text())
    lines = [
        _made_by(
            result,
            "one thread putting checkpoints; per put, the statements PostgreSQL ran"
            " (`pg_stat_statements`, execution time, and planning apart; a function's"
            " statements are listed too, and counted in its time), and the daemon's CPU"
            " by thread.",
        ),
        "",
    ]
    for saver, point in result["figures"].items():
        if not isinstance(point, dict):
            lines += [f"{saver}: {point}", ""]
            continue
        lines.append(f"**{saver}**: {point['ops_per_s']:,.0f} puts a second, p50"
                     f" {point['p50_ms']:.2f} ms.")  # fmt: skip
        cpu = point.get("daemon_cpu_us_per_put")
        if cpu:
            threads = ", ".join(f"{name} {us:,.0f}" for name, us in cpu.items())
            trips = point["batch_transactions"].get("round_trips_per_batch_mean")
            lines.append(f"Daemon CPU per put, µs: {threads}; round trips per batch: {trips}.")
        lines += [
            "",
            "| statement | calls a put | µs a call | µs a put | rows a call | plans a call"
            " | µs a plan |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in point["statements"]:
            text = row["statement"].replace("|", "\\|")
            lines.append(
                f"| `{text}` | {row['calls_per_put']} | {row['exec_us_per_call']}"
                f" | {row['exec_us_per_put']} | {row['rows_per_call']}"
                f" | {row['plans_per_call']} | {row['plan_us_per_plan']} |"
            )
        lines.append("")
    return [_replace_section("pg_statements", lines)]


if __name__ == "__main__":  # python -m bench.plots RESULT.json: the headline pictures again
    for path in write_figures(Path(sys.argv[1])):
        print(f"plots: wrote {path}")
