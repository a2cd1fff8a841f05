# sessionstore/backup_file.py on its own: what is written reads back whole, and no
# cut, flip or reordering of the bytes is ever taken for a whole backup.
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.backup_file import BackupWriter, DamagedBackup, read_backup

payload_lists = st.lists(st.binary(max_size=200), max_size=12)


def _written(directory: Path, payloads: list[bytes], seq: int = 7) -> Path:
    path = directory / "b.bak"
    writer = BackupWriter(str(path), {"seq": seq, "backup_id": b"\0" * 16})
    for payload in payloads:
        writer.add(payload)
    writer.finish()
    return path


@settings(max_examples=60, deadline=None)
@given(payloads=payload_lists)
def test_what_is_written_reads_back_whole(payloads: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        backup = read_backup(str(_written(Path(directory), payloads)))
        assert [payload for _, payload in backup.payloads()] == payloads
        assert (backup.trailer.seq, backup.trailer.documents) == (7, len(payloads))


@settings(max_examples=30, deadline=None)
@given(payloads=payload_lists.filter(len), data=st.data())
def test_no_cut_or_flip_is_taken_for_a_whole_backup(
    payloads: list[bytes], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = _written(Path(directory), payloads)
        whole = path.read_bytes()
        cut = data.draw(st.integers(0, len(whole) - 1))
        path.write_bytes(whole[:cut])
        with pytest.raises(DamagedBackup):
            read_backup(str(path))
        flipped = bytearray(whole)
        at = data.draw(st.integers(0, len(whole) - 1))
        flipped[at] ^= data.draw(st.integers(1, 255))
        path.write_bytes(bytes(flipped))
        with pytest.raises(DamagedBackup) as refused:
            read_backup(str(path))
        assert refused.value.offset <= at


def test_two_records_swapped_break_the_chain(tmp_path: Path) -> None:
    path = _written(tmp_path, [b"first", b"other"])  # the same length: a clean swap
    data = path.read_bytes()
    first, other = data.index(b"first") - 5, data.index(b"other") - 5
    size = other - first
    swapped = data[:first] + data[other : other + size] + data[first:other] + data[other + size :]
    path.write_bytes(swapped)
    with pytest.raises(DamagedBackup, match="does not match its checksum"):
        read_backup(str(path))


def test_an_abandoned_backup_leaves_nothing(tmp_path: Path) -> None:
    writer = BackupWriter(str(tmp_path / "b.bak"), {"seq": 1, "backup_id": b"\0" * 16})
    writer.add(b"x")
    assert Path(writer.temp_path).exists() and Path(writer.temp_path).stat().st_mode & 0o077 == 0
    writer.abort()
    assert list(tmp_path.iterdir()) == []
