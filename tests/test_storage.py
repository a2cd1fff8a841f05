from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sessionstored.storage import wal as wal_module
from sessionstored.storage.check import check
from sessionstored.storage.files import CorruptDocument, file_name
from sessionstored.storage.fs import RealFileSystem
from sessionstored.storage.recovery import StoreFormatError
from sessionstored.storage.store import FatalStorageError, Store, StoreLocked

from .storage_helpers import ROOT, assert_clean, body_for, new_fs, open_store, put, remove


def _segment(fs: object) -> str:
    names = sorted(n for n in fs.listdir(f"{ROOT}/wal") if n.endswith(".wal"))  # type: ignore[attr-defined]
    return f"{ROOT}/wal/{names[-1]}"


def test_torn_tail_is_cut_and_a_broken_copy_kept() -> None:
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", 1)])
    store.commit([put("a", 2)])
    store.close()
    path = _segment(fs)
    good = fs.file_bytes(path)
    for torn in (
        good + wal_module.encode_record(["I", 3, "s", "a", b"\0" * 16, 5])[:9],
        good + b"\x00" * 40,
        good + b"\xa5WR1\xff\xff",
    ):
        fs.set_file_bytes(path, torn)
        recovered = open_store(fs)
        assert recovered.read("s", "a").body == body_for("a", 2)
        assert fs.file_bytes(path) == good
        assert fs.file_bytes(path + ".broken") == torn
        assert_clean(recovered)
        recovered.close()


def test_corruption_in_the_middle_is_reported_and_files_rebuild_the_index() -> None:
    fs = new_fs()
    store = open_store(fs)
    for n in range(5):
        store.commit([put(f"s{n}", n)])
    store.commit([remove("s0")])
    store.close()
    path = _segment(fs)
    data = bytearray(fs.file_bytes(path))
    middle = len(data) // 2
    data[middle] ^= 0xFF
    fs.set_file_bytes(path, bytes(data))
    recovered = Store(fs, ROOT)
    report = recovered.open()
    assert report.wal_corruption is not None
    assert report.wal_corruption["path"] == path
    assert 0 < report.wal_corruption["offset"] <= middle
    assert report.rebuilt_from_files
    assert fs.exists(f"{ROOT}/wal.corrupt-1")
    assert sorted(i for i, _ in recovered.index.items("s")) == ["s1", "s2", "s3", "s4"]
    assert recovered.seq >= 5
    assert_clean(recovered)
    [outcome] = recovered.commit([put("s1", 99)])
    assert outcome.ok and outcome.seq > 5


def test_duplicate_commit_fails_closed() -> None:
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", 1)])
    store.close()
    path = _segment(fs)
    fs.set_file_bytes(path, fs.file_bytes(path) + wal_module.encode_record(["C", [1], 0]))
    report = Store(fs, ROOT).open()
    assert report.wal_corruption is not None and "commit" in report.wal_corruption["reason"]


@pytest.mark.parametrize("where", ["magic", "header", "body", "truncated", "empty"])
def test_bit_rot_in_a_document_is_never_served(where: str) -> None:
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", "precious"), put("b", "other")])
    path = f"{ROOT}/docs/{file_name('s', 'a')}"
    data = bytearray(fs.file_bytes(path))
    if where == "magic":
        data[0] ^= 1
    elif where == "header":
        data[30] ^= 1
    elif where == "body":
        data[-3] ^= 1
    elif where == "truncated":
        del data[-5:]
    else:
        data = bytearray()
    fs.set_file_bytes(path, bytes(data))
    store.close()
    recovered = open_store(fs)
    with pytest.raises(CorruptDocument) as error:
        recovered.read("s", "a")
    assert path in str(error.value) and "offset" in str(error.value)
    assert recovered.read("s", "b").body == body_for("b", "other")
    checked, problems = check(recovered)
    assert checked == 2 and [p["id"] for p in problems] == ["a"]


def test_swapped_files_are_detected() -> None:
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", 1), put("b", 2)])
    a_path = f"{ROOT}/docs/{file_name('s', 'a')}"
    b_path = f"{ROOT}/docs/{file_name('s', 'b')}"
    a_bytes = fs.file_bytes(a_path)
    fs.set_file_bytes(a_path, fs.file_bytes(b_path))
    fs.set_file_bytes(b_path, a_bytes)
    with pytest.raises(CorruptDocument):
        store.read("s", "a")


def test_disk_full_fails_the_batch_and_later_writes_succeed() -> None:
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", 1)])
    used = sum(len(v) for v in fs.all_files().values())
    fs.full_after_bytes = used + 300  # room for the intents, not for a large document
    outcomes = store.commit([put("a", "y" * 5000), put("b", "z" * 5000)])
    assert [o.code for o in outcomes] == ["no_space", "no_space"]
    assert fs.listdir(f"{ROOT}/tmp") == []
    assert store.read("s", "a").body == body_for("a", 1)
    assert store.seq == 1
    fs.full_after_bytes = None
    [outcome] = store.commit([put("b", 2)])
    assert outcome.ok and outcome.seq == 2
    assert_clean(store)
    fs.crash(keep_unsynced=False)
    recovered = open_store(fs)
    assert recovered.seq == 2 and recovered.read("s", "b").body == body_for("b", 2)


def test_disk_full_on_the_wal_itself() -> None:
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", 1)])
    fs.full_after_bytes = sum(len(v) for v in fs.all_files().values()) + 10
    [outcome] = store.commit([put("a", 2)])
    assert outcome.code == "no_space"
    fs.full_after_bytes = None
    assert store.commit([put("a", 3)])[0].seq == 2
    store.close()
    fs.crash(keep_unsynced=False)
    assert open_store(fs).read("s", "a").body == body_for("a", 3)


@pytest.mark.parametrize("target", ["wal", "docs"])
def test_fsync_failure_is_fatal(target: str) -> None:
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", 1)])
    if target == "wal":
        fs.fail_fsync_paths.add(_segment(fs))
    else:
        fs.fail_fsync_paths.add(f"{ROOT}/docs")
    with pytest.raises(FatalStorageError):
        store.commit([put("a", 2)])
    with pytest.raises(FatalStorageError):
        store.commit([put("b", 1)])
    fs.fail_fsync_paths.clear()
    fs.crash(keep_unsynced=False)
    recovered = open_store(fs)
    assert recovered.read("s", "a").body == body_for("a", 1)
    assert_clean(recovered)


def test_lost_wal_rebuilds_from_files() -> None:
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", 1), put("b", 2)])
    store.close()
    for name in fs.listdir(f"{ROOT}/wal"):
        fs.unlink(f"{ROOT}/wal/{name}")
    recovered = Store(fs, ROOT)
    report = recovered.open()
    assert report.rebuilt_from_files and recovered.seq == 2
    assert recovered.read("s", "b").body == body_for("b", 2)


def test_wal_segments_rotate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wal_module, "SEGMENT_TARGET_BYTES", 400)
    fs = new_fs()
    store = open_store(fs)
    for n in range(20):
        store.commit([put(f"id{n % 3}", n)])
    segments = [n for n in fs.listdir(f"{ROOT}/wal") if n.endswith(".wal")]
    assert len(segments) >= 3
    store.close()
    fs.crash(keep_unsynced=False)
    recovered = open_store(fs)
    assert recovered.seq == 20
    assert recovered.read("s", "id1").body == body_for("id1", 19)


def test_second_open_on_same_directory_is_refused(tmp_path: Path) -> None:
    first = Store(RealFileSystem(), str(tmp_path))
    first.open()
    with pytest.raises(StoreLocked):
        Store(RealFileSystem(), str(tmp_path)).open()
    first.close()
    again = Store(RealFileSystem(), str(tmp_path))
    again.open()
    again.close()


def test_unknown_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "FORMAT").write_text("sessionstore-format 99\n")
    with pytest.raises(StoreFormatError):
        Store(RealFileSystem(), str(tmp_path)).open()


def test_symlinks_are_refused_for_directories_and_files(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    os.symlink(outside, state / "docs")
    with pytest.raises(StoreFormatError, match="symlinks are refused"):
        Store(RealFileSystem(), str(state)).open()
    os.unlink(state / "docs")
    store = Store(RealFileSystem(), str(state))
    store.open()
    store.commit([put("a", 1)])
    doc = state / "docs" / file_name("s", "a")
    secret = outside / "secret"
    secret.write_bytes(doc.read_bytes())
    doc.unlink()
    os.symlink(secret, doc)
    with pytest.raises(OSError) as error:
        store.read("s", "a")
    assert error.value.errno == errno.ELOOP
    store.close()


def test_real_filesystem_round_trip(tmp_path: Path) -> None:
    store = Store(RealFileSystem(), str(tmp_path))
    store.open()
    store.commit([put("a", 1), put("b" * 900, 2)])
    store.commit([remove("a")])
    store.close()
    again = Store(RealFileSystem(), str(tmp_path))
    report = again.open()
    assert again.seq == 3 and report.records_replayed > 0
    assert again.read("s", "b" * 900).body == body_for("b" * 900, 2)
    assert_clean(again)
    again.close()


def test_documents_over_the_cap_are_refused_before_reading(tmp_path: Path) -> None:
    store = Store(RealFileSystem(), str(tmp_path), max_document_bytes=1024)
    store.open()
    store.commit([put("a", "x" * 500)])
    path = tmp_path / "docs" / file_name("s", "a")
    with open(path, "ab") as handle:
        handle.truncate(50 * 1024 * 1024)  # sparse: a cap check must not read it
    with pytest.raises(OSError) as error:
        store.read("s", "a")
    assert error.value.errno == errno.EFBIG
    store.close()
