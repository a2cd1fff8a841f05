# `sessionstore top` under a pseudo-terminal, against a real daemon under load:
# it draws views that replace each other (the terminal's clear sequence), with
# the saves per second it sees, and Ctrl-C typed at the terminal ends it with
# status 0. Piped, with --count, it prints that many views and ends. A view's
# table of ops is bounded and printable whatever op names `stats` carries.
from __future__ import annotations

import fcntl
import os
import pty
import select
import subprocess
import sys
import termios
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.tools import top

from .conftest import DaemonProcess, snapshot

CLI = [sys.executable, "-m", "sessionstore.tools.cli"]


def _saving(daemon: DaemonProcess, stop: threading.Event) -> None:
    with daemon.client() as client:
        n = 0
        while not stop.is_set():
            client.save(snapshot("busy", n=n))
            n += 1


def _take_terminal() -> None:  # in the child: the pty is its controlling terminal
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_top_draws_live_views_and_ctrl_c_ends_it(running: DaemonProcess) -> None:
    stop = threading.Event()
    load = threading.Thread(target=_saving, args=(running, stop))
    load.start()
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [*CLI, "--socket", running.socket_path, "top", "--interval", "0.2"],
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
            preexec_fn=_take_terminal,
        )  # fmt: skip
        os.close(slave)
        seen = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                seen += os.read(master, 65536)
            views = seen.split(b"\x1b[H\x1b[2J")
            if len(views) >= 4 and _saves_per_s(views[-2]) > 0:
                break
        assert seen.count(b"\x1b[H\x1b[2J") >= 3, seen[-2000:]
        assert _saves_per_s(seen.split(b"\x1b[H\x1b[2J")[-2]) > 0
        os.write(master, b"\x03")  # Ctrl-C, typed at the terminal
        assert proc.wait(30) == 0
    finally:
        stop.set()
        load.join()
        os.close(master)


def _saves_per_s(view: bytes) -> float:
    for line in view.decode(errors="replace").splitlines():
        fields = line.split()
        if fields[:1] == ["save"]:
            return float(fields[1])
    return 0.0


def test_top_piped_prints_the_views_it_was_asked_for(running: DaemonProcess) -> None:
    with running.client() as client:
        client.save(snapshot("once"))
    shown = subprocess.run(
        [*CLI, "--socket", running.socket_path, "top", "--count", "2", "--interval", "0.1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "\x1b[" not in shown.stdout and shown.stdout.count("sessionstored  seq") == 2
    assert "save" in shown.stdout and "p99 ms" in shown.stdout


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=60), st.integers(0, 10**6), max_size=300))
def test_a_view_shows_a_bounded_table_of_printable_op_names(counts: dict[str, int]) -> None:
    requests = {op: {"count": count, "errors": 0} for op, count in counts.items()}
    rates = {op: float(count) for op, count in counts.items()}
    lines = top.render({"requests": requests}, rates).splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("op "))) + 1 :]
    assert len(table) <= top.MAX_OP_ROWS + 1  # and one line saying how many more
    for line in table:
        assert line.isprintable() and len(line) <= len(lines[4]), repr(line)
    if len(counts) > top.MAX_OP_ROWS:
        assert table[-1] == f"... {len(counts) - top.MAX_OP_ROWS} more ops"


@pytest.mark.parametrize("interval", ["-1", "0", "nan", "inf", "1e300", "soon"])
def test_a_bad_interval_is_one_line_and_exit_2(interval: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sessionstore.tools.cli", "top", "--interval", interval],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert "--interval" in line and interval in line, line


def test_top_shows_every_unknown_op_as_one_row(running: DaemonProcess) -> None:
    with running.client() as client:
        replies = client._send_raw([{"op": f"\x1b]0;op {n}\x07"} for n in range(1000)])
        assert {reply["error"]["code"] for reply in replies} == {"unknown_op"}
    shown = subprocess.run(
        [*CLI, "--socket", running.socket_path, "top", "--count", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    rows = shown.stdout.splitlines()[5:]
    assert [row.split()[0] for row in rows if row] == ["(unknown)"]
