# `sessionstore export` and `sessionstore import`: every document as one JSON line
# (kind, id, seq, digest, value), the value in the JSON forms of wire/jsonform.py,
# so that reading a line back gives the same canonical bytes and the same digest
# (byte strings, floats and non-text keys included).
#
# An export reads page by page while the daemon serves: each line is one whole
# committed generation with its seq, but the lines are not one point in time (a
# backup is). An import writes create-only unless told to overwrite; a document
# already there at the line's digest is skipped, one there at another is reported
# and left alone; every problem is reported by its line number.
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..client import Client
from ..errors import Conflict, SessionStoreError
from ..wire.canonical import snapshot_digest
from ..wire.jsonform import from_json_value, to_json_value

CHECKPOINT_KINDS = ("loop", "workflow", "kv")
KINDS = ("session", *CHECKPOINT_KINDS)
PAGE = 1000  # the daemon's largest range read


def export_documents(client: Client) -> Iterator[dict[str, Any]]:
    """Every session, then every checkpoint of each kind, in key order."""
    for session_id in client.iter_ids(page=PAGE):
        found = client.load_with_meta(session_id)
        if found["snapshot"] is None:  # deleted since it was listed
            continue
        yield _line("session", session_id, found["seq"], found["digest"], found["snapshot"])
    for kind in CHECKPOINT_KINDS:
        after: str | None = None
        while True:
            page = client.checkpoint_scan(kind, after=after, limit=PAGE)
            for item in page["items"]:
                yield _line(kind, item["key"], item["seq"], item["digest"], item["value"])
            after = page["next"]
            if after is None:
                break


def _line(kind: str, doc_id: str, seq: int, digest: str, value: Any) -> dict[str, Any]:
    return {"kind": kind, "id": doc_id, "seq": seq, "digest": digest, "value": to_json_value(value)}


@dataclass
class ImportReport:
    imported: int = 0
    unchanged: int = 0  # already there at the line's digest
    problems: list[tuple[int, str]] = field(default_factory=list)  # (line number, what)

    def as_dict(self) -> dict[str, Any]:
        return {
            "imported": self.imported,
            "unchanged": self.unchanged,
            "problems": [{"line": line, "problem": what} for line, what in self.problems],
        }


def import_documents(client: Client, lines: Iterable[str], *, overwrite: bool) -> ImportReport:
    report = ImportReport()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            kind, doc_id, digest, value = _read_line(line)
            written = _write(client, kind, doc_id, value, overwrite=overwrite)
        except _Problem as problem:
            report.problems.append((number, str(problem)))
            continue
        except Conflict as conflict:
            current = conflict.details.get("current")
            if current == digest:
                report.unchanged += 1
            else:
                what = f"{kind} {doc_id!r} is there at another digest ({current}); left alone"
                report.problems.append((number, what))
            continue
        except SessionStoreError as error:
            report.problems.append((number, f"{kind} {doc_id!r}: {error.code}: {error}"))
            continue
        if written != digest:
            report.problems.append((number, f"{kind} {doc_id!r} was written at {written}, "
                                            f"not the line's {digest}"))  # fmt: skip
        report.imported += 1
    return report


class _Problem(ValueError):
    pass


def _read_line(line: str) -> tuple[str, str, str, Any]:
    try:
        document = json.loads(line)
    except ValueError as error:
        raise _Problem(f"not JSON: {error}") from None
    if not isinstance(document, dict):
        raise _Problem("not a JSON object")
    kind, doc_id, digest = document.get("kind"), document.get("id"), document.get("digest")
    if kind not in KINDS:
        raise _Problem(f"kind must be one of {', '.join(KINDS)}")
    if not isinstance(doc_id, str) or not isinstance(digest, str) or "value" not in document:
        raise _Problem("a line holds id and digest (text) and value")
    try:
        value = from_json_value(document["value"])
    except ValueError as error:
        raise _Problem(f"value: {error}") from None
    return kind, doc_id, digest, value


def _write(client: Client, kind: str, doc_id: str, value: Any, *, overwrite: bool) -> str:
    """The digest the document was written at; Conflict when it exists (create-only)."""
    if kind == "session":
        if not isinstance(value, dict) or (value.get("session") or {}).get("id") != doc_id:
            raise _Problem(f"session {doc_id!r}: the value is not that session's snapshot")
        saved = client.save(value) if overwrite else client.save(value, expect=None)
        return str(saved["digest"])
    put = {"op": "put", "kind": kind, "key": doc_id, "value": value}
    require = [] if overwrite else [{"kind": kind, "key": doc_id, "exists": False}]
    client.txn([put], require=require)
    return snapshot_digest(value)  # the daemon stores the value's canonical form
