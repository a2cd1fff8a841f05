# Issue 28: `sessionstore backup` and `sessionstored restore` against real daemons
# and a real PostgreSQL: a backup under load is the state at its seq, a backup that
# did not finish is never taken for a whole one, a damaged one is refused with
# its offset, and stores move between the log and PostgreSQL with every digest
# kept, sealed ones included.
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionstore.backup_file import DamagedBackup, read_backup
from sessionstore.errors import SessionStoreError

from .acked_writes import acked_state, acked_writes, exported_digests
from .conftest import DaemonProcess
from .postgres_server import PostgresServer
from .waiting import until

CLI = [sys.executable, "-m", "sessionstore.tools.cli"]
DAEMON = [sys.executable, "-m", "sessionstored"]


def _backup(daemon: DaemonProcess, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [*CLI, "--socket", daemon.socket_path, "--json", "backup", str(path), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def _restore(path: Path, *target: str) -> subprocess.CompletedProcess[str]:
    command = [*DAEMON, "restore", str(path), *target]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@pytest.fixture
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ss-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _serve(workdir: Path, *extra: str, database_url: str | None = None) -> DaemonProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    daemon = DaemonProcess(workdir, database_url)
    daemon.start(*extra)
    return daemon


def _stop(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        assert client.verify()["problems"] == []
    assert daemon.stop() == 0, daemon.log()
    daemon.cleanup()


def _snapshot(session_id: str, n: int) -> dict[str, Any]:
    return {"schema_version": 1, "session": {"id": session_id, "n": n, "pad": "p" * 400}}


def test_a_backup_under_16_writers_and_a_compaction_is_the_state_at_its_seq(
    running: DaemonProcess, scratch: Path
) -> None:
    def session_id(number: int, n: int) -> str:
        return f"w{number}/{n % 7}"

    with acked_writes([running], 16, session_id, _snapshot, delete_every=5) as acks:
        until(lambda: len(acks) >= 500, "writes before the backup")
        with running.client() as client:
            client.compact()
        result = _backup(running, scratch / "live.bak")
        with running.client() as client:
            client.compact()
        after = len(acks)
        until(lambda: len(acks) >= after + 200, "writes after the backup")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    seq = summary["seq"]
    wanted = acked_state(acks, upto=seq)
    assert len(acks) > summary["documents"] > 0 and max(a[0] for a in acks) > seq
    restored = _restore(scratch / "live.bak", "--state-dir", str(scratch / "restored" / "state"))
    assert restored.returncode == 0, restored.stderr
    daemon = _serve(scratch / "restored")
    try:
        assert exported_digests(daemon) == wanted
        with daemon.client() as client:
            assert client.stats()["seq"] == seq  # the restored store starts at the backup's
    finally:
        _stop(daemon)


def _filled(running: DaemonProcess, count: int, size: int) -> None:
    with running.client() as client:
        for n in range(count):
            client.save({"schema_version": 1, "session": {"id": f"s{n}", "x": "y" * size}})


@pytest.mark.log_only
def test_kill_9_during_a_backup_leaves_no_file_restore_takes_for_whole(
    running: DaemonProcess, scratch: Path
) -> None:
    _filled(running, 300, 64 * 1024)
    target = scratch / "cut.bak"
    # the client killed mid-stream: its temp stays, without a trailer
    backup = subprocess.Popen(
        [*CLI, "--socket", running.socket_path, "backup", str(target)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    partial = _wait_for_partial(scratch, target)
    backup.send_signal(signal.SIGKILL)
    backup.wait()
    assert not target.exists()
    refused = _restore(partial, "--state-dir", str(scratch / "r1"))
    assert refused.returncode == 1 and "offset" in refused.stderr, refused.stderr
    assert not (scratch / "r1").exists()
    # the daemon killed mid-stream: the client says so, and keeps no file
    backup = subprocess.Popen(
        [*CLI, "--socket", running.socket_path, "backup", str(target)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _wait_for_partial(scratch, target, but_not=partial)
    assert running.proc is not None
    running.proc.send_signal(signal.SIGKILL)
    running.proc.wait()
    _, err = backup.communicate(timeout=60)
    assert backup.returncode != 0 and "sessionstore:" in err
    assert not target.exists()
    left = [p for p in scratch.iterdir() if p.name.endswith(".partial") and p != partial]
    assert left == []  # the client removed its own temp
    running.start()  # recovery; the teardown verifies


def _wait_for_partial(scratch: Path, target: Path, but_not: Path | None = None) -> Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for path in scratch.iterdir():
            if path.name.endswith(".partial") and path != but_not and path.stat().st_size > 1 << 20:
                return path
        time.sleep(0.01)
    raise AssertionError(f"no backup of {target} under way")


def test_a_damaged_backup_is_refused_naming_the_offset(
    running: DaemonProcess, scratch: Path
) -> None:
    _filled(running, 20, 300)
    good = scratch / "good.bak"
    assert _backup(running, good).returncode == 0
    data = good.read_bytes()
    read_backup(str(good))
    for offset in (0, 9, 20, len(data) // 3, len(data) // 2, len(data) - 30, len(data) - 3):
        damaged = scratch / f"flip-{offset}.bak"
        flipped = bytearray(data)
        flipped[offset] ^= 0x01
        damaged.write_bytes(bytes(flipped))
        with pytest.raises(DamagedBackup) as error:
            read_backup(str(damaged))
        assert error.value.offset <= offset
        result = _restore(damaged, "--state-dir", str(scratch / f"r-{offset}"))
        assert result.returncode == 1, result.stderr
        assert f"{damaged}: offset {error.value.offset}:" in result.stderr
        assert not (scratch / f"r-{offset}").exists()
    truncated = scratch / "short.bak"
    truncated.write_bytes(data[:-1])
    assert "offset" in _restore(truncated, "--state-dir", str(scratch / "rt")).stderr


def test_a_sealed_backup_needs_its_key_and_the_target_must_be_empty(
    short_tmp: Path, scratch: Path
) -> None:
    key, other = scratch / "key", scratch / "other"
    key.write_bytes(os.urandom(32))
    other.write_bytes(os.urandom(32))
    daemon = _serve(short_tmp, "--key-file", str(key))
    try:
        with daemon.client() as client:
            client.save(_snapshot("secret-id", 1))
        assert _backup(daemon, scratch / "sealed.bak").returncode == 0
    finally:
        _stop(daemon)
    raw = (scratch / "sealed.bak").read_bytes()
    assert b"secret-id" not in raw and b"pppp" not in raw  # ids and bodies stay sealed
    for given, said in (
        ((), "pass that key with --key-file"),
        (("--key-file", str(other)), "pass that key with --key-file"),
    ):
        result = _restore(scratch / "sealed.bak", "--state-dir", str(scratch / "x"), *given)
        assert result.returncode == 2 and said in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    (scratch / "busy").mkdir()
    (scratch / "busy" / "file").write_text("x")
    result = _restore(scratch / "sealed.bak", "--state-dir", str(scratch / "busy"),
                      "--key-file", str(key))  # fmt: skip
    assert result.returncode == 1 and "not empty" in result.stderr
    rekeyed = _restore(scratch / "sealed.bak", "--state-dir", str(scratch / "new" / "state"),
                       "--key-file", str(key), "--new-key-file", str(other))  # fmt: skip
    assert rekeyed.returncode == 0, rekeyed.stderr
    restored = _serve(scratch / "new", "--key-file", str(other))
    try:
        with restored.client() as client:
            assert client.load("secret-id") == _snapshot("secret-id", 1)
    finally:
        _stop(restored)


def test_log_to_postgresql_and_back_keeps_every_digest(
    postgres: PostgresServer, short_tmp: Path, scratch: Path
) -> None:
    key = scratch / "key"
    key.write_bytes(os.urandom(32))
    sealed = ("--key-file", str(key))
    source = _serve(short_tmp / "a", *sealed)
    try:
        with source.client() as client:
            for n in range(30):
                client.save(_snapshot(f"s/{n}", n) | {"blob": bytes([n]) * 50})
            client.checkpoint_put("kv", "k", {"f": 0.1, "raw": b"\x00"})
            client.checkpoint_put("loop", "r", {"run_id": "r", "step": 3})
            client.delete("s/3")
            client.lease_acquire("holder")
            first, seq = exported_digests(source), client.stats()["seq"]
        assert _backup(source, scratch / "1.bak").returncode == 0
    finally:
        _stop(source)
    url = postgres.url(postgres.create_database())
    moved = _restore(scratch / "1.bak", "--database", url, *sealed)
    assert moved.returncode == 0, moved.stderr
    middle = _serve(short_tmp / "b", *sealed, database_url=url)
    try:
        assert exported_digests(middle) == first
        with middle.client() as client:
            assert client.stats()["seq"] == seq and client.lease_get()["epoch"] == 1
            with pytest.raises(SessionStoreError):  # the lease still fences a stale writer
                client.save(_snapshot("s/0", 99))
        assert _backup(middle, scratch / "2.bak").returncode == 0
    finally:
        _stop(middle)
    again = _restore(scratch / "1.bak", "--database", url, *sealed)
    assert again.returncode == 1 and "not empty" in again.stderr
    back = _restore(scratch / "2.bak", "--state-dir", str(scratch / "c" / "state"), *sealed)
    assert back.returncode == 0, back.stderr
    last = _serve(scratch / "c", *sealed)
    try:
        assert exported_digests(last) == first
        with last.client() as client:
            assert client.stats()["seq"] == seq
    finally:
        _stop(last)
