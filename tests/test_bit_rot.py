# Bit rot in committed batches, over the simulated file system.
#
# A committed batch is acknowledged: whatever rots in it later, recovery must not
# bring back an older generation of any document it touched. A document whose
# acknowledged generation can no longer be read is `io_error` (CorruptRecord
# here) and `verify` lists it; where the damage hides which document a record
# held, `verify` says so. The sweep flips every byte of the last few batches,
# one at a time, and restarts; two of their records carry an expiry.
from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from sessionstored.storage.documents import KeyRange
from sessionstored.storage.errors import CorruptRecord
from sessionstored.storage.log.segments import SEGMENT_HEADER_BYTES
from sessionstored.storage.log.store import Store
from sessionstored.storage.mutations import Put
from sessionstored.storage.sealing import Key

from .simfs import SimFileSystem
from .storage_helpers import body_for, new_fs, open_store, open_with_report, put, remove

SEALING_KEY = Key.from_material(b"\x3c" * 32)
FAR_MS = 4_102_444_800_000  # 2100: generations that expire, but not during the test


def _expiring(mutation: Put) -> Put:
    return dataclasses.replace(mutation, expires_at_ms=FAR_MS)


BATCHES: list[list[Any]] = [
    [put("a", "a1"), put("b", "b1"), put("c", "c1"), put("d", "d1")],
    [put("a", "a2"), put("b", "b2")],
    [remove("c"), remove("d")],  # what a delete_prefix of "c".."d" commits
    [put("a", "a3"), _expiring(put("e", "e1"))],  # e is new, and its record holds an expiry
    [_expiring(put("f", "f1")), _expiring(put("b", "b3"))],  # f: named by no other record
]
SWEPT_BATCHES = 3

Model = dict[str, bytes]


def _build(key: Key | None) -> tuple[SimFileSystem, Model, list[tuple[str, int, int]]]:
    """A store after BATCHES, what was acknowledged, and where each batch's bytes lie."""
    fs = new_fs()
    store = open_store(fs, key=key)
    model: Model = {}
    spans = []
    for batch in BATCHES:
        start = (store.state.log.active, store.state.log.offset)
        result = store.commit_durably(batch)
        store.publish(result)
        assert all(outcome.ok for outcome in result.outcomes)
        if store.state.log.active != start[0]:  # the first batch created the segment
            start = (store.state.log.active, SEGMENT_HEADER_BYTES)
        spans.append((store.state.log.path(start[0]), start[1], store.state.log.offset))
        for mutation in batch:
            if isinstance(mutation, Put):
                model[mutation.id] = mutation.body
            else:
                model.pop(mutation.id, None)
    store.close()
    return fs, model, spans


def _unidentified(problems: list[dict[str, Any]]) -> bool:
    return any(p.problem == "damaged" and p.id is None for p in problems)


def _assert_nothing_older(store: Store, model: Model, where: str) -> None:
    _, problems = store.verify()
    told = _unidentified(problems)
    for doc_id in sorted({*model, "a", "b", "c", "d", "e"}):
        try:
            doc = store.reads.read("s", doc_id)
        except CorruptRecord:
            assert any(p.id in (doc_id, None) for p in problems), (where, doc_id)
            continue
        served = doc.body if doc is not None else None
        if served != model.get(doc_id):
            # only a document that no surviving byte names may be missing, and verify says so
            assert served is None and told, (where, doc_id, served, model.get(doc_id))
    try:
        found, _ = store.reads.scan(KeyRange("s"))
    except CorruptRecord:
        return
    listed = {doc_id for doc_id, _ in found}
    assert listed <= set(model), (where, listed - set(model))
    assert listed == set(model) or told, (where, set(model) - listed)


@pytest.mark.parametrize("key", [None, SEALING_KEY], ids=["plaintext", "sealed"])
def test_a_flipped_byte_in_any_of_the_last_batches_never_brings_back_an_older_generation(
    key: Key | None,
) -> None:
    fs, model, spans = _build(key)
    flips = 0
    for path, start, end in spans[-SWEPT_BATCHES:]:
        for offset in range(start, end):
            damaged = copy.deepcopy(fs)
            data = bytearray(damaged.file_bytes(path))
            data[offset] ^= 0xFF
            damaged.set_file_bytes(path, bytes(data))
            where = f"{path}:{offset}"
            store, report = open_with_report(damaged, key=key)
            try:
                assert report.torn_tail is None, (where, report.torn_tail)
                assert report.corruption, where
                _assert_nothing_older(store, model, where)
            finally:
                store.close()
            flips += 1
    assert flips > 300


def _flip(fs: SimFileSystem, path: str, offset: int) -> None:
    data = bytearray(fs.file_bytes(path))
    data[offset] ^= 0xFF
    fs.set_file_bytes(path, bytes(data))


@pytest.mark.parametrize("key", [None, SEALING_KEY], ids=["plaintext", "sealed"])
@pytest.mark.parametrize(
    ("batch", "at", "hurt"),
    [
        (3, "commit", {"a", "e"}),  # the commit record of a mid-log batch
        (2, "commit", {"c", "d"}),  # a delete's: the deleted documents must not come back
        (3, "magic", {"a"}),  # an intent header's magic
        (3, "seq", {"a"}),  # its seq
        (3, "id_hash", {"a"}),  # the hash that names its document
        (4, "commit", {"b", "f"}),  # the last batch's commit: rot, not a torn write
        (4, "magic", {"f"}),  # an expiring record's header: its id follows the expiry
        (4, "id_hash", {"f"}),
    ],
)
def test_the_documents_of_a_rotten_record_are_io_error_and_verify_lists_them(
    key: Key | None, batch: int, at: str, hurt: set[str]
) -> None:
    fs, model, spans = _build(key)
    path, start, end = spans[batch]
    commit_at = end - 76  # a commit record is a 52-byte header and 24 bytes of payload
    offset = {"commit": commit_at + 60, "magic": start, "seq": start + 20, "id_hash": start + 28}[
        at
    ]
    _flip(fs, path, offset)
    store, report = open_with_report(fs, key=key)
    try:
        assert report.torn_tail is None
        assert report.corruption
        for doc_id in sorted({*model, "c", "d"}):
            if doc_id in hurt:
                with pytest.raises(CorruptRecord):
                    store.reads.read("s", doc_id)
            else:
                doc = store.reads.read("s", doc_id)
                assert (doc.body if doc else None) == model.get(doc_id), doc_id
        _, problems = store.verify()
        assert {p.id for p in problems if p.problem == "damaged"} == hurt
        assert store.stats()["damaged_documents"] == len(hurt)
        with pytest.raises(CorruptRecord):
            store.reads.scan(KeyRange("s"))
        with pytest.raises(CorruptRecord, match="a backup would leave them out"):
            store.backup_snapshot()  # refused whole, rather than a backup missing documents
    finally:
        store.close()
    # a new generation heals the document, and the store takes batches after the damage
    store = open_store(fs, key=key)
    try:
        for doc_id in sorted(hurt):
            result = store.commit_durably([put(doc_id, "healed")])
            store.publish(result)
        for doc_id in sorted(hurt):
            doc = store.reads.read("s", doc_id)
            assert doc is not None and doc.body == body_for(doc_id, "healed")
        assert store.stats()["damaged_documents"] == 0
        snapshot = store.backup_snapshot()
        try:
            backed_up = {doc.id for chunk in snapshot.chunks() for doc in chunk}
        finally:
            snapshot.close()
        assert backed_up == set(model) | hurt
    finally:
        store.close()
    store = open_store(fs, key=key)
    try:
        assert store.stats()["damaged_documents"] == 0
        assert {doc_id for doc_id, _ in store.reads.scan(KeyRange("s"))[0]} == set(model) | hurt
    finally:
        store.close()


def test_damage_that_hides_its_document_is_said_so_in_verify_and_at_start() -> None:
    fs, model, spans = _build(SEALING_KEY)
    path, start, _end = spans[3]
    length = int.from_bytes(fs.file_bytes(path)[start + 32 : start + 36], "little")
    second = start + 52 + length  # batch 3's second intent: e, which nothing older names
    for offset in (second + 24, second + 25):  # two bytes of its id hash: past repair
        _flip(fs, path, offset)
    store, report = open_with_report(fs, key=SEALING_KEY)
    try:
        assert report.untold_damage == 1
        assert "no longer tell which document" in report.summary()
        _, problems = store.verify()
        [problem] = [p for p in problems if p.problem == "damaged"]
        assert problem.id is None and problem.offset == second
        assert problem.error is not None and "unknown" in problem.error
        doc = store.reads.read("s", "a")
        assert doc is not None and doc.body == model["a"]  # the batch's other intent stands
    finally:
        store.close()
