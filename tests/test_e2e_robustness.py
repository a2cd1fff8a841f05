# Issue 6 against a real daemon: strangers, read-only peers, too many
# connections, slowloris, garbage at the socket, a full disk, bit rot in every
# kind of file, symlinks out of the store.
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import cbor2
import pytest

from sessionstore.errors import IOFailure, NoSpace, Overloaded

from .conftest import DaemonProcess, private_tmp_command, snapshot
from .storage_helpers import locate_record
from .tools import require

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other uids, tmpfs)")


def _shared_dir(path: Path) -> DaemonProcess:
    """A daemon whose socket another uid can reach: the directory is world-searchable."""
    path.chmod(0o755)
    return DaemonProcess(path)


def _as_nobody(socket_path: str, *requests: dict) -> list[dict]:
    require("socat")
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    result = subprocess.run(
        ["socat", "-t", "3", "-", f"UNIX-CONNECT:{socket_path}"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=30,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
    )
    return [json.loads(line) for line in result.stdout.splitlines()]


@needs_root
def test_strangers_are_refused_and_read_only_peers_only_read(short_tmp: Path) -> None:
    daemon = _shared_dir(short_tmp)
    try:
        daemon.start("--socket-mode", "0666")
        with daemon.client() as client:
            client.save(snapshot("mine"))
        [refused] = _as_nobody(
            daemon.socket_path, {"op": "ping", "rid": 1}, {"op": "ping", "rid": 2}
        )
        assert refused == {
            "ok": False,
            "rid": 1,
            "error": {"code": "unauthorized", "message": refused["error"]["message"]},
        }
        assert f"uid={NOBODY}" in refused["error"]["message"]
        daemon.stop()

        daemon.start("--socket-mode", "0666", "--read-only-uid", str(NOBODY))
        load, save, stats = _as_nobody(
            daemon.socket_path,
            {"op": "load", "session_id": "mine"},
            {"op": "save", "snapshot": snapshot("theirs")},
            {"op": "stats"},
        )
        assert load["ok"] and load["snapshot"] == snapshot("mine")
        assert save["error"]["code"] == "unauthorized"
        assert stats["ok"]
        daemon.stop()

        daemon.start("--socket-mode", "0666", "--allow-uid", str(NOBODY))
        [saved] = _as_nobody(daemon.socket_path, {"op": "save", "snapshot": snapshot("theirs")})
        assert saved["ok"]
        with daemon.client() as client:
            assert client.stats()["refused"]["unauthorized"] == 0
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()


def test_connection_limit_answers_overloaded(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp)
    try:
        daemon.start("--max-connections", "4")
        idle = [socket.socket(socket.AF_UNIX) for _ in range(4)]
        for sock in idle:
            sock.connect(daemon.socket_path)
        with daemon.client() as client, pytest.raises(Overloaded):
            client.ping()
        leaving = idle.pop()
        leaving.settimeout(10)
        leaving.shutdown(socket.SHUT_WR)
        assert leaving.recv(1) == b""  # the daemon let it go, and counted it out before
        leaving.close()
        with daemon.client() as client:
            client.ping()
            assert client.stats()["refused"]["overloaded"] == 1
        for sock in idle:
            sock.close()
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()


def test_slowloris_is_cut_off_while_everyone_else_is_served(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp)
    idle: list[socket.socket] = []
    tricklers: list[socket.socket] = []
    try:
        daemon.start("--request-timeout-seconds", "1.5")
        for _ in range(400):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(daemon.socket_path)
            idle.append(sock)
        request = cbor2.dumps({"op": "save", "snapshot": snapshot("slow", pad="z" * 200)})
        for _ in range(30):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(daemon.socket_path)
            sock.settimeout(10)
            tricklers.append(sock)
        stop = threading.Event()

        def trickle() -> None:
            position = 0
            while not stop.is_set() and position < len(request) - 1:
                for sock in tricklers:
                    with contextlib.suppress(OSError):
                        sock.send(request[position : position + 1])
                position += 1
                time.sleep(0.1)

        thread = threading.Thread(target=trickle)
        thread.start()
        with daemon.client() as client:
            for n in range(50):
                client.save(snapshot(f"normal-{n}"))
            assert client.load("normal-49") == snapshot("normal-49")
        answers = []
        for sock in tricklers:  # each waits for its answer (the request timeout: 1.5 s)
            data = sock.recv(65536)
            answers.append(cbor2.loads(data)["error"]["code"] if data else None)
        stop.set()
        thread.join()
        assert answers == ["bad_request"] * 30
        with daemon.client() as client:
            assert client.stats()["refused"]["request_timeouts"] == 30
            assert client.stats()["sessions"] == 50
        for sock in idle:
            sock.sendall(cbor2.dumps({"op": "ping"}))  # idle connections stayed usable
            assert cbor2.loads(sock.recv(1024)) == {"ok": True}
    finally:
        for sock in idle + tricklers:
            sock.close()
        if daemon.proc and daemon.proc.poll() is None:
            assert daemon.stop() == 0
        daemon.cleanup()


ADVERSARIAL = [
    b"\x5b" + (1 << 62).to_bytes(8, "big"),  # a byte string claiming 4 EiB
    b"\x9b" + (1 << 62).to_bytes(8, "big"),  # an array claiming 2^62 items
    b"\x81" * 5000,  # nesting far too deep
    b"\xbf" * 70 + b"\xff" * 70,
    cbor2.dumps({"op": "save", "snapshot": [1, 2]}),
    cbor2.dumps({"op": "save", "snapshot": {"schema_version": 1, "session": {"id": 7}}}),
    cbor2.dumps({"op": "list", "limit": -1}),
    cbor2.dumps({"op": "load", "session_id": b"bytes"}),
    cbor2.dumps({"op": "watch", "since": "yesterday"}),
    cbor2.dumps({"op": "lease_release", "holder": {}, "epoch": 1.5}),
    cbor2.dumps({"op": "update", "session_id": "x", "component": "session", "value": 5}),
    b'{"op": "save", "snapshot": {"schema_version": 1, "session": {"id": "j"}}\n',
    b'{"op":\n{"op": "ping"}\n{{{{\n',
    b"\xc1\x1a\x51\x4b\x67\xb0",
    b"\xd8\x1c\x81\xd8\x1d\x00",  # shared-reference tags: a cycle if accepted
]


def test_two_requests_sent_at_once_are_both_answered_when_one_receive_cannot_hold_them(
    running: DaemonProcess,
) -> None:
    # the daemon receives at most 256 KiB at a time: the rest of the save waits in the
    # socket, and this client sends nothing more until both replies are in
    big = snapshot("pipelined-big", note="n" * (600 * 1024))
    sent = cbor2.dumps({"op": "ping", "rid": 1}) + cbor2.dumps(
        {"op": "save", "snapshot": big, "rid": 2}
    )
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(running.socket_path)
        sock.sendall(sent)
        replies: list[dict[str, object]] = []
        data = b""
        while len(replies) < 2:
            chunk = sock.recv(65536)
            assert chunk, "the daemon closed the connection"
            data += chunk
            while data:
                stream = io.BytesIO(data)
                try:
                    replies.append(cbor2.CBORDecoder(stream).decode())
                except cbor2.CBORDecodeEOF:
                    break
                data = data[stream.tell() :]
    assert [(r["rid"], r["ok"]) for r in replies] == [(1, True), (2, True)]
    with running.client() as client:
        assert client.load("pipelined-big") == big


def test_socket_fuzzer_cannot_hurt_the_daemon(running: DaemonProcess) -> None:
    rng = random.Random(1234)
    deadline = time.monotonic() + 8
    saved: list[str] = []
    errors: list[BaseException] = []

    def normal_client() -> None:
        try:
            with running.client() as client:
                n = 0
                while time.monotonic() < deadline:
                    client.save(snapshot(f"steady-{n}"))
                    saved.append(f"steady-{n}")
                    n += 1
        except BaseException as error:  # reported below
            errors.append(error)

    thread = threading.Thread(target=normal_client)
    thread.start()
    sent = 0
    while time.monotonic() < deadline:
        if rng.random() < 0.5:
            payload = rng.choice(ADVERSARIAL)
        else:
            payload = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 400)))
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(running.socket_path)
            try:
                sock.sendall(payload)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):
                    pass
            except OSError:
                pass
        sent += 1
    thread.join(30)
    assert not errors, errors
    assert sent > 50 and len(saved) > 10
    with running.client() as client:
        client.ping()
        assert client.load(saved[-1]) == snapshot(saved[-1])
        assert client.verify()["problems"] == []


def _tmpfs(short_tmp: Path, size: str):  # type: ignore[no-untyped-def]
    mount = short_tmp / "disk"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_tmpfs(short_tmp: Path):  # type: ignore[no-untyped-def]
    yield from _tmpfs(short_tmp, "3m")


@pytest.fixture
def eight_mib_tmpfs(short_tmp: Path):  # type: ignore[no-untyped-def]
    yield from _tmpfs(short_tmp, "8m")


@needs_root
@pytest.mark.log_only  # about the embedded log's segments
def test_a_small_disk_takes_saves_while_there_is_room(
    eight_mib_tmpfs: Path, short_tmp: Path
) -> None:
    """The default segment is 16 MiB; on an 8 MiB disk the segments shrink to fit, so
    saves succeed until the data itself fills the disk."""
    daemon = DaemonProcess(short_tmp)
    daemon.state_dir = eight_mib_tmpfs / "state"
    try:
        daemon.start()
        saved = 0
        with daemon.client() as client:
            with pytest.raises(NoSpace):
                for n in range(1000):
                    client.save(snapshot(f"s{n}", blob="b" * 50_000))
                    saved += 1
            assert saved * 50_000 > 2 * 1024 * 1024, saved  # most of the disk held data
            for n in range(saved):
                assert client.exists(f"s{n}")
            assert client.verify()["problems"] == []
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()


@needs_root
@pytest.mark.log_only  # about the embedded log's segments
def test_a_full_disk_is_rescued_from_inside_by_deleting_and_compacting(
    eight_mib_tmpfs: Path, short_tmp: Path
) -> None:
    """The store alone fills the disk; half of its sessions are deleted, every other one,
    so no segment is wholly dead; `compact` must still make room, and saves succeed again
    with nothing removed outside the store."""
    daemon = DaemonProcess(short_tmp)
    daemon.state_dir = eight_mib_tmpfs / "state"
    try:
        daemon.start()
        saved = 0
        with daemon.client() as client:
            with pytest.raises(NoSpace):
                for n in range(1000):
                    client.save(snapshot(f"s{n}", blob="old"))
                    client.save(snapshot(f"s{n}", blob=f"{n}" * 10_000))
                    saved += 1
            for n in range(0, saved, 2):
                client.delete(f"s{n}")
            assert client.stats()["log_dead_share"] > 0.4
            result = client.compact()
            assert result["segments_replaced"] > 0
            for n in range(saved // 4):
                client.save(snapshot(f"new{n}", blob=f"{n}" * 10_000))
            for n in range(1, saved, 2):
                assert client.load(f"s{n}") == snapshot(f"s{n}", blob=f"{n}" * 10_000)
            assert client.verify()["problems"] == []
        assert daemon.stop() == 0
        daemon.start()  # and the rescued store recovers
        with daemon.client() as client:
            assert client.exists(f"s{saved - 1 - saved % 2}")
            assert client.verify()["problems"] == []
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()


@needs_root
@pytest.mark.log_only  # about the embedded log's files
def test_disk_full_fails_saves_keeps_reads_and_recovers(small_tmpfs: Path, short_tmp: Path) -> None:
    filler = small_tmpfs / "filler"
    daemon = DaemonProcess(short_tmp)
    daemon.state_dir = small_tmpfs / "state"
    try:
        daemon.start("--segment-mib", "1")
        acked = []
        with daemon.client() as client:
            client.save(snapshot("keep"))
            with pytest.raises(NoSpace):
                for n in range(1000):
                    client.save(snapshot(f"big-{n}", blob="b" * 60_000))
                    acked.append(n)
            assert [n for n in os.listdir(daemon.state_dir / "tmp") if "spare" not in n] == []
            assert client.load("keep") == snapshot("keep")
            assert client.verify()["problems"] == []
            for n in acked[: len(acked) // 2]:
                client.delete(f"big-{n}")  # a removal fits the segment's reserve
            try:
                client.compact()  # the dead segments go: room again
            except NoSpace:
                pytest.fail("compacting wholly dead segments needs only a small checkpoint")
            client.save(snapshot("after", blob="a" * 60_000))
        filler.write_bytes(b"")
        daemon.kill9()
        daemon.start()
        with daemon.client() as client:
            assert client.load("after") is not None
            for n in acked[len(acked) // 2 :]:
                assert client.load(f"big-{n}") is not None
            assert client.verify()["problems"] == []
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x40
    path.write_bytes(bytes(data))


def _one_line_refusal(daemon: DaemonProcess) -> str:
    daemon.start(wait=False)
    assert daemon.wait_exit() == 1
    lines = [line for line in daemon.log().splitlines() if line.startswith("sessionstored:")]
    return lines[-1]


@pytest.mark.log_only  # about the embedded log's files
def test_bit_rot_in_documents_is_reported_never_served(daemon: DaemonProcess) -> None:
    daemon.start()
    with daemon.client() as client:
        client.save(snapshot("rotten"))
        client.save(snapshot("fine"))
        client.checkpoint_put("loop", "run", {"run_id": "run"})
        client.save(snapshot("last"))  # damage in the last batch would read as a torn write
    assert daemon.stop() == 0
    rotten_path, rotten_at, rotten_length = locate_record(daemon.state_dir, "s", "rotten")
    run_path, run_at, run_length = locate_record(daemon.state_dir, "l", "run")
    _flip(Path(rotten_path), rotten_at + rotten_length - 10)
    _flip(Path(run_path), run_at + run_length - 3)
    daemon.start()
    with daemon.client() as client:
        with pytest.raises(IOFailure) as error:
            client.load("rotten")
        assert rotten_path in error.value.message and "offset" in error.value.message
        with pytest.raises(IOFailure):
            client.checkpoint_get("loop", "run")
        assert client.load("fine") == snapshot("fine")
        problems = client.verify()["problems"]
        assert sorted(p["id"] for p in problems) == ["rotten", "run"]
        client.save(snapshot("rotten", v=2))  # a new generation replaces the damaged file
        client.checkpoint_delete("loop", "run")
        assert client.verify()["problems"] == []


@pytest.mark.log_only  # about the embedded log's files
def test_bit_rot_in_the_lease_refuses_the_start(daemon: DaemonProcess) -> None:
    daemon.start()
    with daemon.client() as client:
        lease = client.lease_acquire("holder")
        # not the last batch: damage there would look like a torn write, and be cut
        client.save(snapshot("after"), lease={"holder": "holder", "epoch": lease["epoch"]})
    assert daemon.stop() == 0
    path, offset, length = locate_record(daemon.state_dir, "L", "lease")
    _flip(Path(path), offset + length - 2)
    line = _one_line_refusal(daemon)
    assert "lease document is unreadable" in line and path in line


@pytest.mark.log_only  # about the embedded log's files
def test_bit_rot_in_format_refuses_the_start(daemon: DaemonProcess) -> None:
    daemon.start()
    assert daemon.stop() == 0
    _flip(daemon.state_dir / "FORMAT", 3)
    assert "FORMAT" in _one_line_refusal(daemon)


@pytest.mark.log_only  # about the embedded log's files
def test_bit_rot_in_the_middle_of_the_log_hides_one_document_and_the_daemon_starts(
    daemon: DaemonProcess,
) -> None:
    daemon.start()
    with daemon.client() as client:
        digests = {f"w{n}": client.save(snapshot(f"w{n}"))["digest"] for n in range(10)}
        client.delete("w0")
    assert daemon.stop() == 0
    path, offset, _ = locate_record(daemon.state_dir, "s", "w5")
    _flip(Path(path), offset + 100)  # inside the payload of a committed, replayed record
    daemon.start()
    with daemon.client() as client:
        [corruption] = client.stats()["recovery"]["corruption"]
        assert corruption["path"] == path and corruption["offset"] == offset
        with pytest.raises(IOFailure) as error:
            client.load("w5")
        assert path in error.value.message and str(offset) in error.value.message
        for session_id, digest in digests.items():
            if session_id not in ("w0", "w5"):
                assert client.head(session_id)["digest"] == digest
        [problem] = client.verify()["problems"]
        assert problem["file"] == path and problem["offset"] == offset
        assert client.save(snapshot("w5", v=2))["seq"] == 12  # a new generation replaces it
        assert client.verify()["problems"] == []


@pytest.mark.log_only  # about the embedded log's files
def test_bit_rot_in_an_index_checkpoint_falls_back(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp)
    try:
        daemon.start("--history-changes", "2")
        with daemon.client() as client:
            for n in range(6):
                client.save(snapshot(f"c{n}"))
            client.compact()
            client.save(snapshot("c6"))
            client.compact()
        assert daemon.stop() == 0
        checkpoints = sorted((daemon.state_dir / "ckpt").glob("*.ckpt"))
        assert len(checkpoints) == 2, "one generation, two copies"
        _flip(checkpoints[-1], 40)
        daemon.start()
        with daemon.client() as client:
            recovery = client.stats()["recovery"]
            assert (
                recovery["checkpoint_problems"]
                and str(checkpoints[-1]) in recovery["checkpoint_problems"][0]
            )
            assert sorted(client.list()["ids"]) == [f"c{n}" for n in range(7)]
            assert client.verify()["problems"] == []
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()


@pytest.mark.log_only  # about the embedded log's files
def test_symlinks_out_of_the_store_are_refused(daemon: DaemonProcess, short_tmp: Path) -> None:
    daemon.start()
    with daemon.client() as client:
        client.save(snapshot("linked"))
    assert daemon.stop() == 0
    outside = short_tmp / "outside"
    outside.mkdir()
    segment = Path(locate_record(daemon.state_dir, "s", "linked")[0])
    shutil.copy(segment, outside / "copy")
    segment.unlink()
    segment.symlink_to(outside / "copy")
    daemon.start(wait=False)
    assert daemon.wait_exit() != 0, "a segment that is a symlink is never followed"
    assert "Too many levels of symbolic links" in daemon.log()
    segment.unlink()
    shutil.copy(outside / "copy", segment)
    log = daemon.state_dir / "log"
    shutil.move(str(log), str(outside / "log"))
    log.symlink_to(outside / "log")
    assert "symlinks are refused" in _one_line_refusal(daemon)


def _commit_records(path: Path) -> list[int]:
    """The offsets of the commit records in one log segment, in order."""
    from sessionstored.storage.log.records import COMMIT, parse_header, record_length
    from sessionstored.storage.log.segments import SEGMENT_HEADER_BYTES

    data, offset, found = path.read_bytes(), SEGMENT_HEADER_BYTES, []
    while (header := parse_header(data, offset)) is not None:
        if header.type == COMMIT:
            found.append(offset)
        offset += record_length(header)
    return found


@pytest.mark.log_only  # about the embedded log's files
def test_bit_rot_in_a_delete_prefix_commit_never_brings_the_keys_back(
    daemon: DaemonProcess,
) -> None:
    daemon.start()
    with daemon.client() as client:
        for n in range(10):
            client.checkpoint_put("kv", f"w/{n}", {"n": n})
        client.checkpoint_put("kv", "x", {"n": -1})
        client.txn([{"op": "delete_prefix", "kind": "kv", "prefix": "w/"}])
        client.checkpoint_put("kv", "y", {"n": -2})  # a later batch: the damage is mid-log
    assert daemon.stop() == 0
    [segment] = sorted((daemon.state_dir / "log").glob("*.seg"))
    delete_commit = _commit_records(segment)[-2]
    _flip(segment, delete_commit + 60)  # inside the commit record's payload
    daemon.start()
    with daemon.client() as client:
        recovery = client.stats()["recovery"]
        assert recovery["damaged_documents"] == 10
        assert any(c["offset"] <= delete_commit for c in recovery["corruption"])
        with pytest.raises(IOFailure):
            client.checkpoint_get("kv", "w/3")
        with pytest.raises(IOFailure):
            client.checkpoint_scan("kv", prefix="w/")
        assert client.checkpoint_get("kv", "y") == {"n": -2}
        assert [i["key"] for i in client.checkpoint_scan("kv", prefix="x")["items"]] == ["x"]
        problems = client.verify()["problems"]
        assert sorted(p["id"] for p in problems) == [f"w/{n}" for n in range(10)]
        # deleting them again heals the range
        client.txn([{"op": "delete_prefix", "kind": "kv", "prefix": "w/"}])
        assert client.checkpoint_scan("kv", prefix="w/")["items"] == []
        assert client.verify()["problems"] == []
    assert "ERROR" in daemon.log() and "CORRUPTION" in daemon.log()


_PRIVATE_TMP = r"""
set -u
fallback=/tmp/sessionstored-0
case $1 in
  nobodys) mkdir -m 0700 $fallback && chown 65534:65534 $fallback ;;
  open) mkdir $fallback && chmod 0777 $fallback ;;
  link) mkdir /tmp/x && chown 65534:65534 /tmp/x && ln -s /tmp/x $fallback ;;
  none) ;;
esac
if [ $1 = none ]; then
  "$PYTHON" -m sessionstored --state-dir "$STATE" 2>"$STATE.err" &
  daemon=$!
  for _ in $(seq 600); do [ -S $fallback/sessionstored.sock ] && break; sleep 0.1; done
  stat -c 'dir %u %a' $fallback
  "$PYTHON" -c 'from sessionstore.client import Client; Client().ping(); print("ping ok")'
  kill $daemon; wait $daemon
  echo "daemon exit $?"
else
  "$PYTHON" -m sessionstored --state-dir "$STATE" 2>&1; echo "daemon exit $?"
  "$PYTHON" -c 'from sessionstore.client import Client; Client().ping()' 2>&1 | tail -1
fi
"""


def _in_private_tmp(case: str, state: Path) -> list[str]:
    """The case run as root in a mount namespace of its own with a fresh /tmp, so that
    root's real /tmp/sessionstored-0 is never touched."""
    env = {"PATH": os.environ["PATH"], "HOME": str(state), "PYTHON": sys.executable}
    env["STATE"] = str(state)
    command, outside = private_tmp_command("bash", "-c", _PRIVATE_TMP, "-", case)
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=120, env=env, check=False
        )
    finally:
        outside.rmdir()
    if done.stderr.startswith(("unshare:", "mount:")):
        pytest.skip(f"no private mount namespace here: {done.stderr.strip()}")
    return done.stdout.strip().splitlines()


@needs_root
@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("nobodys", "/tmp/sessionstored-0 belongs to uid 65534, not to uid 0"),
        ("open", "/tmp/sessionstored-0 has mode 0777, not 0700"),
        ("link", "/tmp/sessionstored-0 is a symlink"),
    ],
)
def test_a_socket_directory_in_tmp_that_is_not_ours_and_private_is_refused(
    case: str, reason: str
) -> None:
    """No XDG_RUNTIME_DIR: the fallback is /tmp/sessionstored-$UID. If another user (here
    nobody) made it, or anyone may write in it, whoever can could swap the socket and
    receive every client's snapshots; the daemon refuses to start, the clients to
    connect, each in one line."""
    state = Path(tempfile.mkdtemp(prefix="sessionstored-private-", dir="/var/tmp"))
    try:
        started, exit_line, told = _in_private_tmp(case, state)
        assert started.startswith(f"sessionstored: {reason}"), started  # before recovery
        assert "set XDG_RUNTIME_DIR" in started
        assert exit_line != "daemon exit 0"
        assert told.startswith("sessionstore.errors.UnsafeSocketDirectory: " + reason), told
    finally:
        shutil.rmtree(state, ignore_errors=True)


@needs_root
def test_the_daemon_makes_its_tmp_socket_directory_private_and_serves_there() -> None:
    state = Path(tempfile.mkdtemp(prefix="sessionstored-private-", dir="/var/tmp"))
    try:
        lines = _in_private_tmp("none", state)
        assert lines[:2] == ["dir 0 700", "ping ok"], (lines, (state.parent / f"{state.name}.err"))
    finally:
        shutil.rmtree(state, ignore_errors=True)
        Path(f"{state}.err").unlink(missing_ok=True)
