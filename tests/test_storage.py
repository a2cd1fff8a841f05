# The log engine in process, over the simulated file system (and a few real
# directories): torn tails, bit rot, duplicate sequences, a full disk, fsync
# failure, rotation, compaction and checkpoint damage.
from __future__ import annotations

import errno
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sessionstored.storage.errors import (
    CorruptRecord,
    DiskFull,
    FatalStorageError,
    InjectedFault,
    StoreFormatError,
    StoreLocked,
)
from sessionstored.storage.log.fs import RealFileSystem
from sessionstored.storage.log.records import HEADER_BYTES, encode_removal
from sessionstored.storage.log.recovery import open_store as open_real
from sessionstored.storage.log.segments import SEGMENT_HEADER_BYTES
from sessionstored.storage.log.store import Store
from sessionstored.storage.sealing import PLAINTEXT

from .simfs import SimFileSystem
from .storage_helpers import (
    ROOT,
    assert_clean,
    body_for,
    new_fs,
    open_store,
    open_with_report,
    put,
    remove,
)


def _active_path(store: Store) -> str:
    return store.state.log.path(store.state.log.active)


def _flip(fs: SimFileSystem, path: str, offset: int) -> None:
    data = bytearray(fs.file_bytes(path))
    data[offset] ^= 0xFF
    fs.set_file_bytes(path, bytes(data))


def test_a_torn_tail_is_cut_and_a_broken_copy_kept() -> None:
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", 1)])
    store.commit([put("a", 2)])
    path, end = _active_path(store), store.state.log.offset
    store.close()
    good = fs.file_bytes(path)
    half_record = encode_removal(PLAINTEXT, 3, 3, "s", "a")[:30]
    for torn in (half_record, b"\xa5SL2\xff\xff", b"\x01" * 40):
        fs.set_file_bytes(path, good[:end] + torn + good[end + len(torn) :])
        recovered, report = open_with_report(fs)
        assert recovered.reads.read("s", "a").body == body_for("a", 2)
        assert report.corruption == [] and report.torn_tail is not None
        assert report.torn_tail["offset"] == end
        assert fs.file_bytes(path) == good, "the torn bytes are zeroed"
        assert fs.file_bytes(report.torn_tail["broken_copy"]) == torn
        assert_clean(recovered)
        recovered.close()
        again, second = open_with_report(fs)
        assert second.torn_tail is None, "recovering twice equals recovering once"
        again.close()


def test_an_uncommitted_last_batch_is_rolled_back_and_its_space_reused() -> None:
    fs = new_fs()
    failing = {"on": False}

    def failpoint(name: str) -> None:
        if failing["on"] and name == "before-commit-record":
            raise InjectedFault(name)

    store = open_store(fs, failpoint=failpoint)
    store.commit([put("a", 1)])
    start = store.state.log.offset
    failing["on"] = True
    [outcome] = store.commit([put("a", 2)])
    assert outcome.code == "io_error" and store.seq == 1
    assert store.state.log.offset == start, "the failed batch is rewound"
    assert fs.file_bytes(_active_path(store))[start : start + 64] == bytes(64)
    failing["on"] = False
    [outcome] = store.commit([put("b", 3)])
    assert outcome.seq == 2, "seq counts committed mutations only"
    store.close()
    recovered = open_store(fs)
    assert recovered.reads.read("s", "a").body == body_for("a", 1)
    assert recovered.reads.read("s", "b").body == body_for("b", 3)
    assert_clean(recovered)


def _five_sessions_in_the_log(fs: SimFileSystem, **options: object) -> Store:
    store = open_store(fs, **options)
    for n in range(5):
        store.commit([put(f"s{n}", n)])
    return store


@pytest.mark.parametrize("where", ["payload", "header"])
def test_bit_rot_in_a_replayed_record_is_reported_and_hides_only_its_document(
    where: str,
) -> None:
    fs = new_fs()
    store = _five_sessions_in_the_log(fs)
    entry = store.state.index.get("s", "s2")
    assert entry is not None
    path = store.state.log.path(entry.segment)
    store.close()
    offset = entry.offset + (HEADER_BYTES + 40 if where == "payload" else 20)
    _flip(fs, path, offset)
    recovered, report = open_with_report(fs)
    assert {c["path"] for c in report.corruption} == {path}
    assert report.corruption[0]["offset"] == entry.offset
    for n in (0, 1, 3, 4):
        assert recovered.reads.read("s", f"s{n}").body == body_for(f"s{n}", n)
    _checked, problems = recovered.verify()
    # the header survived, or was repaired from its checksum: it names the document,
    # which is io_error, never stale
    with pytest.raises(CorruptRecord) as caught:
        recovered.reads.read("s", "s2")
    assert caught.value.path == path and caught.value.offset == entry.offset
    assert [(p.problem, p.id) for p in problems] == [("damaged", "s2")]
    assert report.seq == 5 and recovered.seq == 5
    [outcome] = recovered.commit([put("s2", 9)])
    assert outcome.ok and recovered.reads.read("s", "s2").body == body_for("s2", 9)


def test_bit_rot_in_a_checkpointed_record_is_io_error_naming_file_and_offset() -> None:
    fs = new_fs()
    store = _five_sessions_in_the_log(fs)
    store.checkpointing.write()
    entry = store.state.index.get("s", "s3")
    assert entry is not None
    store.close()
    path = store.state.log.path(entry.segment)
    _flip(fs, path, entry.offset + entry.length - 3)
    recovered, report = open_with_report(fs)
    assert report.corruption == [], "nothing before the checkpoint is rescanned"
    with pytest.raises(CorruptRecord) as caught:
        recovered.reads.read("s", "s3")
    assert caught.value.path == path
    assert caught.value.offset == entry.offset + HEADER_BYTES
    assert recovered.reads.read("s", "s4").body == body_for("s4", 4)
    _, problems = recovered.verify()
    assert [(p.problem, p.id, p.file) for p in problems] == [("unreadable", "s3", path)]


def test_a_batch_that_reuses_seqs_fails_closed() -> None:
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", 1)])
    first_batch_end = store.state.log.offset
    store.commit([put("b", 2)])
    end, path = store.state.log.offset, _active_path(store)
    store.close()
    data = bytearray(fs.file_bytes(path))
    replayed = data[SEGMENT_HEADER_BYTES:first_batch_end]
    data[end : end + len(replayed)] = replayed  # batch 1 again, after batch 2
    fs.set_file_bytes(path, bytes(data))
    recovered, report = open_with_report(fs)
    assert any("duplicate sequence" in c["reason"] for c in report.corruption)
    with pytest.raises(CorruptRecord):
        recovered.reads.read("s", "a")
    assert recovered.reads.read("s", "b").body == body_for("b", 2)


def test_a_full_disk_refuses_saves_keeps_deletes_and_recovers() -> None:
    fs = new_fs()
    store = open_store(fs, segment_bytes=64 * 1024)
    for n in range(4):
        store.commit([put(f"s{n}", "x" * 2000)])
    fs.full_after_bytes = sum(len(b) for b in fs.all_files().values())
    outcomes: list[str | None] = []
    for n in range(40):  # the active segment fills; no new one can be made
        [outcome] = store.commit([put(f"new{n}", "y" * 2000)])
        outcomes.append(outcome.code)
    assert "no_space" in outcomes
    [deleted] = store.commit([remove("s0")])
    assert deleted.ok, "a removal goes into the segment's reserve"
    with pytest.raises(DiskFull):
        store.checkpointing.write()
    assert not store.state.failed
    assert_clean(store)
    fs.full_after_bytes = None
    [outcome] = store.commit([put("after", 1)])
    assert outcome.ok
    store.close()
    recovered = open_store(fs)
    assert recovered.reads.read("s", "s0") is None
    assert recovered.reads.read("s", "after").body == body_for("after", 1)
    assert_clean(recovered)


def _disk_full_for_saves(store: Store, fs: SimFileSystem, room: int) -> None:
    """Only `room` bytes left: no new segment fits, so a save that needs one is refused."""
    fs.full_after_bytes = fs._used_bytes() + room
    for n in range(100):
        if store.commit([put(f"filler{n}", "f" * 2000)])[0].code == "no_space":
            return
    raise AssertionError("the disk never filled")


def test_compaction_on_a_full_disk_answers_no_space_and_changes_nothing() -> None:
    fs = new_fs()
    store = open_store(fs, segment_bytes=64 * 1024)
    for n in range(20):
        store.commit([put(f"kept{n}", "k" * 2000)])
    for n in range(3):
        store.commit([put("kept0", ["again", n, "k" * 2000])])  # some dead, mostly live
    while store.state.log.active == 1:
        store.commit([put("newer", "n" * 2000)])
    _disk_full_for_saves(store, fs, room=0)
    before = store.state.log.size_bytes
    with pytest.raises(DiskFull):
        store.compact()
    assert store.state.log.size_bytes == before and not store.state.failed
    assert_clean(store)
    fs.full_after_bytes = None
    result = store.compact()
    assert result.records_moved > 0 and result.wal_bytes_after < before
    assert_clean(store)


def test_compaction_on_a_full_disk_still_drops_wholly_dead_segments() -> None:
    fs = new_fs()  # no earlier generations kept: every sealed segment is wholly dead
    store = open_store(fs, segment_bytes=64 * 1024, keep_generations=0)
    for n in range(60):
        store.commit([put(f"s{n % 3}", "x" * 2000)])
    _disk_full_for_saves(store, fs, room=16 * 1024)
    before = store.state.log.size_bytes
    result = store.compact()  # no room to copy anything: the dead segments go all the same
    assert result.records_moved == 0 and result.wal_bytes_after < before
    assert not store.state.failed
    assert_clean(store)


def _is_waiting(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == "wait" and "threading" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def test_a_rotation_waits_for_the_spare_being_filled_on_a_nearly_full_disk() -> None:
    fs = new_fs()
    store = open_store(fs, segment_bytes=64 * 1024)
    while not store.state.log.want_spare():
        store.commit([put(f"s{store.seq}", "x" * 2000)])
    fs.full_after_bytes = fs._used_bytes() + 64 * 1024 + 16 * 1024  # room for one segment
    filling, release = threading.Event(), threading.Event()
    plain_write = fs.write

    def gated_write(fd: int, data: bytes) -> None:
        if "spare-" in fs._fd_paths[fd] and not release.is_set():
            filling.set()
            release.wait(30)
        plain_write(fd, data)

    fs.write = gated_write  # type: ignore[method-assign]
    spare = threading.Thread(target=store.state.log.prepare_spare)
    spare.start()
    assert filling.wait(30)
    outcomes: list[Any] = []
    saver = threading.Thread(
        target=lambda: outcomes.extend(store.commit([put("big", "z" * 40_000)]))
    )
    saver.start()
    for _ in range(3000):
        if not saver.is_alive() or _is_waiting(saver):
            break
        time.sleep(0.01)
    release.set()
    saver.join(30)
    spare.join(30)
    [outcome] = outcomes
    assert outcome.ok, outcome  # it took the spare instead of failing to make a second one
    assert [n for n in fs.listdir(f"{ROOT}/tmp") if n.startswith("spare-")] == []
    assert_clean(store)


@pytest.mark.parametrize("target", ["segment", "tmp"])
def test_an_fsync_failure_is_fatal(target: str) -> None:
    fs = new_fs()
    store = open_store(fs)
    store.commit([put("a", 1)])
    if target == "segment":
        fs.fail_fsync_paths.add(_active_path(store))
        with pytest.raises(FatalStorageError, match="fdatasync of the log"):
            store.commit([put("a", 2)])
    else:
        fs.fail_fsync_paths.add(f"{ROOT}/tmp")
        fs.fail_fsync_paths.add(f"{ROOT}/ckpt")
        with pytest.raises(FatalStorageError):
            store.checkpointing.write()
    with pytest.raises(FatalStorageError, match="failed earlier"):
        store.commit([put("a", 3)])


def test_segments_rotate_and_every_generation_survives() -> None:
    fs = new_fs()
    store = open_store(fs, segment_bytes=64 * 1024)
    for n in range(100):
        store.commit([put(f"s{n % 7}", ["v", n, "z" * 1500])])
    assert len(store.state.log.used) > 2
    store.close()
    recovered = open_store(fs, segment_bytes=64 * 1024)
    for n in range(93, 100):
        assert recovered.reads.read("s", f"s{n % 7}").body == body_for(
            f"s{n % 7}", ["v", n, "z" * 1500]
        )
    assert_clean(recovered)


def _commit_rounds(store: Store, rounds: int, puts: int, value_bytes: int, tag: str) -> None:
    for n in range(rounds):
        store.commit([put(f"{tag}{k}", [tag, n, "v" * value_bytes]) for k in range(puts)])


def test_new_segments_are_zero_filled_after_small_commits_preallocated_after_large() -> None:
    fs = new_fs()
    store = open_store(fs, segment_bytes=256 * 1024)
    _commit_rounds(store, 200, 1, 1500, "small")  # ~1.6 KB a commit
    made = store.state.log.segments_made
    assert made["zero_filled"] >= 1 and made["preallocated"] == 0
    _commit_rounds(store, 40, 10, 6000, "large")  # ~60 KB a commit
    assert made["preallocated"] >= 1
    zero_filled = made["zero_filled"]
    _commit_rounds(store, 200, 1, 1500, "again")  # small again: the mean falls back
    assert made["zero_filled"] > zero_filled
    store.close()
    recovered = open_store(fs, segment_bytes=256 * 1024)
    for tag, rounds, puts, value_bytes in (("large", 40, 10, 6000), ("again", 200, 1, 1500)):
        for k in range(puts):
            expected = body_for(f"{tag}{k}", [tag, rounds - 1, "v" * value_bytes])
            assert recovered.reads.read("s", f"{tag}{k}").body == expected
    assert_clean(recovered)


class _CannotPreallocate(SimFileSystem):
    def preallocate(self, fd: int, size: int) -> None:
        self._step()
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")


def test_a_file_system_that_cannot_preallocate_gets_zero_filled_segments() -> None:
    fs = _CannotPreallocate()
    fs.makedirs_durable(ROOT)
    store = open_store(fs, segment_bytes=64 * 1024)
    _commit_rounds(store, 40, 10, 6000, "large")
    assert store.state.log.commit_bytes_mean > 48 * 1024
    assert store.state.log.segments_made["preallocated"] == 0
    assert store.state.log.segments_made["zero_filled"] >= 2
    assert [n for n in fs.listdir(f"{ROOT}/tmp") if not n.startswith("spare-")] == []
    store.close()
    assert open_store(fs, segment_bytes=64 * 1024).reads.read("s", "large9") is not None


def test_compaction_keeps_space_within_twice_the_live_bytes() -> None:
    fs = new_fs()
    store = open_store(fs, segment_bytes=32 * 1024)
    for round_ in range(30):
        store.commit([put(f"s{n}", [round_, "q" * 1000]) for n in range(80)])
        if store.compactor.due():
            store.compactor.compact(everything=False)
    live = sum(e.length for _, _, e in store.state.index.rows())
    on_disk = sum(v for n, v in store.state.log.used.items() if n != store.state.log.active)
    assert on_disk <= 2 * live
    store.close()
    recovered = open_store(fs, segment_bytes=32 * 1024)
    for n in range(80):
        assert recovered.reads.read("s", f"s{n}").body == body_for(f"s{n}", [29, "q" * 1000])
    assert_clean(recovered)


def test_a_damaged_checkpoint_falls_back_to_its_twin() -> None:
    fs = new_fs()
    store = _five_sessions_in_the_log(fs, segment_bytes=64 * 1024)
    store.commit([remove("s1")])
    for n in range(40):
        store.commit([put("filler", ["f" * 2000, n])])
    store.compact()
    assert 1 not in store.state.log.used, "the first segment was compacted away"
    store.close()
    first, second = sorted(fs.listdir(f"{ROOT}/ckpt"))
    _flip(fs, f"{ROOT}/ckpt/{first}", 30)
    recovered, report = open_with_report(fs)
    assert len(report.checkpoint_problems) == 1 and first in report.checkpoint_problems[0]
    assert recovered.reads.read("s", "s1") is None
    assert recovered.reads.read("s", "s4").body == body_for("s4", 4)
    recovered.close()
    _flip(fs, f"{ROOT}/ckpt/{second}", 30)
    with pytest.raises(StoreFormatError, match="every index checkpoint is damaged"):
        open_store(fs)


def test_without_a_checkpoint_the_whole_log_replays() -> None:
    fs = new_fs()
    store = _five_sessions_in_the_log(fs)
    store.close()
    recovered, report = open_with_report(fs)
    assert report.batches_replayed == 5 and report.checkpoint_seq == 0
    assert recovered.reads.read("s", "s4").body == body_for("s4", 4)


def test_a_second_open_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    store, _ = open_real(RealFileSystem(), str(tmp_path))
    with pytest.raises(StoreLocked):
        open_real(RealFileSystem(), str(tmp_path))
    store.close()
    again, _ = open_real(RealFileSystem(), str(tmp_path))
    again.close()


def test_an_unknown_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "FORMAT").write_bytes(b"sessionstore-format 99\n")
    with pytest.raises(StoreFormatError, match="unknown store format"):
        open_real(RealFileSystem(), str(tmp_path))


def test_symlinks_are_refused_for_directories_and_files(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "state"
    root.mkdir()
    (root / "log").symlink_to(outside)
    with pytest.raises(StoreFormatError, match="symlinks are refused"):
        open_real(RealFileSystem(), str(root))
    (root / "log").unlink()
    store, _ = open_real(RealFileSystem(), str(root))
    store.commit([put("a", 1)])
    path = Path(store.state.log.path(store.state.log.active))
    store.close()
    target = outside / "segment"
    target.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(target)
    with pytest.raises(OSError) as caught:
        open_real(RealFileSystem(), str(root))
    assert caught.value.errno == errno.ELOOP


def test_preallocated_segments_on_the_real_file_system(tmp_path: Path) -> None:
    store, _ = open_real(RealFileSystem(), str(tmp_path), segment_bytes=1024 * 1024)
    _commit_rounds(store, 60, 16, 4000, "s")  # ~64 KB a commit
    assert store.state.log.segments_made["preallocated"] >= 1
    active, offset, size = store.state.log.active, store.state.log.offset, store.state.log.size
    store.close()
    path = tmp_path / "log" / f"{active:016x}.seg"
    assert os.stat(path).st_blocks * 512 >= size  # its room is taken before it is used
    with open(path, "rb") as segment:
        segment.seek(offset)
        assert segment.read() == bytes(size - offset)  # past the log's end: zeros
    recovered, report = open_real(RealFileSystem(), str(tmp_path))
    assert report.corruption == []
    for k in range(16):
        assert recovered.reads.read("s", f"s{k}").body == body_for(f"s{k}", ["s", 59, "v" * 4000])
    assert_clean(recovered)
    recovered.close()


def test_the_real_file_system_round_trip(tmp_path: Path) -> None:
    store, _ = open_real(RealFileSystem(), str(tmp_path), segment_bytes=1024 * 1024)
    for n in range(300):
        store.commit([put(f"s{n % 10}", ["x" * 3000, n])])
    store.compact()
    store.close()
    recovered, report = open_real(RealFileSystem(), str(tmp_path))
    assert report.corruption == []
    assert recovered.reads.read("s", "s9").body == body_for("s9", ["x" * 3000, 299])
    assert_clean(recovered)
    assert all(os.path.getsize(tmp_path / "log" / n) > 0 for n in os.listdir(tmp_path / "log"))
    recovered.close()
