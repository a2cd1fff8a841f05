# Redis with `appendfsync always` as an anchor (Debian's redis-server): what many
# users pick for durable, shared agent state. Like sessionstored it group-commits:
# it writes the append-only file and fdatasyncs it once per event-loop pass, before
# it answers. Its clients are ours (bench/load.py: the same processes and threads,
# blocking Unix sockets), and each SET carries the same canonical CBOR bytes a
# `save` carries, encoded at every send as our clients encode theirs. Left out,
# with a note, where redis-server is not installed.
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from sessionstore.wire.canonical import canonical_dumps

from .load import Sample, run_fixed
from .workload import make_snapshot

START_TIMEOUT_S = 30
REDIS_ROW = "redis appendfsync=always save"


def available() -> str | None:
    """Why Redis cannot be an anchor here, or None when it can."""
    return None if shutil.which("redis-server") else "redis-server is not installed"


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.socket = str(workdir / "redis.sock")
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port", "0",
                "--unixsocket", self.socket,
                "--dir", str(workdir),
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--save", "",
                "--daemonize", "no",
                "--logfile", str(workdir / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"bench: redis-server did not start (see {workdir}/redis.log)")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(self.socket)
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def cpu_s(self) -> float:
        """User plus system CPU time of redis-server so far (its threads included)."""
        with open(f"/proc/{self.proc.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def _set_command(key: bytes, value: bytes) -> bytes:
    return b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, len(value), value)


def redis_client(
    socket_path: str, request: Any, start_at: float, deadline: float, out: list[Any]
) -> None:
    """A client of bench/load.py's shape for Redis: request is (key, snapshot); the
    snapshot is encoded to canonical CBOR at every SET, as our clients encode theirs."""
    key, snapshot = request
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path)
    latencies = []
    errors = 0
    while time.time() < start_at:
        time.sleep(0.001)
    while time.time() < deadline:
        started = time.perf_counter()
        sock.sendall(_set_command(key, canonical_dumps(snapshot)))
        reply = b""
        while not reply.endswith(b"\r\n"):
            data = sock.recv(4096)
            if not data:
                raise ConnectionError("redis-server closed the connection")
            reply += data
        latencies.append(time.perf_counter() - started)
        errors += not reply.startswith(b"+OK")
    sock.close()
    out.append((latencies, errors))


def run_redis_clients(
    socket_path: str, clients: int, size: int, duration_s: float, tag: str
) -> Sample:
    """`clients` clients each setting its own key to its snapshot, for duration_s."""
    requests = [
        (f"bench/{tag}/{n}".encode(), make_snapshot(f"bench/{tag}/{n}", size))
        for n in range(clients)
    ]
    return run_fixed(socket_path, requests, duration_s, client=redis_client)
