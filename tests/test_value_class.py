# The request path's records (value_class.py): by value in equality and hashing,
# carried whole across a process boundary (a worker prepares large requests), and
# immutable to the type checker, which refuses an assignment to a field.
from __future__ import annotations

import pickle
from pathlib import Path

from mypy import api

from sessionstore.wire.messages import Request
from sessionstore.wire.shared import CanonicalItem
from sessionstored.ops.prepare import ReadyDocument
from sessionstored.storage.documents import Document
from sessionstored.storage.mutations import Outcome, Put, Remove

RECORDS = [
    Request("save", {"rid": 1}, rid=1, has_rid=True),
    CanonicalItem(b"\xa0"),
    ReadyDocument(b"\xa0", b"d" * 16, "s"),
    Document("s", "id", 3, b"d" * 16, b"\xa0"),
    Put("s", "id", b"\xa0", b"d" * 16),
    Remove("kv", "k", expired=True),
    Outcome(seq=4, digest=b"d" * 16),
]


def test_records_are_values_and_cross_a_process_boundary_whole() -> None:
    for record in RECORDS:
        copy = pickle.loads(pickle.dumps(record))
        assert copy == record and copy is not record
        assert type(copy) is type(record)
    assert Put("s", "a", b"", b"") == Put("s", "a", b"", b"")
    assert hash(Put("s", "a", b"", b"")) == hash(Put("s", "a", b"", b""))
    assert Put("s", "a", b"", b"") != Put("s", "b", b"", b"")


def test_the_type_checker_refuses_an_assignment_to_a_field(tmp_path: Path) -> None:
    program = tmp_path / "assigns.py"
    program.write_text(
        "from sessionstored.storage.mutations import Put\n"
        "put = Put('s', 'id', b'', b'')\n"
        "put.id = 'other'\n"
    )
    out, _, status = api.run(["--strict", "--no-incremental", str(program)])
    assert status == 1 and "read-only" in out, out
