# The targets a run is held to, each a ratio of two figures of the same run.
from __future__ import annotations

from typing import Any

from .rows import KIB, Row
from .verdicts import verdict


def fast_path_targets(
    rows: list[Row], cpu_figures: dict[str, Any], frameworks: dict[str, Any], pg: dict[str, Any]
) -> dict[str, tuple[Any, str]]:
    """The fast path's targets, each as (figure of this run, met or missed)."""

    def ours(name: str, clients: int) -> dict[str, Any]:
        figures: dict[str, Any] = cpu_figures.get(f"sessionstored: {name}, {clients} clients", {})
        return figures

    sqlite = "sqlite WAL sync=FULL save"
    best_sqlite = best_row(rows, sqlite, 4 * KIB)
    ours64 = find_row(rows, "sessionstored save", 64, 4 * KIB)
    ours1 = find_row(rows, "sessionstored save", 1, 4 * KIB)
    sqlite1 = find_row(rows, sqlite, 1, 4 * KIB)
    adapter = frameworks.get("targets", {})
    on_pg = pg.get("targets", {})
    out = {
        "ping, 1 client: daemon CPU x the floor server's": verdict(
            ours("ping", 1).get("x_floor_server"), 1.5, True
        ),
        "ping, 64 clients: daemon CPU x the floor server's": verdict(
            ours("ping", 64).get("x_floor_server"), 1.5, True
        ),
        "1 KiB kv put, 64 clients: daemon CPU, us": verdict(
            ours("kv put 1 KiB", 64).get("cpu_us"), 60, True
        ),
        "1 KiB kv put, 64 clients: daemon CPU x the floor server's": verdict(
            ours("kv put 1 KiB", 64).get("x_floor_server"), 1.5, True
        ),
        "4 KiB save, 64 clients: daemon CPU x the floor server's": verdict(
            ours("save 4 KiB", 64).get("x_floor_server"), 1.5, True
        ),
        "4 KiB save, 64 clients: saves/s x the best SQLite setup": verdict(
            round(ours64.ops_per_s / best_sqlite.ops_per_s, 2) if ours64 and best_sqlite else None,
            1,
            False,
        ),
        "4 KiB save, 1 client: p50 x SQLite's one commit": verdict(
            round(ours1.p50_ms / sqlite1.p50_ms, 2) if ours1 and sqlite1 else None, 2, True
        ),
        "LangGraph saver put p50 x SqliteSaver.put": verdict(
            adapter.get("saver put p50: x SqliteSaver.put (<= 2)"), 2, True
        ),
        "LangGraph saver, 8 processes x SqliteSaver's total": verdict(
            adapter.get("8 processes: x SqliteSaver puts/s (>= 2)"), 2, False
        ),
        "Agents add_items p50 x SQLiteSession's": verdict(
            adapter.get("add_items p50: x SQLiteSession (<= 1)"), 1, True
        ),
        "PostgreSQL, 64 clients x one prepared autocommit upsert per save (64 psycopg)": verdict(
            on_pg.get("64 clients, one daemon: x one prepared upsert per save (>= 1.5)"), 1.5, False
        ),
        "PostgreSQL, 64 clients: three daemons x one": verdict(
            on_pg.get("64 clients, three daemons: x one daemon (>= 1)"), 1, False
        ),
        "PostgreSQL, LangGraph 8 processes: our saver x PostgresSaver": verdict(
            on_pg.get("8 processes: SessionStoreSaver on PostgreSQL x PostgresSaver (>= 1)"),
            1,
            False,
        ),
        "PostgreSQL, LangGraph put p50: our saver x PostgresSaver": verdict(
            on_pg.get("1 thread: SessionStoreSaver put p50 x PostgresSaver's (<= 1.5)"), 1.5, True
        ),
        "PostgreSQL, Agents 8 processes: our session x SQLAlchemySession": verdict(
            on_pg.get("8 processes: SessionStoreSession x SQLAlchemySession (>= 1)"), 1, False
        ),
        "PostgreSQL, Agents add_items p50: our session x SQLAlchemySession": verdict(
            on_pg.get("1 caller: SessionStoreSession add_items p50 x SQLAlchemySession's (<= 1.5)"),
            1.5,
            True,
        ),
    }
    return out


def rate_of(row: Row | None) -> float | None:
    return row.ops_per_s if row is not None else None


def find_row(rows: list[Row], name: str, clients: int, size: int) -> Row | None:
    return next((r for r in rows if (r.name, r.clients, r.size) == (name, clients, size)), None)


def best_row(rows: list[Row], name: str, size: int) -> Row | None:
    """The row of `name` at `size` with the most operations a second."""
    candidates = (r for r in rows if r.name == name and r.size == size)
    return max(candidates, key=lambda r: r.ops_per_s, default=None)


def targets(rows: list[Row]) -> dict[str, Any]:
    """The log engine's targets, as ratios of figures measured in this run."""

    def find(name: str, clients: int, size: int) -> Row | None:
        return find_row(rows, name, clients, size)

    out: dict[str, Any] = {}
    sqlite, naive = "sqlite WAL sync=FULL save", "naive upstream save"
    ours64 = find("sessionstored save", 64, 4 * KIB)
    best_sqlite = best_row(rows, sqlite, 4 * KIB)
    ratios = (  # label, ours, theirs, which figure; throughput up is better, latency down
        ("64 clients 4 KiB: x best SQLite commits/s (>= 1.5, aim 2)", ours64, best_sqlite, "ops"),
        (
            "1 client p50: x SQLite single-commit p50 (<= 2.5, aim 2)",
            find("sessionstored save", 1, 4 * KIB),
            find(sqlite, 1, 4 * KIB),
            "p50",
        ),
        (
            "1 client p50: x the append+fdatasync floor",
            find("sessionstored save", 1, 4 * KIB),
            find("floor: append+fdatasync", 1, 4 * KIB),
            "p50",
        ),
        (
            "64 clients 64 KiB: x SQLite commits/s (>= 1)",
            find("sessionstored save", 64, 64 * KIB),
            find(sqlite, 64, 64 * KIB),
            "ops",
        ),
        (
            "64 clients 64 KiB: x naive upstream (>= 10)",
            find("sessionstored save", 64, 64 * KIB),
            find(naive, 64, 64 * KIB),
            "ops",
        ),
    )
    for label, ours, theirs, figure in ratios:
        if ours and theirs:
            if figure == "ops":
                out[label] = round(ours.ops_per_s / theirs.ops_per_s, 2)
            else:
                out[label] = round(ours.p50_ms / theirs.p50_ms, 2)
    if ours64:
        out["daemon CPU per 4 KiB save at 64 clients, us (<= 100)"] = ours64.extra.get(
            "daemon_cpu_us_per_save"
        )
    return out
