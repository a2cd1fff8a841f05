# The anchors every daemon figure is compared with, measured in the same run:
# SQLite in WAL mode with synchronous=FULL (what LangGraph's and the OpenAI
# Agents SDK's SQLite backends use), the naive upstream algorithm, and the
# floor: what one fsync, one append + fdatasync into a preallocated file (the
# log's floor), and one temp+fsync+rename+dir-fsync cost on this disk.
from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time
from typing import Any

import xxhash


def fsync_floor(directory: str, count: int) -> list[float]:
    path = os.path.join(directory, "floor.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    latencies = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            os.write(fd, b"x" * 64)
            os.fsync(fd)
            latencies.append(time.perf_counter() - started)
    finally:
        os.close(fd)
    return latencies


def append_floor(directory: str, body: bytes, count: int) -> list[float]:
    """The log's own floor: one append into a preallocated, zero-filled file, then fdatasync."""
    path = os.path.join(directory, "append.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    latencies = []
    try:
        page = bytes(4096)
        for _ in range(-(-len(body) * count // len(page))):
            os.write(fd, page)  # as segments.py zero-fills: a page per write, small folios
        os.fsync(fd)
        for n in range(count):
            started = time.perf_counter()
            os.pwrite(fd, body, n * len(body))
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - started)
    finally:
        os.close(fd)
    return latencies


def rename_floor(directory: str, body: bytes, count: int) -> list[float]:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    target = os.path.join(directory, "doc")
    latencies = []
    try:
        for n in range(count):
            started = time.perf_counter()
            temp = os.path.join(directory, f"doc.{n}.tmp")
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, body)
            os.fsync(fd)
            os.close(fd)
            os.rename(temp, target)
            os.fsync(dir_fd)
            latencies.append(time.perf_counter() - started)
    finally:
        os.close(dir_fd)
    return latencies


def open_sqlite(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, body BLOB)")
    return conn


def sqlite_saves(
    path: str, session_id: str, snapshot: dict[str, Any], deadline: float
) -> list[float]:
    """One transaction per save of the snapshot, serialised with json.dumps each time (as
    LangGraph's and the Agents SDK's SQLite backends do)."""
    conn = open_sqlite(path)
    latencies = []
    try:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            body = json.dumps(snapshot).encode()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT OR REPLACE INTO sessions VALUES (?, ?)", (session_id, body))
            conn.execute("COMMIT")
            latencies.append(time.perf_counter() - started)
    finally:
        conn.close()
    return latencies


def sqlite_loads(path: str, session_ids: list[str], deadline: float) -> int:
    conn = open_sqlite(path)
    done = 0
    try:
        while time.perf_counter() < deadline:
            for session_id in session_ids:
                conn.execute("SELECT body FROM sessions WHERE id = ?", (session_id,)).fetchone()
                done += 1
    finally:
        conn.close()
    return done


def naive_saves(
    directory: str, session_id: str, snapshot: dict[str, Any], deadline: float
) -> list[float]:
    """Upstream's per-save algorithm: lock; intent + fsync; temp + fsync + rename; commit + fsync.

    Upstream skips the directory fsync after the rename; so does this, which makes it
    an upper bound on the naive algorithm's speed at a lower durability.
    """
    wal_path = os.path.join(directory, "wal.jsonl")
    lock_path = os.path.join(directory, "wal.lock")
    target = os.path.join(directory, f"{session_id}.json")
    latencies = []
    lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        n = 0
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            body = json.dumps(snapshot).encode()
            digest = xxhash.xxh3_128_hexdigest(body)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                with open(wal_path, "ab") as wal:
                    wal.write(
                        f'{{"seq":{n},"id":"{session_id}","digest":"{digest}","phase":"intent"}}\n'.encode()
                    )
                    wal.flush()
                    os.fsync(wal.fileno())
                temp = f"{target}.{os.getpid()}.tmp"
                with open(temp, "wb") as handle:
                    handle.write(body)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.rename(temp, target)
                with open(wal_path, "ab") as wal:
                    wal.write(f'{{"seq":{n},"phase":"committed"}}\n'.encode())
                    wal.flush()
                    os.fsync(wal.fileno())
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
            latencies.append(time.perf_counter() - started)
            n += 1
    finally:
        os.close(lock_fd)
    return latencies
