# systemd integration without booting systemd: the units pass systemd-analyze,
# the daemon speaks sd_notify in the right order (STATUS while recovering, READY
# after, WATCHDOG from the writer's loop, STOPPING on SIGTERM), and it serves a
# socket handed over by the real systemd-socket-activate.
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sessionstore.client import Client
from sessionstore.errors import SessionStoreError

from .conftest import DaemonProcess, snapshot
from .tools import require
from .waiting import until

pytestmark = pytest.mark.log_only  # the unit runs the embedded default

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "systemd"


def _units_for_this_machine(tmp: Path) -> Path:
    """The shipped units, with ExecStart pointing at this checkout's daemon."""
    daemon = Path(sys.executable).parent / "sessionstored"
    service = (UNITS / "sessionstored.service").read_text()
    (tmp / "sessionstored.service").write_text(
        service.replace("/opt/sessionstore/bin/sessionstored", str(daemon))
    )
    shutil.copy(UNITS / "sessionstored.socket", tmp / "sessionstored.socket")
    return tmp


def test_units_verify_without_a_word(tmp_path: Path) -> None:
    require("systemd-analyze")
    units = _units_for_this_machine(tmp_path)
    result = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            "--man=no",
            "--recursive-errors=yes",
            str(units / "sessionstored.socket"),
            str(units / "sessionstored.service"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_service_hardening_scores_3_or_better(tmp_path: Path) -> None:
    require("systemd-analyze")
    units = _units_for_this_machine(tmp_path)
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(units / "sessionstored.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(
        r"Overall exposure level for sessionstored\.service: ([0-9.]+)", result.stdout
    )
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 3.0


def test_status_then_ready_then_watchdog_then_stopping(daemon: DaemonProcess) -> None:
    daemon.start(env={"WATCHDOG_USEC": "400000"})
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        daemon.wait_notification("__never__", timeout=0.1)
    fields = [f for n in daemon.notifications for f in n.split("\n")]
    assert fields[0].startswith("STATUS=recovering")
    assert "READY=1" in fields
    assert fields.count("WATCHDOG=1") >= 4, fields
    with daemon.client() as client:
        client.ping()  # READY means the socket answers at once
    assert daemon.stop() == 0
    assert daemon.wait_notification("STOPPING=1", timeout=5)


def test_a_hung_writer_stops_the_watchdog_pings(daemon: DaemonProcess) -> None:
    daemon.start(env={"WATCHDOG_USEC": "400000", "SESSIONSTORED_FAILPOINTS": "before-intent=hang"})
    assert daemon.wait_notification("WATCHDOG=1", timeout=5)

    def stuck_save() -> None:
        try:
            with daemon.client(timeout=10) as client:
                client.save(snapshot("stuck"))
        except SessionStoreError:
            pass

    thread = threading.Thread(target=stuck_save, daemon=True)
    thread.start()
    until(lambda: "failpoint before-intent: hanging" in daemon.log(), "the writer stuck")
    daemon.notifications.clear()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        daemon.wait_notification("__never__", timeout=0.1)
    assert not any("WATCHDOG=1" in n for n in daemon.notifications), daemon.notifications
    with daemon.client(timeout=5) as reader:
        reader.ping()  # reads still work: only the writer is stuck
    daemon.kill9()


def test_socket_activation_through_systemd_socket_activate(short_tmp: Path) -> None:
    require("systemd-socket-activate")
    sock_path = str(short_tmp / "activated.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SESSIONSTORE", "LISTEN_"))}
    proc = subprocess.Popen(
        [
            "systemd-socket-activate",
            "-l",
            sock_path,
            "--fdname=sessionstored",
            sys.executable,
            "-m",
            "sessionstored",
            "--state-dir",
            str(short_tmp / "state"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sock_path):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        with Client(sock_path, timeout=30) as client:  # this connection starts the daemon
            client.save(snapshot("activated"))
            assert client.load("activated") == snapshot("activated")
            stats = client.stats()
        assert stats["sessions"] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        output = proc.stdout.read().decode() if proc.stdout else ""
        assert "the socket passed by systemd" in output, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_journal_priority_prefixes_under_systemd(daemon: DaemonProcess) -> None:
    daemon.start(env={"JOURNAL_STREAM": "8:12345"})
    assert daemon.stop() == 0
    lines = [line for line in daemon.log().splitlines() if line.strip()]
    assert lines and all(re.match(r"<[0-7]>sessionstored", line) for line in lines), lines
    assert any(line.startswith("<6>sessionstored.server: serving on") for line in lines)


@pytest.mark.log_only  # about the embedded log's files
def test_corruption_at_start_is_an_error_in_the_journal_and_a_torn_tail_a_warning(
    daemon: DaemonProcess,
) -> None:
    """`journalctl -p warning` must show both, and `-p err` the corruption."""
    from .storage_helpers import locate_record

    journal = {"JOURNAL_STREAM": "8:12345"}
    daemon.start(env=journal)
    with daemon.client() as client:
        for n in range(4):
            client.save(snapshot(f"p{n}"))
    assert daemon.stop() == 0

    def recovered_line() -> str:
        [line] = [x for x in daemon.log().splitlines() if "sessionstored: recovered " in x][-1:]
        return line

    assert recovered_line().startswith("<6>")  # a clean start: info
    path, offset, length = locate_record(daemon.state_dir, "s", "p3")
    segment = Path(path)
    data = bytearray(segment.read_bytes())
    end = offset + length + 76  # after p3's record and its batch's commit record
    data[end : end + 40] = b"\x01" * 40  # half a batch that never reached its sync
    segment.write_bytes(bytes(data))
    daemon.start(env=journal)
    assert daemon.stop() == 0
    assert recovered_line().startswith("<4>") and "torn log tail" in recovered_line()
    path, offset, _ = locate_record(daemon.state_dir, "s", "p1")
    data = bytearray(segment.read_bytes())
    data[offset + 100] ^= 0x40  # rot in a committed record that later batches follow
    segment.write_bytes(bytes(data))
    daemon.start(env=journal)
    with daemon.client() as client:
        with pytest.raises(SessionStoreError):
            client.load("p1")
        client.delete("p1")  # so that the suite's closing verify is clean
    assert daemon.stop() == 0
    assert recovered_line().startswith("<3>") and "CORRUPTION" in recovered_line()
