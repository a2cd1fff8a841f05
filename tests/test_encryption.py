# Encryption at rest over the simulated filesystem: nothing readable on disk,
# the right key and only the right key opens the store, tampering is caught,
# and a key rotation survives a crash at every step.
from __future__ import annotations

import contextlib
from typing import Any

import pytest

from sessionstore.canonical import canonical_dumps, digest_bytes_of_canonical
from sessionstored.storage.check import check
from sessionstored.storage.files import CorruptDocument, Document, encode_document
from sessionstored.storage.metadata import REKEY_FILE, StoreFormatError
from sessionstored.storage.mutations import LEASE, LEASE_ID, Put, Rewrite
from sessionstored.storage.rekey import begin_rekey
from sessionstored.storage.sealing import Key, KeyFileError, parse_key
from sessionstored.storage.store import Store

from .simfs import SimFileSystem, SimulatedCrash
from .storage_helpers import ROOT, all_documents, assert_clean, new_fs, put, remove

KEY_A = Key.from_material(bytes(range(32)))
KEY_B = Key.from_material(bytes(range(100, 132)))
SECRET = "hunter2-TOP-SECRET-PROMPT"
SECRET_ID = "session-of-alice-7f3a"
SECRET_RUN = "run-for-alice-19"
SECRET_HOLDER = "agent-alice-host"


def _open(fs: SimFileSystem, key: Key | None) -> Store:
    store = Store(fs, ROOT, key=key)
    store.open()
    return store


def _lease(holder: str) -> Rewrite:
    return Rewrite(
        LEASE,
        LEASE_ID,
        lambda _current, _source: canonical_dumps({"holder": holder, "epoch": 1}),
        fenced=False,
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
    fs.crash(keep_unsynced=False)
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


def _problem_files(store: Store) -> list[str]:
    return sorted(p["file"].rsplit("/", 1)[1] for p in check(store)[1])


def test_sealed_files_swapped_between_ids_do_not_open() -> None:
    fs = new_fs()
    store = _open(fs, KEY_A)
    store.commit([put("a", "alpha"), put("b", "beta"), put("c", "gamma")])
    a_path, b_path = store.files.path("s", "a"), store.files.path("s", "b")
    a_bytes, b_bytes = fs.file_bytes(a_path), fs.file_bytes(b_path)
    fs.set_file_bytes(a_path, b_bytes)
    fs.set_file_bytes(b_path, a_bytes)
    for doc_id in ("a", "b"):
        with pytest.raises(CorruptDocument, match="does not authenticate"):
            store.read("s", doc_id)
    assert store.read("s", "c") is not None
    assert _problem_files(store) == sorted([a_path.rsplit("/", 1)[1], b_path.rsplit("/", 1)[1]])


def test_a_plaintext_or_foreign_key_document_in_a_sealed_store_is_never_served() -> None:
    fs = new_fs()
    store = _open(fs, KEY_A)
    store.commit([put("a", "alpha"), put("b", "beta")])
    entry = store.index.get("s", "a")
    assert entry is not None
    body = store.read("s", "a")
    assert body is not None
    injected = encode_document(Document("s", "a", entry.seq, entry.digest, body.body))
    fs.set_file_bytes(store.files.path("s", "a"), injected)
    store.cache.discard("s", "a")
    with pytest.raises(CorruptDocument, match="plaintext in an encrypted store"):
        store.read("s", "a")

    foreign_fs = new_fs()
    foreign = _open(foreign_fs, KEY_B)
    foreign.commit([put("b", "beta")])
    foreign_bytes = foreign_fs.file_bytes(foreign.files.path("s", "b"))
    fs.set_file_bytes(store.files.path("s", "b"), foreign_bytes)
    store.cache.discard("s", "b")
    with pytest.raises(CorruptDocument, match="sealed with another key"):
        store.read("s", "b")
    assert len(_problem_files(store)) == 2


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
    fs.crash(keep_unsynced=False)
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
        fs.crash(keep_unsynced=keep_unsynced)
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
        fs.crash(keep_unsynced=False)
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
    fs.crash(keep_unsynced=False)
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
    fs.crash(keep_unsynced=False)
    assert fs.exists(f"{ROOT}/{REKEY_FILE}")
    attempts = 0
    while True:
        fs.arm(attempts)
        try:
            finished = _open(fs, KEY_B if attempts % 2 else KEY_A)
        except SimulatedCrash:
            fs.crash(keep_unsynced=False)
            attempts += 1
            continue
        break
    assert attempts > 20
    assert (finished.seq, all_documents(finished)) == expected
    assert_clean(finished)
    finished.close()
    fs.crash(keep_unsynced=False)
    assert (_open(fs, KEY_B).seq, not fs.exists(f"{ROOT}/{REKEY_FILE}")) == (expected[0], True)
