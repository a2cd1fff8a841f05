# A sessionstored process of the bench's own, on a socket and a state directory in
# the run's work directory, and what /proc says about it (CPU, bytes written, RSS).
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sessionstore.client import Client


class Daemon:
    def __init__(self, workdir: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.socket = str(workdir / "sock")
        self.log = open(workdir / "daemon.log", "ab")  # noqa: SIM115 - lives as long as the daemon
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sessionstored",
                "--state-dir",
                str(workdir / "state"),
                "--socket",
                self.socket,
                "--log-level",
                "warning",
                *extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                with Client(self.socket, timeout=5) as client:
                    client.ping()
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("bench: daemon did not start") from None
                time.sleep(0.05)

    def cpu_s(self) -> float:
        """User plus system CPU time of the daemon process so far."""
        with open(f"/proc/{self.proc.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def written_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/io") as io:
            for line in io:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
        return 0

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.log.close()
