# Encryption at rest against a real daemon: the key from each source, nothing
# readable under the state dir, refusals in one line, tampering answered with
# io_error, and `sessionstored rekey` between two runs of the daemon.
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sessionstore.errors import IOFailure
from sessionstore.wire.canonical import canonical_dumps, parse_digest
from sessionstored.storage.documents import Document
from sessionstored.storage.log.records import encode_data
from sessionstored.storage.sealing import PLAINTEXT, parse_key

from .conftest import DaemonProcess, snapshot
from .storage_helpers import locate_record

pytestmark = pytest.mark.log_only  # what the log's files reveal

SECRET = "sk-live-PROMPT-SECRET-5f1e"
SECRET_ID = "alice-session-8841"
SECRET_RUN = "alice-run-77"
SECRET_HOLDER = "alice-agent"


def _write_keys(workdir: Path) -> tuple[Path, Path]:
    raw = workdir / "a.key"
    raw.write_bytes(bytes(range(32)))
    hexed = workdir / "b.key"
    hexed.write_text(bytes(range(200, 232)).hex() + "\n")
    return raw, hexed


def _fill(daemon: DaemonProcess) -> dict[str, Any]:
    with daemon.client() as client:
        client.save(snapshot(SECRET_ID, prompt=SECRET))
        client.save(snapshot("other", notes=[SECRET, SECRET]))
        client.checkpoint_put("loop", SECRET_RUN, {"run_id": SECRET_RUN, "token": SECRET})
        lease = client.lease_acquire(SECRET_HOLDER)
        client.compact()
        client.save(snapshot(SECRET_ID, prompt=SECRET + "-v2"), lease=lease)
    return _observed(daemon)


def _observed(daemon: DaemonProcess) -> dict[str, Any]:
    with daemon.client() as client:
        return {
            "session": client.load(SECRET_ID),
            "head": client.head(SECRET_ID),
            "other": client.load("other"),
            "checkpoint": client.checkpoint_get("loop", SECRET_RUN),
            "lease_holder": client.lease_get()["holder"],
        }


def _plaintext_on_disk(state_dir: Path) -> list[str]:
    found = []
    for directory, _dirs, files in os.walk(state_dir):
        for name in files:
            path = Path(directory) / name
            data = path.read_bytes()
            for needle in (SECRET, SECRET_ID, SECRET_RUN, SECRET_HOLDER):
                if needle.encode() in data or needle in str(path):
                    found.append(f"{path}: {needle}")
    return found


def _refusal(
    daemon: DaemonProcess, *extra: str, env: dict[str, str] | None = None
) -> tuple[int, str]:
    daemon.start(*extra, env=env, wait=False)
    code = daemon.wait_exit()
    lines = [line for line in daemon.log().splitlines() if line.startswith("sessionstored:")]
    return code, lines[-1]


def test_a_sealed_store_keeps_nothing_readable_and_needs_its_key(daemon: DaemonProcess) -> None:
    key_a, key_b = _write_keys(daemon.workdir)
    daemon.start("--key-file", str(key_a))
    with daemon.client() as client:
        assert client.hello()["capabilities"]["encrypted_at_rest"] is True
        assert (
            client.stats()["sealed_with_key_id"]
            == (daemon.state_dir / "FORMAT").read_text().split("key-id ")[1].strip()
        )
    expected = _fill(daemon)
    assert daemon.stop() == 0
    assert _plaintext_on_disk(daemon.state_dir) == []

    code, line = _refusal(daemon)
    assert code == 1 and "no key was given" in line
    code, line = _refusal(daemon, "--key-file", str(key_b))
    assert code == 1 and "wrong key" in line
    bad = daemon.workdir / "bad.key"
    bad.write_text("not a key")
    code, line = _refusal(daemon, "--key-file", str(bad))
    assert code == 2 and "32 raw bytes or 64 hex digits" in line
    code, line = _refusal(daemon, "--key-file", str(daemon.workdir / "missing.key"))
    assert code == 2 and "cannot read key file" in line
    none = daemon.workdir / "none.key"
    none.write_text("none")  # only the systemd credential may say "no key"
    code, line = _refusal(daemon, "--key-file", str(none))
    assert code == 2 and "32 raw bytes or 64 hex digits" in line

    daemon.start(env={"SESSIONSTORED_KEY_FILE": str(key_a)})
    assert _observed(daemon) == expected
    assert daemon.stop() == 0
    credentials = daemon.workdir / "credentials"
    credentials.mkdir()
    (credentials / "sessionstored.key").write_bytes(key_a.read_bytes())
    daemon.start(env={"CREDENTIALS_DIRECTORY": str(credentials)})
    assert _observed(daemon) == expected


def test_a_plaintext_store_says_so(daemon: DaemonProcess) -> None:
    # the shipped unit's fallback credential when /etc/credstore has no key
    credentials = daemon.workdir / "credentials"
    credentials.mkdir()
    (credentials / "sessionstored.key").write_text("none\n")
    daemon.start(env={"CREDENTIALS_DIRECTORY": str(credentials)})
    with daemon.client() as client:
        assert client.hello()["capabilities"]["encrypted_at_rest"] is False
        assert client.stats()["sealed_with_key_id"] is None


def test_swapped_and_plaintext_records_are_io_errors_never_served(daemon: DaemonProcess) -> None:
    key_a, _ = _write_keys(daemon.workdir)
    key = parse_key(key_a.read_bytes(), str(key_a))
    daemon.start("--key-file", str(key_a))
    with daemon.client() as client:
        for session_id in ("a", "b", "c", "d"):
            client.save(snapshot(session_id, n=session_id))
        client.compact()  # read through the index from now on, never rescanned at boot
        seq, digest = client.head("c")["seq"], client.head("c")["digest"]
    assert daemon.stop() == 0
    where = {i: locate_record(daemon.state_dir, "s", i, key) for i in ("a", "b", "c")}
    segment = Path(where["a"][0])
    data = bytearray(segment.read_bytes())
    (_, a_at, a_len), (_, b_at, b_len) = where["a"], where["b"]
    a_record, b_record = bytes(data[a_at : a_at + a_len]), bytes(data[b_at : b_at + b_len])
    data[a_at : a_at + a_len], data[b_at : b_at + b_len] = b_record, a_record
    _, c_at, c_len = where["c"]
    body = canonical_dumps(snapshot("c", n="c"))
    plain = encode_data(PLAINTEXT, 3, Document("s", "c", seq, parse_digest(digest) or b"", body))
    data[c_at : c_at + c_len] = plain.ljust(c_len, b"\0")
    segment.write_bytes(bytes(data))
    daemon.start("--key-file", str(key_a))
    with daemon.client() as client:
        for session_id in ("a", "b"):
            with pytest.raises(IOFailure, match="holds another document"):
                client.load(session_id)
        with pytest.raises(IOFailure, match="plaintext in an encrypted store"):
            client.load("c")
        assert client.load("d") == snapshot("d", n="d")
        problems = client.verify()["problems"]
        assert sorted(p["id"] for p in problems) == ["a", "b", "c"]
        for session_id in ("a", "b", "c"):
            client.save(snapshot(session_id, n="fresh"))  # new generations replace them
            assert client.load(session_id) == snapshot(session_id, n="fresh")
        kept = client.verify()["problems"]  # kept as earlier generations, still damaged
        assert sorted((p["id"], p["seq"]) for p in kept) == sorted(
            (i, g["seq"]) for i in ("a", "b", "c") for g in client.history(i)[1:]
        )
        with pytest.raises(IOFailure):
            client.load("a", at=client.history("a")[1]["seq"])
    assert daemon.stop() == 0
    daemon.start("--key-file", str(key_a), "--keep-generations", "0")  # no earlier ones
    with daemon.client() as client:
        assert client.verify()["problems"] == []


def _rekey(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessionstored", "rekey", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_rekey_between_runs_of_the_daemon(daemon: DaemonProcess) -> None:
    key_a, key_b = _write_keys(daemon.workdir)
    daemon.start()
    expected = _fill(daemon)
    refused = _rekey(daemon.state_dir, "--new-key-file", str(key_a))
    assert refused.returncode == 1 and "holds the lock" in refused.stderr
    assert daemon.stop() == 0
    assert _plaintext_on_disk(daemon.state_dir) != []

    sealed = _rekey(daemon.state_dir, "--new-key-file", str(key_a))
    assert sealed.returncode == 0, sealed.stderr
    assert _plaintext_on_disk(daemon.state_dir) == []
    rotated = _rekey(daemon.state_dir, "--old-key-file", str(key_a), "--new-key-file", str(key_b))
    assert rotated.returncode == 0, rotated.stderr
    assert "resealed 4 documents" in rotated.stdout
    again = _rekey(daemon.state_dir, "--old-key-file", str(key_a), "--new-key-file", str(key_b))
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr
    code, line = _refusal(daemon, "--key-file", str(key_a))
    assert code == 1 and "wrong key" in line
    daemon.start("--key-file", str(key_b))
    assert _observed(daemon) == expected
    with daemon.client() as client:
        assert client.hello()["capabilities"]["encrypted_at_rest"] is True
