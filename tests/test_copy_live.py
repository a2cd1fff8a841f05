# Issue 28, item 6: a copy of a live state directory (`cp -a` while the daemon
# serves writers, rotations and compactions). cp reads the files one by one, so
# the copy mixes moments: segments copied before or after a batch, a checkpoint
# naming segments it no longer holds, or holding ones no checkpoint names. What
# a daemon started on such a copy does is what this test finds out, copy after
# copy: it starts and recovers to a state in which every document is a
# generation that was acknowledged and `verify` is clean, or it refuses to start
# with one line naming what is missing. It never serves anything else.
from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from .conftest import DaemonProcess
from .waiting import until

COPIES = 5


@pytest.mark.log_only
def test_a_copy_of_a_live_state_directory_recovers_or_refuses_in_one_line(
    short_tmp: Path,
) -> None:
    source = DaemonProcess(short_tmp / "source")
    (short_tmp / "source").mkdir()
    source.start("--segment-mib", "1", "--checkpoint-every", "500")
    acked: dict[str, set[str]] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def writer(number: int) -> None:
        with source.client() as client:
            n = 0
            while not stop.is_set():
                session_id = f"w{number}/{n % 40}"
                snapshot = {"schema_version": 1, "session": {"id": session_id, "n": n},
                            "pad": "x" * 3000}  # fmt: skip
                digest = client.save(snapshot)["digest"]
                with lock:
                    acked.setdefault(session_id, set()).add(digest)
                n += 1

    def compactor() -> None:
        with source.client() as client:
            while not stop.is_set():
                client.compact()
                time.sleep(0.05)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    threads.append(threading.Thread(target=compactor))
    for thread in threads:
        thread.start()

    def saves() -> int:
        with lock:
            return sum(map(len, acked.values()))

    copies = []
    try:
        until(lambda: saves() >= 200, "saves before the first copy")
        for _ in range(COPIES):
            copy = Path(tempfile.mkdtemp(prefix="ss-copy-", dir="/tmp"))
            for _attempt in range(5):  # cp gives up on a file the daemon unlinks mid-copy
                copied = subprocess.run(
                    ["cp", "-a", str(source.state_dir), str(copy / "state")], capture_output=True
                )
                if copied.returncode == 0:
                    break
                shutil.rmtree(copy / "state", ignore_errors=True)
            assert copied.returncode == 0, copied.stderr
            copies.append(copy)
            copied_at = saves()
            until(lambda: saves() >= copied_at + 50, "saves between two copies")  # noqa: B023
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        assert source.stop() == 0
        source.cleanup()
    outcomes = []
    try:
        for copy in copies:
            daemon = DaemonProcess(copy)
            daemon.start(wait=False)
            assert daemon.proc is not None
            try:
                code = daemon.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:  # refused: one line, naming what it found
                lines = [line for line in daemon.log().splitlines() if line.strip()]
                assert code != 0 and lines, daemon.log()
                outcomes.append(f"refused: {lines[-1]}")
                continue
            daemon.wait_ready()
            with daemon.client() as client:
                assert client.verify()["problems"] == []
                for session_id in client.iter_ids():
                    head = client.head(session_id)
                    assert head["digest"] in acked[session_id], session_id  # acknowledged
            assert daemon.stop() == 0
            outcomes.append("recovered")
    finally:
        for copy in copies:
            shutil.rmtree(copy, ignore_errors=True)
    print(outcomes)  # what the README says, from the last runs
