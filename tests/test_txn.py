# storage/txn.py: deciding a transaction against the committed state (the log's
# real index), before anything is applied.
from __future__ import annotations

import pytest

from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal
from sessionstored.storage.documents import Entry
from sessionstored.storage.log.index import Index
from sessionstored.storage.txn import (
    Change,
    Require,
    TxnAppend,
    TxnDelete,
    TxnDeletePrefix,
    TxnPut,
    appended_key,
    decide,
)

KIND = "k"


def _index(*ids: str) -> Index:
    index = Index()
    for seq, doc_id in enumerate(ids, start=1):
        index.put(KIND, doc_id, Entry(seq, bytes([seq]) * 16, 10, 1, 32 * seq, 80))
    return index


def test_requirements_are_checked_first_and_name_the_one_that_failed() -> None:
    index = _index("a")
    stored = index.get(KIND, "a")
    assert stored is not None
    decide((Require(KIND, "a", exists=True), Require(KIND, "b", exists=False)), (), index, 5)
    for requires, number in (
        ((Require(KIND, "a", exists=True), Require(KIND, "b", exists=True)), 1),
        ((Require(KIND, "a", exists=False),), 0),
        ((Require(KIND, "a", digest=b"\0" * 16),), 0),
    ):
        with pytest.raises(Refusal) as refused:
            decide(requires, (TxnPut(KIND, "c", b"x", b"d" * 16),), index, 5)
        assert refused.value.code is ErrorCode.CONFLICT
        assert refused.value.details["failed"] == number
    decide((Require(KIND, "a", digest=stored.digest),), (), index, 5)


def test_each_op_reports_what_it_did() -> None:
    index = _index("keep", "old", "logs/1", "logs/2", "other/1")
    changes, results = decide(
        (),
        (
            TxnPut(KIND, "keep", b"new", b"n" * 16, if_absent=True),
            TxnPut(KIND, "fresh", b"f", b"f" * 16),
            TxnDelete(KIND, "old"),
            TxnDelete(KIND, "never"),
            TxnDeletePrefix(KIND, "logs/"),
            TxnAppend(KIND, "events/", b"e", b"e" * 16),
        ),
        index,
        first_seq=7,
    )
    # the append takes the seq its change gets: 7 + the four changes before it
    key = appended_key("events/", 11)
    assert key == "events/00000000000000000011"
    assert results == [
        {"written": False},
        {"written": True},
        {"deleted": True},
        {"deleted": False},
        {"deleted": 2},
        {"key": key},
    ]
    assert changes == [
        Change(KIND, "fresh", b"f", b"f" * 16),
        Change(KIND, "old", None, None),
        Change(KIND, "logs/1", None, None),
        Change(KIND, "logs/2", None, None),
        Change(KIND, key, b"e", b"e" * 16),
    ]
    assert index.get(KIND, "old") is not None  # nothing is applied here


def test_a_key_changed_twice_is_refused() -> None:
    index = _index("logs/1")
    with pytest.raises(Refusal, match="names one key twice"):
        decide((), (TxnPut(KIND, "a", b"1", b"1" * 16), TxnDelete(KIND, "a")), index, 1)
    with pytest.raises(Refusal, match="changes 'logs/1' twice"):
        decide((), (TxnDelete(KIND, "logs/1"), TxnDeletePrefix(KIND, "logs/")), index, 1)
