# Issue 28: a sealed PostgreSQL store rotates its key online. Under load from two
# daemons, every document ends readable under the new key only and none is
# lost; a rotation killed midway resumes; a daemon without the new key is never
# let in while one runs, and one that slipped past stops at its next batch.
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sessionstore.errors import SessionStoreError
from sessionstored.exit_codes import ExitCode
from sessionstored.storage.errors import FatalStorageError
from sessionstored.storage.postgres.keying import application_name
from sessionstored.storage.postgres.store import PgStore
from sessionstored.storage.sealing import KEY_ID_BYTES, SEAL_MAGIC, parse_key

from .acked_writes import acked_state, acked_writes, exported_digests
from .conftest import DaemonProcess
from .postgres_server import PostgresServer
from .storage_helpers import put
from .waiting import until

CLI = [sys.executable, "-m", "sessionstore.tools.cli"]
DAEMON = [sys.executable, "-m", "sessionstored"]
KEY_ID_AT = len(SEAL_MAGIC)


@pytest.fixture
def url(postgres: PostgresServer) -> str:
    return postgres.url(postgres.create_database())


@pytest.fixture
def keys(short_tmp: Path) -> tuple[str, str]:
    old, new = short_tmp / "old.key", short_tmp / "new.key"
    old.write_bytes(os.urandom(32))
    new.write_text(os.urandom(32).hex())
    return str(old), str(new)


def _key_id(path: str) -> bytes:
    return parse_key(Path(path).read_bytes(), path).key_id


def _daemon(workdir: Path, url: str) -> DaemonProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    return DaemonProcess(workdir, url)


def _serve(workdir: Path, url: str, *extra: str) -> DaemonProcess:
    daemon = _daemon(workdir, url)
    daemon.start(*extra)
    return daemon


def _rekey(url: str, old: str, new: str, *extra: str) -> subprocess.Popen[str]:
    command = [*DAEMON, "rekey", "--database", url, "--old-key-file", old, "--new-key-file", new]
    return subprocess.Popen(
        [*command, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = process.communicate(timeout=300)
    return process.returncode, out + err


def _sealed_with(url: str) -> dict[str, int]:
    """How many rows of ss_documents, ss_generations and ss_changes each key id seals."""
    counts: dict[str, int] = {}
    with psycopg.connect(url) as conn:
        for table in ("ss_documents", "ss_generations", "ss_changes"):
            rows = conn.execute(
                f"SELECT substring(name from {KEY_ID_AT + 1} for {KEY_ID_BYTES}), count(*)"
                f" FROM {table} GROUP BY 1"
            ).fetchall()
            for key_id, count in rows:
                counts[bytes(key_id).hex()] = counts.get(bytes(key_id).hex(), 0) + count
    return counts


def _earlier_generations_read(daemon: DaemonProcess) -> int:
    """Every generation each session keeps, read back whole; how many earlier ones."""
    earlier = 0
    with daemon.client() as client:
        for session_id in client.list(limit=10_000)["ids"]:
            for generation in client.history(session_id):
                read = client.load_with_meta(session_id, at=generation["seq"])
                assert read["digest"] == generation["digest"]
            earlier += len(client.history(session_id)) - 1
    return earlier


def _meta(url: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT name, value FROM ss_meta").fetchall())


def _snapshot(session_id: str, n: int) -> dict[str, Any]:
    return {"schema_version": 1, "session": {"id": session_id, "n": n, "blob": b"\x01" * n}}


def _fill(daemon: DaemonProcess, count: int) -> None:
    with daemon.client() as client:
        for n in range(count):
            client.save(_snapshot(f"s/{n}", n))
        client.checkpoint_put("kv", "k", {"f": 0.5})


def _stop(daemon: DaemonProcess) -> None:
    with daemon.client() as client:
        assert client.verify()["problems"] == []
    assert daemon.stop() == 0, daemon.log()
    daemon.cleanup()


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        daemon.cleanup()


def _sealed(
    workdir: Path, url: str, key: str, count: int, daemons: list[DaemonProcess]
) -> DaemonProcess:
    """A daemon that made the database, sealed with key, and saved count sessions."""
    daemon = _serve(workdir, url, "--key-file", key)
    daemons.append(daemon)
    _fill(daemon, count)
    return daemon


def test_a_rekey_under_load_leaves_every_document_under_the_new_key_only(
    url: str, keys: tuple[str, str], short_tmp: Path, daemons: list[DaemonProcess]
) -> None:
    old, new = keys
    first = _sealed(short_tmp / "a", url, old, 200, daemons)
    refused = _rekey(url, old, new)
    code, said = _finish(refused)
    assert code == 1 and "do not hold the new key" in said and "--previous-key-file" in said
    assert "rekey_to" not in _meta(url)
    assert first.stop() == 0
    hosts = [_daemon(short_tmp / name, url) for name in ("b", "c")]
    daemons.extend(hosts)
    hosts[0].start("--key-file", new, "--previous-key-file", old)
    hosts[1].start("--key-file", new, env={"SESSIONSTORED_PREVIOUS_KEY_FILE": old})
    filled = exported_digests(hosts[0])

    def session_id(number: int, n: int) -> str:  # shared among the writers and the fill
        return f"s/{(number * 37 + n) % 240}"

    with acked_writes(hosts, 8, session_id, _snapshot, delete_every=6) as acks:
        until(lambda: len(acks) >= 200, "writes before the rotation")
        code, said = _finish(_rekey(url, old, new, "--rows-per-transaction", "16"))
        after = len(acks)  # writes go on after the rotation's end too
        until(lambda: len(acks) >= after + 200, "writes after the rotation")
    assert code == 0, said
    assert "resealed" in said
    with hosts[0].client() as client:
        assert client.stats()["sealed_with_key_id"] == _key_id(new).hex()
    wanted = acked_state(acks, filled)
    assert exported_digests(hosts[0]) == wanted
    assert exported_digests(hosts[1]) == wanted and len(acks) > 100
    for host in hosts:
        _stop(host)
    assert _sealed_with(url) == {_key_id(new).hex(): sum(_sealed_with(url).values())}
    assert _meta(url)["sealed_with"] == _key_id(new).hex() and "rekey_to" not in _meta(url)
    after = _serve(short_tmp / "d", url, "--key-file", new)
    daemons.append(after)
    assert exported_digests(after) == wanted  # it started: it followed the resealed history too
    assert _earlier_generations_read(after) > 0  # kept ones, resealed, read with the new key
    _stop(after)
    stale = _daemon(short_tmp / "e", url)
    daemons.append(stale)
    stale.start("--key-file", old, wait=False)
    assert stale.wait_exit() == 2
    assert f"sealed with key id {_key_id(new).hex()}" in stale.log()


def test_a_rekey_killed_midway_resumes_and_the_daemons_serve_meanwhile(
    url: str, keys: tuple[str, str], short_tmp: Path, daemons: list[DaemonProcess]
) -> None:
    old, new = keys
    assert _sealed(short_tmp / "a", url, old, 600, daemons).stop() == 0
    host = _daemon(short_tmp / "b", url)
    daemons.append(host)
    credentials = short_tmp / "credentials"  # as systemd's LoadCredential= hands it over
    credentials.mkdir()
    (credentials / "sessionstored.previous-key").write_bytes(Path(old).read_bytes())
    host.start("--key-file", new, env={"CREDENTIALS_DIRECTORY": str(credentials)})
    before = exported_digests(host)
    slow = _rekey(url, old, new, "--rows-per-transaction", "1")
    new_id, old_id = _key_id(new).hex(), _key_id(old).hex()
    deadline = time.monotonic() + 120
    while _sealed_with(url).get(new_id, 0) < 50:
        assert slow.poll() is None and time.monotonic() < deadline, "the rekey ended early"
        time.sleep(0.05)
    slow.send_signal(signal.SIGKILL)
    slow.wait()
    halfway = _sealed_with(url)
    assert halfway[new_id] >= 50 and halfway[old_id] > 0
    assert _meta(url)["rekey_to"] == new_id
    assert exported_digests(host) == before  # each row under either key, read through both
    with host.client() as client:
        saved = client.save(_snapshot("s/1", 1000))
        client.delete("s/2")
        assert client.stats()["rekeying_to_key_id"] == new_id
    before[("session", "s/1")] = saved["digest"]
    del before[("session", "s/2")]
    for only in (old, new):  # neither key alone may join a rotation
        lone = _daemon(short_tmp / f"lone-{len(daemons)}", url)
        daemons.append(lone)
        lone.start("--key-file", only, wait=False)
        assert lone.wait_exit() == 2
        assert "being rekeyed" in lone.log() and "--previous-key-file" in lone.log()
    code, said = _finish(_rekey(url, old, new))
    assert code == 0 and "resumed" in said, said
    assert set(_sealed_with(url)) == {new_id}
    assert exported_digests(host) == before
    _stop(host)
    again = _finish(_rekey(url, old, new))
    assert again[0] == 0 and "nothing to do" in again[1]


def test_a_daemon_that_slipped_past_the_check_stops_at_its_next_batch_or_follow(
    url: str, keys: tuple[str, str], postgres: PostgresServer
) -> None:
    old = parse_key(Path(keys[0]).read_bytes(), "old")
    new = parse_key(Path(keys[1]).read_bytes(), "new")
    stores = [PgStore(url, key=old) for _ in range(2)]
    for store in stores:
        store.open()
    try:
        assert stores[0].commit_durably([put("a", 1)]).outcomes[0].ok
        with psycopg.connect(url) as conn:  # as if they were away when the rotation began
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND pid <> pg_backend_pid()",
                (application_name([old]),),
            )
        rotation = PgStore(url, key=new, previous_key=old)
        try:
            result = rotation.rekey(old, new, rows_per_transaction=8, progress=None)
        finally:
            rotation.close()
        assert result.documents >= 1 and not result.resumed
        failed = stores[0].commit_durably([put("b", 2)])
        assert failed.outcomes[0].code == "io_error"  # its connection was gone
        with pytest.raises(FatalStorageError, match="sealed with key id"):
            stores[0].commit_durably([put("b", 2)])
        with pytest.raises(OSError, match="sealed with key id"):  # not a false not_found
            stores[1].reads.head("s", "a")
        with pytest.raises(FatalStorageError, match="sealed with key id"):
            stores[1].follower.follow()  # which stops the daemon
        with pytest.raises(OSError):
            stores[1].reads.head("s", "a")
    finally:
        for store in stores:
            store.close()


def test_rekey_and_previous_key_refusals_are_one_line(
    url: str, keys: tuple[str, str], short_tmp: Path
) -> None:
    old, new = keys
    code, said = _finish(_rekey(url, old, new))  # a database no daemon made
    assert code == 1 and "holds no sessionstore tables" in said
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT to_regclass('ss_meta')").fetchone() == (None,)
    plain = _serve(short_tmp / "a", url)
    try:
        _fill(plain, 1)
    finally:
        assert plain.stop() == 0
        plain.cleanup()
    code, said = _finish(_rekey(url, old, new))
    assert code == 1 and "plaintext" in said and len(said.strip().splitlines()) == 1
    cases = [
        (["rekey", "--database", url, "--new-key-file", new], "--old-key-file and"),
        (["rekey", "--database", url, "--old-key-file", old, "--new-key-file", old], "same key"),
        (["--state-dir", str(short_tmp / "s"), "--key-file", new, "--previous-key-file", old],
         "rekeyed offline"),
    ]  # fmt: skip
    for arguments, reason in cases:
        result = subprocess.run([*DAEMON, *arguments], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and reason in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_running_daemons_without_the_new_key_stop_as_on_a_storage_failure_when_a_rotation_begins(
    url: str, keys: tuple[str, str], short_tmp: Path, daemons: list[DaemonProcess]
) -> None:
    old, new = keys
    writer = _serve(short_tmp / "w", url, "--key-file", old)
    reader = _serve(short_tmp / "r", url, "--key-file", old)
    daemons.extend([writer, reader])
    _fill(writer, 3)
    with psycopg.connect(url) as conn:  # a rotation whose start did not see them
        conn.execute("INSERT INTO ss_meta VALUES ('rekey_to', %s)", (_key_id(new).hex(),))
        conn.execute("UPDATE ss_counter SET key_epoch = key_epoch + 1")
    with writer.client() as client, pytest.raises(SessionStoreError):
        client.save(_snapshot("s/9", 9))  # its batch sees the rotation: it stops
    assert writer.wait_exit() == ExitCode.STORAGE_FAILURE and "being rekeyed" in writer.log()
    assert reader.wait_exit() == ExitCode.STORAGE_FAILURE  # its follow of ss_changes saw it
    assert "being rekeyed" in reader.log()


def test_a_schema_version_1_database_is_moved_to_the_current_version_at_start(
    url: str, short_tmp: Path, daemons: list[DaemonProcess]
) -> None:
    first = _serve(short_tmp / "a", url)
    daemons.append(first)
    _fill(first, 5)
    before = exported_digests(first)
    assert first.stop() == 0
    with psycopg.connect(url) as conn:  # what an earlier version made
        conn.execute("ALTER TABLE ss_counter DROP COLUMN key_epoch")
        conn.execute("UPDATE ss_meta SET value = '1' WHERE name = 'schema_version'")
    again = _serve(short_tmp / "b", url)
    daemons.append(again)
    assert exported_digests(again) == before
    with again.client() as client:
        client.save(_snapshot("s/new", 1))
    assert _meta(url)["schema_version"] == "5"
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT key_epoch FROM ss_counter").fetchone() == (0,)
    _stop(again)


def _moved_once_no_older_daemon_uses_it(
    url: str,
    short_tmp: Path,
    daemons: list[DaemonProcess],
    version: str,
    as_made: tuple[str, ...],
    older_name: str,
) -> DaemonProcess:
    """A database of an earlier version (as_made turns the current one into it) is not
    moved while a daemon named older_name is connected: the start is refused in one line
    and the version stays. Once it is gone, the move happens and nothing is lost."""
    first = _serve(short_tmp / "a", url)
    daemons.append(first)
    _fill(first, 3)
    before = exported_digests(first)
    assert first.stop() == 0
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in (*as_made, "UPDATE ss_meta SET value = %s WHERE name = 'schema_version'"):
            conn.execute(statement, (version,) if "%s" in statement else None)
    older = psycopg.connect(url, application_name=older_name)
    try:
        refused = _daemon(short_tmp / "b", url)
        refused.start(wait=False)
        assert refused.wait_exit() == 2
        last = refused.log().strip().splitlines()[-1]
        assert "daemons of an earlier version use this database" in last, refused.log()
        assert _meta(url)["schema_version"] == version
    finally:
        older.close()
    again = _serve(short_tmp / "c", url)
    daemons.append(again)
    assert exported_digests(again) == before
    assert _meta(url)["schema_version"] == "5"
    return again


def test_a_version_2_database_is_not_moved_while_an_older_daemon_uses_it(
    url: str, short_tmp: Path, daemons: list[DaemonProcess]
) -> None:
    """An older daemon decides under the counter row's lock alone: beside one of this
    version, both could decide on the same row. The move waits until none is connected."""
    _moved_once_no_older_daemon_uses_it(
        url,
        short_tmp,
        daemons,
        "2",
        (),
        "sessionstored keys=",  # as version 2 named itself
    )


def test_a_version_3_database_gains_expiry_once_no_older_daemon_uses_it(
    url: str, short_tmp: Path, daemons: list[DaemonProcess]
) -> None:
    """A version-3 daemon knows no expiry: its writes would keep a row's old expiry. The
    move adds the columns, the sweep's index and the new functions once none is connected."""
    version_3 = (
        "DROP INDEX ss_documents_expiry",
        "ALTER TABLE ss_documents DROP COLUMN expires_at_ms",
        "ALTER TABLE ss_changes DROP COLUMN expired",
    )
    again = _moved_once_no_older_daemon_uses_it(
        url, short_tmp, daemons, "3", version_3, "sessionstored keys= schema=3"
    )
    with again.client() as client:
        client.save(_snapshot("s/short", 1), ttl_s=3600)
        assert client.call("head", session_id="s/short")["expires_at_ms"] > 0
    with psycopg.connect(url) as conn:
        functions = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE proname IN ('ss_stage', 'ss_take_seqs')"
        ).fetchone()
        assert functions == (2,)  # version 3's overloads are gone
    _stop(again)


def test_a_version_4_database_gains_earlier_generations_once_no_older_daemon_uses_it(
    url: str, short_tmp: Path, daemons: list[DaemonProcess]
) -> None:
    """A version-4 daemon keeps no earlier generations: its saves would drop a session's
    row without keeping it. The move adds the table and the commit times (those of the
    changes still kept) once none is connected."""
    version_4 = (
        "DROP TABLE ss_generations",
        "ALTER TABLE ss_documents DROP COLUMN committed_at_ms",
    )
    again = _moved_once_no_older_daemon_uses_it(
        url, short_tmp, daemons, "4", version_4, "sessionstored keys= schema=4"
    )
    with again.client() as client:
        ids = client.list()["ids"]
        assert ids and all(client.history(i)[0]["committed_at_ms"] > 0 for i in ids)
        first = client.save(_snapshot("s/kept", 1))
        client.save(_snapshot("s/kept", 2))
        assert client.load("s/kept", at=first["seq"]) == _snapshot("s/kept", 1)
    _stop(again)


def test_bodies_are_compressed_with_lz4_from_the_next_start_and_older_ones_still_read(
    url: str, short_tmp: Path, daemons: list[DaemonProcess]
) -> None:
    def compression() -> dict[str, str]:
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT attrelid::regclass::text, attcompression FROM pg_attribute"
                " WHERE attname = 'body' AND attrelid = ANY('{ss_documents,ss_generations}'"
                "::regclass[])"
            ).fetchall()
        return dict(rows)

    first = _serve(short_tmp / "a", url)
    daemons.append(first)
    assert compression() == {"ss_documents": "l", "ss_generations": "l"}
    with psycopg.connect(url) as conn:  # as a store made before: pglz, the default
        for table in ("ss_documents", "ss_generations"):
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN body SET COMPRESSION pglz")
    big = _snapshot("s/big", 20_000)  # 20 KB of one byte: TOASTed and compressed
    with first.client() as client:
        client.save(big)
    assert first.stop() == 0
    again = _serve(short_tmp / "b", url)
    daemons.append(again)
    assert compression() == {"ss_documents": "l", "ss_generations": "l"}
    with again.client() as client:
        assert client.load("s/big") == big  # the pglz body, read back
        client.save(_snapshot("s/big", 30_000))
    with psycopg.connect(url) as conn:
        methods = conn.execute(
            "SELECT (SELECT pg_column_compression(body) FROM ss_documents WHERE kind = 's'),"
            " (SELECT pg_column_compression(body) FROM ss_generations)"
        ).fetchone()
    assert methods == ("lz4", "pglz")  # the new generation lz4, the one kept as it was
    _stop(again)
