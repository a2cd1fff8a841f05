# A format-1 store (one file per generation, written by the engine this one
# replaced: tests/fixtures/make_format1.py) is migrated to the log on its first
# open: every document and the seq come across, sealed stores stay sealed, and
# a crash at any step of the migration leaves a store that the next open
# migrates (or finishes) to the same result.
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sessionstore.errors import Compacted
from sessionstored.storage.errors import StoreFormatError
from sessionstored.storage.log.fs import RealFileSystem
from sessionstored.storage.log.recovery import open_store as open_real
from sessionstored.storage.log.store import Store
from sessionstored.storage.sealing import Key

from .conftest import DaemonProcess
from .simfs import SimFileSystem, SimulatedCrash
from .storage_helpers import ROOT, all_documents, assert_clean, new_fs, open_with_report, put

pytestmark = pytest.mark.log_only  # the log's format 1

FIXTURES = Path(__file__).parent / "fixtures"
KEYS = {"plain": None, "sealed": Key.from_material(b"\x42" * 32)}


def _expected(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"format1-{name}.expected.json").read_text())
    return data


def _extract(name: str, into: Path) -> Path:
    with tarfile.open(FIXTURES / f"format1-{name}.tar.gz") as archive:
        archive.extractall(into, filter="data")
    return into / "state"


def _load_into_sim(state: Path) -> SimFileSystem:
    fs = new_fs()
    for directory, subdirs, files in os.walk(state):
        relative = os.path.relpath(directory, state)
        target = ROOT if relative == "." else f"{ROOT}/{relative}"
        fs.makedirs_durable(target)
        for name in files:
            fd = fs.create_exclusive(f"{target}/{name}")
            fs.write(fd, (Path(directory) / name).read_bytes())
            fs.fsync(fd)
            fs.close(fd)
        fs.fsync_dir(target)
        del subdirs
    return fs


def _matches(store: Store, expected: dict[str, Any]) -> None:
    documents = {f"{k}:{i}": body.hex() for (k, i), body in all_documents(store).items()}
    assert documents == expected["bodies"]
    heads = {f"{k}:{i}": [e.seq, e.digest.hex()] for k, i, e in store.state.index.rows()}
    assert heads == expected["documents"]
    assert store.seq == expected["seq"]
    assert store.lease is not None and store.lease["holder"] == "h1"
    assert_clean(store)


@pytest.mark.parametrize("name", ["plain", "sealed"])
def test_a_format_1_store_is_migrated_on_first_open(name: str, tmp_path: Path) -> None:
    state = _extract(name, tmp_path)
    store, report = open_real(RealFileSystem(), str(state), key=KEYS[name])
    assert report.migrated is not None and "format 1 -> 2: 8 documents" in report.migrated
    _matches(store, _expected(name))
    assert (state / "FORMAT").read_bytes().startswith(b"sessionstore-format 2\n")
    assert not (state / "docs").exists() and not (state / "wal").exists()
    assert [n for n in os.listdir(state / "ckpt") if len(n) == 21] == []  # format-1 names
    seq = store.seq
    after = put("tenant/session", "after")
    [outcome] = store.commit([dataclasses.replace(after, fence=("h1", 2))])  # the lease came too
    assert outcome.seq == seq + 1, "seq goes on from the old store's"
    store.close()
    again, second = open_real(RealFileSystem(), str(state), key=KEYS[name])
    assert second.migrated is None
    again.close()


def test_a_sealed_format_1_store_needs_its_key(tmp_path: Path) -> None:
    state = _extract("sealed", tmp_path)
    with pytest.raises(StoreFormatError, match="no key was given"):
        open_real(RealFileSystem(), str(state))
    assert (state / "docs").exists(), "nothing was changed"


@pytest.mark.parametrize("name", ["plain", "sealed"])
def test_the_migration_survives_a_crash_at_every_step(name: str, tmp_path: Path) -> None:
    state = _extract(name, tmp_path)
    expected = _expected(name)
    probe = _load_into_sim(state)
    before = probe.steps
    open_with_report(probe, key=KEYS[name])
    total = probe.steps - before
    assert total > 20
    for step in range(total + 1):
        fs = _load_into_sim(state)
        fs.arm(step)
        with contextlib.suppress(SimulatedCrash):
            open_with_report(fs, key=KEYS[name])
        fs.crash("drop")
        store, _ = open_with_report(fs, key=KEYS[name])
        _matches(store, expected)
        assert not fs.exists(f"{ROOT}/docs") and not fs.exists(f"{ROOT}/wal"), step


def test_the_daemon_migrates_and_says_so(short_tmp: Path) -> None:
    daemon = DaemonProcess(short_tmp)
    daemon.state_dir = _extract("plain", short_tmp / "extracted")
    try:
        daemon.start()
        with daemon.client() as client:
            assert client.load("tenant/session")["session"]["id"] == "tenant/session"
            assert client.load("gone") is None
            assert client.stats()["seq"] == _expected("plain")["seq"]
            assert client.verify()["problems"] == []
            with pytest.raises(Compacted):
                list(client.watch(since=0))
        assert daemon.stop() == 0
        assert "migrating the store from format 1" in daemon.log()
    finally:
        daemon.cleanup()
