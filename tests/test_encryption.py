# Encryption at rest over the simulated filesystem: nothing readable on disk,
# the right key and only the right key opens the store, tampering is caught,
# and a key rotation survives a crash at every step.
from __future__ import annotations

import contextlib
from typing import Any

import pytest
import xxhash

from sessionstore.wire.canonical import canonical_dumps, digest_bytes_of_canonical
from sessionstored.storage.documents import Document
from sessionstored.storage.errors import CorruptRecord, KeyFileError, StoreFormatError
from sessionstored.storage.log.metadata import REKEY_FILE
from sessionstored.storage.log.records import HEADER, HEADER_BYTES, HEADER_CHECK, encode_data
from sessionstored.storage.log.rekey import begin_rekey
from sessionstored.storage.log.store import Store
from sessionstored.storage.mutations import LEASE, LEASE_ID, Put, Rewrite
from sessionstored.storage.sealing import PLAINTEXT, Key, Sealer, parse_key

from .simfs import SimFileSystem, SimulatedCrash
from .storage_helpers import ROOT, all_documents, assert_clean, new_fs, open_store, put, remove

KEY_A = Key.from_material(bytes(range(32)))
KEY_B = Key.from_material(bytes(range(100, 132)))
SECRET = "hunter2-TOP-SECRET-PROMPT"
SECRET_ID = "session-of-alice-7f3a"
SECRET_RUN = "run-for-alice-19"
SECRET_HOLDER = "agent-alice-host"


def _open(fs: SimFileSystem, key: Key | None) -> Store:
    return open_store(fs, key=key)


def _lease(holder: str) -> Rewrite:
    return Rewrite(
        LEASE,
        LEASE_ID,
        lambda _current, _source: canonical_dumps({"holder": holder, "epoch": 1}),
        decides_lease=True,
        exclusive=True,
    )


def _checkpoint(run_id: str, value: Any) -> Put:
    body = canonical_dumps({"run_id": run_id, "value": value})
    return Put("l", run_id, body, digest_bytes_of_canonical(body))


def _fill(store: Store) -> None:
    store.commit([put(SECRET_ID, SECRET), put("other", 1), _checkpoint(SECRET_RUN, SECRET)])
    store.commit([_lease(SECRET_HOLDER)])
    store.compact()
    store.commit([put(SECRET_ID, SECRET + "-2"), put("third", [SECRET])])


def _readable_secrets(fs: SimFileSystem) -> list[tuple[str, str]]:
    found = []
    for path, data in fs.all_files().items():
        for needle in (SECRET, SECRET_ID, SECRET_RUN, SECRET_HOLDER):
            if needle.encode() in data or needle.encode() in path.encode():
                found.append((path, needle))
    return found


def test_a_plaintext_store_shows_the_secrets_and_a_sealed_one_does_not() -> None:
    plain_fs = new_fs()
    _fill(_open(plain_fs, None))
    assert _readable_secrets(plain_fs), "the probe must be able to see plaintext"
    fs = new_fs()
    store = _open(fs, KEY_A)
    _fill(store)
    assert store.encrypted
    assert _readable_secrets(fs) == []
    assert fs.file_bytes(f"{ROOT}/FORMAT").endswith(f"key-id {KEY_A.key_id_hex}\n".encode())


def test_the_key_round_trips_every_document_across_a_restart() -> None:
    fs = new_fs()
    store = _open(fs, KEY_A)
    _fill(store)
    before = (store.seq, all_documents(store))
    store.close()
    fs.crash("drop")
    again = _open(fs, KEY_A)
    assert (again.seq, all_documents(again)) == before
    assert again.lease is not None and again.lease["holder"] == SECRET_HOLDER
    assert_clean(again)


def test_without_the_key_or_with_another_the_store_refuses_to_open() -> None:
    fs = new_fs()
    _open(fs, KEY_A).close()
    with pytest.raises(StoreFormatError, match=r"encrypted .* no key was given"):
        _open(fs, None)
    with pytest.raises(StoreFormatError, match="wrong key"):
        _open(fs, KEY_B)
    plain = new_fs()
    _open(plain, None).close()
    with pytest.raises(StoreFormatError, match="not encrypted but a key was given"):
        _open(plain, KEY_A)


def _problem_ids(store: Store) -> list[str]:
    return sorted(p.id or "" for p in store.verify()[1])


def _record(store: Store, fs: SimFileSystem, doc_id: str) -> tuple[str, int, bytes]:
    entry = store.state.index.get("s", doc_id)
    assert entry is not None
    path = store.state.log.path(entry.segment)
    return path, entry.offset, fs.file_bytes(path)[entry.offset : entry.offset + entry.length]


def _overwrite(fs: SimFileSystem, path: str, offset: int, data: bytes) -> None:
    whole = bytearray(fs.file_bytes(path))
    whole[offset : offset + len(data)] = data
    fs.set_file_bytes(path, bytes(whole))


def _with_payload(record: bytes, payload: bytes) -> bytes:
    """A record with another payload of the same length, its checksums made to match."""
    fields = list(HEADER.unpack_from(record, 0))
    fields[-1] = xxhash.xxh3_64_intdigest(payload)
    head = HEADER.pack(*fields)
    return head + HEADER_CHECK.pack(xxhash.xxh3_64_intdigest(head)) + payload


def test_sealed_records_swapped_between_ids_do_not_open() -> None:
    fs = new_fs()
    store = _open(fs, KEY_A)
    store.commit([put("a", "alpha"), put("b", "gamma"), put("c", "delta")])
    (a_path, a_at, a_rec), (b_path, b_at, b_rec) = _record(store, fs, "a"), _record(store, fs, "b")
    _overwrite(fs, a_path, a_at, b_rec)  # the whole record: it names another document
    _overwrite(fs, b_path, b_at, _with_payload(b_rec, a_rec[HEADER_BYTES:]))  # only the payload
    store.state.cache.discard("s", "a")
    store.state.cache.discard("s", "b")
    with pytest.raises(CorruptRecord, match="holds another document"):
        store.reads.read("s", "a")
    with pytest.raises(CorruptRecord, match="does not authenticate"):
        store.reads.read("s", "b")
    assert store.reads.read("s", "c") is not None
    assert _problem_ids(store) == ["a", "b"]


def test_a_plaintext_or_foreign_key_record_in_a_sealed_store_is_never_served() -> None:
    fs = new_fs()
    store = _open(fs, KEY_A)
    store.commit([put("a", "alpha"), put("b", "beta")])
    for doc_id, sealer, problem in (
        ("a", PLAINTEXT, "plaintext in an encrypted store"),
        ("b", Sealer(KEY_B), "sealed with another key"),
    ):
        entry = store.state.index.get("s", doc_id)
        doc = store.reads.read("s", doc_id)
        assert entry is not None and doc is not None
        injected = encode_data(
            sealer, store.state.batch, Document("s", doc_id, doc.seq, doc.digest, doc.body)
        )
        _overwrite(fs, store.state.log.path(entry.segment), entry.offset, injected)
        store.state.index.put("s", doc_id, entry._replace(length=len(injected)))
        store.state.cache.discard("s", doc_id)
        with pytest.raises(CorruptRecord, match=problem):
            store.reads.read("s", doc_id)
    assert _problem_ids(store) == ["a", "b"]


def test_key_files_take_raw_bytes_or_hex_and_nothing_else() -> None:
    raw = bytes(range(32))
    assert parse_key(raw, "k").key_id == parse_key(raw.hex().encode() + b"\n", "k").key_id
    for bad in (b"", b"short", raw + b"x", b"zz" * 32):
        with pytest.raises(KeyFileError, match="32 raw bytes or 64 hex digits"):
            parse_key(bad, "k")


@pytest.mark.parametrize(
    ("old", "new"), [(None, KEY_A), (KEY_A, None), (KEY_A, KEY_B)], ids=["seal", "unseal", "rotate"]
)
def test_rekey_moves_every_document_to_the_new_key(old: Key | None, new: Key | None) -> None:
    fs = new_fs()
    store = _open(fs, old)
    _fill(store)
    before = (store.seq, all_documents(store))
    begin_rekey(store, new)
    assert (store.seq, all_documents(store)) == before
    store.close()
    fs.crash("drop")
    if new is not None:
        assert _readable_secrets(fs) == []
    with pytest.raises(StoreFormatError):
        _open(fs, old)
    again = _open(fs, new)
    assert (again.seq, all_documents(again)) == before
    assert_clean(again)


def _rekey_setup() -> tuple[SimFileSystem, tuple[int, dict[tuple[str, str], bytes]]]:
    fs = new_fs()
    store = _open(fs, KEY_A)
    _fill(store)
    store.commit([remove("other")])
    state = (store.seq, all_documents(store))
    store.close()
    return fs, state


def _rekey_steps() -> int:
    fs, _ = _rekey_setup()
    store = _open(fs, KEY_A)
    before = fs.steps
    begin_rekey(store, KEY_B)
    return fs.steps - before


@pytest.mark.parametrize("keep_unsynced", [False, True], ids=["power-loss", "process-kill"])
def test_rekey_survives_a_crash_at_every_step(keep_unsynced: bool) -> None:
    total = _rekey_steps()
    assert total > 20
    for step in range(total + 1):
        fs, expected = _rekey_setup()
        store = _open(fs, KEY_A)
        fs.arm(step)
        with contextlib.suppress(SimulatedCrash):
            begin_rekey(store, KEY_B)
        fs.crash("keep" if keep_unsynced else "drop")
        if fs.exists(f"{ROOT}/{REKEY_FILE}"):
            # mid-rotation the store opens with either key, and the open finishes it
            recovered = _open(fs, KEY_A if step % 2 else KEY_B)
        elif fs.file_bytes(f"{ROOT}/FORMAT").endswith(f"{KEY_A.key_id_hex}\n".encode()):
            # the rotation had not begun: the store is A's alone, and a rerun does it
            with pytest.raises(StoreFormatError, match="wrong key"):
                _open(fs, KEY_B)
            recovered = _open(fs, KEY_A)
            begin_rekey(recovered, KEY_B)
        else:
            recovered = _open(fs, KEY_B)
        assert (recovered.seq, all_documents(recovered)) == expected, step
        assert recovered.lease is not None and recovered.lease["holder"] == SECRET_HOLDER
        assert_clean(recovered)
        recovered.close()
        fs.crash("drop")
        assert not fs.exists(f"{ROOT}/{REKEY_FILE}")
        with pytest.raises(StoreFormatError, match="wrong key"):
            _open(fs, KEY_A)
        again = _open(fs, KEY_B)
        assert (again.seq, all_documents(again)) == expected, step
        assert _readable_secrets(fs) == []
        again.close()


def test_a_crashed_rekey_refuses_a_third_key_in_one_line() -> None:
    fs, _ = _rekey_setup()
    store = _open(fs, KEY_A)
    fs.arm(_rekey_steps() // 2)
    with contextlib.suppress(SimulatedCrash):
        begin_rekey(store, KEY_B)
    fs.crash("drop")
    third = Key.from_material(b"\x07" * 32)
    for key in (None, third):
        with pytest.raises(StoreFormatError, match=r"key rotation .* is unfinished") as error:
            _open(fs, key)
        assert "\n" not in str(error.value)


def test_finishing_a_rotation_survives_a_crash_at_every_step_of_its_own() -> None:
    fs, expected = _rekey_setup()
    store = _open(fs, KEY_A)
    fs.arm(_rekey_steps() // 3)
    with contextlib.suppress(SimulatedCrash):
        begin_rekey(store, KEY_B)
    fs.crash("drop")
    assert fs.exists(f"{ROOT}/{REKEY_FILE}")
    attempts = 0
    while True:
        fs.arm(attempts)
        try:
            finished = _open(fs, KEY_B if attempts % 2 else KEY_A)
        except SimulatedCrash:
            fs.crash("drop")
            attempts += 1
            continue
        break
    assert attempts > 20
    assert (finished.seq, all_documents(finished)) == expected
    assert_clean(finished)
    finished.close()
    fs.crash("drop")
    assert (_open(fs, KEY_B).seq, not fs.exists(f"{ROOT}/{REKEY_FILE}")) == (expected[0], True)
