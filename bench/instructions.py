# Instructions per request, counted by callgrind: the same on every run of the same
# code, where this shared VM's CPU times vary by tens of percent. One client sends
# requests one at a time to sessionstored and to the floor server (bench/floor_server.py),
# each run under valgrind twice (N and N + 200 requests), and the difference is divided
# by 200, so start-up and shutdown cancel out. Needs valgrind; about 4 minutes.
#
#   python -m bench.instructions [--dir DIR]
from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.options import existing_dir
from sessionstore.client import Client
from sessionstore.errors import ConnectionLost
from sessionstore.wire.protocol import NEED_DATA, Connection, Mode

from .cpu import request_for

WARM_REQUESTS = 20
COUNTED_REQUESTS = 200
REQUESTS = ("ping", "kv put 1 KiB", "save 4 KiB")


def _instructions(workdir: Path, server: str, name: str, requests: int) -> int:
    sock_path = str(workdir / "sock")
    if server == "floor":
        command = ["-m", "bench.floor_server", sock_path, str(workdir)]
    else:
        state = str(workdir / "state")
        command = ["-m", "sessionstored", "--state-dir", state, "--socket", sock_path]
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={workdir / 'cg.out'}"]
    proc = subprocess.Popen(
        [*valgrind, sys.executable, *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parent.parent,
    )
    deadline = time.monotonic() + 300
    while True:  # a daemon under valgrind takes a while to listen
        try:
            if server == "floor":
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(sock_path)
            else:
                with Client(sock_path, timeout=120) as client:
                    client.ping()
            break
        except (OSError, ConnectionLost):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"bench: {server} did not start under valgrind") from None
            time.sleep(0.2)
    request = request_for(name, 0)
    conn = Connection(mode=Mode.CBOR)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(sock_path)
        for _ in range(requests):
            sock.sendall(request)
            while (reply := conn.next_message()) is NEED_DATA:
                conn.receive_data(sock.recv(64 * 1024))
            if not reply.get("ok"):
                raise SystemExit(f"bench: {name} failed: {reply}")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    for line in err.decode().splitlines():
        if "Collected" in line:
            return int(line.split()[-1])
    raise SystemExit(f"bench: no callgrind total for {server}")


def per_request(base: Path, server: str, name: str) -> int:
    counts = []
    for requests in (WARM_REQUESTS, WARM_REQUESTS + COUNTED_REQUESTS):
        workdir = Path(tempfile.mkdtemp(dir=base))
        counts.append(_instructions(workdir, server, name, requests))
        shutil.rmtree(workdir, ignore_errors=True)
    return (counts[1] - counts[0]) // COUNTED_REQUESTS


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions")
    parser.add_argument("--dir", default=None, type=existing_dir, help="where to put the stores")
    options = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("bench.instructions: valgrind is needed (apt install valgrind)")
    base = Path(tempfile.mkdtemp(prefix="ssbench-", dir=options.dir))
    try:
        for name in REQUESTS:
            floor = per_request(base, "floor", name)
            ours = per_request(base, "sessionstored", name)
            print(
                f"instructions: {name}, 1 client: floor server {floor:,}, "
                f"sessionstored {ours:,} ({ours / floor:.2f} x)",
                flush=True,
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
