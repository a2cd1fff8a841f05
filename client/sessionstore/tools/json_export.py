# `sessionstore export` and `sessionstore import`: every document as one JSON line
# (kind, id, seq, digest, value), the value in the JSON forms of wire/jsonform.py,
# so that reading a line back gives the same canonical bytes and the same digest
# (byte strings, floats and non-text keys included).
#
# An export reads page by page while the daemon serves: each line is one whole
# committed generation with its seq (and expires_at_ms, for one that expires),
# but the lines are not one point in time (a backup is). An import writes
# create-only unless told to overwrite; a document already there at the line's
# digest is skipped, one there at another is reported and left alone; every
# problem is reported by its line number. An expiring document gets the time it
# had left; one that expired since the export is skipped (counted as expired).
#
# A line is read as bytes, at most max_line_bytes of them, so that a file with no
# line ends (/dev/zero) or one huge line cannot exhaust memory: a longer line
# stops the import there. Each line is checked whole before anything is sent:
# UTF-8, JSON (numbers within CBOR's range, nesting Python can decode), the
# nesting depth of the request it makes (a request deeper than the daemon's
# limit would cost the connection), text that UTF-8 can hold. A line is one
# request, so it is imported whole or not at all.
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import cbor2

from ..client import UNSET, Client
from ..errors import Conflict, SessionStoreError
from ..wire import jsonform
from ..wire.canonical import snapshot_digest
from ..wire.jsonform import containers_deep, from_json_value, to_json_value
from ..wire.shared import MAX_NESTING_DEPTH
from .cli_common import EXIT_CONFLICT, EXIT_ERROR, EXIT_OF_CODE, EXIT_OK, EXIT_USAGE

CHECKPOINT_KINDS = ("loop", "workflow", "kv")
KINDS = ("session", *CHECKPOINT_KINDS)
PAGE = 1000  # the daemon's largest range read
# A JSON line is longer than the CBOR it stands for (base64 is 4/3 of the bytes,
# escapes and wrappers more); a line up to this many times the daemon's
# max_request_bytes is read, a longer one stops the import.
LINE_BYTES_PER_REQUEST_BYTE = 4
REQUEST_CONTAINERS_MAX = MAX_NESTING_DEPTH + 1  # nested maps and arrays, the request's own
# containers around the value: {op, args: {snapshot}} and {op, args: {ops: [{value}]}}
ENVELOPE_CONTAINERS = {"session": 2, "loop": 4, "workflow": 4, "kv": 4}
# a value's JSON form nests at most 3 levels per CBOR level ({"$map": [[k, v]]})
JSON_CONTAINERS_MAX = 3 * REQUEST_CONTAINERS_MAX


def export_documents(client: Client) -> Iterator[dict[str, Any]]:
    """Every session, then every checkpoint of each kind, in key order."""
    for session_id in client.iter_ids(page=PAGE):
        found = client.load_with_meta(session_id)
        if found["snapshot"] is None or found["seq"] is None or found["digest"] is None:
            continue  # deleted since it was listed
        yield _line(
            "session", session_id, found["seq"], found["digest"], found["snapshot"],
            found.get("expires_at_ms"),
        )  # fmt: skip
    for kind in CHECKPOINT_KINDS:
        after: str | None = None
        while True:
            page = client.checkpoint_scan(kind, after=after, limit=PAGE)
            for item in page["items"]:
                yield _line(
                    kind, item["key"], item["seq"], item["digest"], item["value"],
                    item.get("expires_at_ms"),
                )  # fmt: skip
            after = page["next"]
            if after is None:
                break


def _line(
    kind: str, doc_id: str, seq: int, digest: str, value: Any, expires_at_ms: int | None
) -> dict[str, Any]:
    line = {"kind": kind, "id": doc_id, "seq": seq, "digest": digest}
    if expires_at_ms:
        line["expires_at_ms"] = expires_at_ms
    return {**line, "value": to_json_value(value)}


@dataclass
class ImportReport:
    imported: int = 0
    unchanged: int = 0  # already there at the line's digest
    expired: int = 0  # expired since the export: skipped
    problems: list[tuple[int, str]] = field(default_factory=list)  # (line number, what)
    stopped: str | None = None  # why the import ended before the file did
    # the CLI exit code each problem (and the stop) calls for, as `put` and `get` exit
    exits: set[int] = field(default_factory=set)

    def problem(self, line: int, what: str, exit_code: int) -> None:
        self.problems.append((line, what))
        self.exits.add(exit_code)

    def stop(self, why: str, exit_code: int) -> None:
        self.stopped = why
        self.exits.add(exit_code)

    def exit_code(self) -> int:
        """0 for a clean import; for problems of one class, that class's code (2 for
        input, 5 for a document there at another digest, ...); 1 for several."""
        if not self.exits:
            return EXIT_OK
        return next(iter(self.exits)) if len(self.exits) == 1 else EXIT_ERROR

    def as_dict(self) -> dict[str, Any]:
        return {
            "imported": self.imported,
            "unchanged": self.unchanged,
            "expired": self.expired,
            "problems": [{"line": line, "problem": what} for line, what in self.problems],
            "stopped": self.stopped,
        }


class LineTooLong(ValueError):
    def __init__(self, line: int, max_line_bytes: int) -> None:
        super().__init__(
            f"line {line} is longer than {max_line_bytes} bytes; stopped there "
            "(--max-line-mib reads longer lines)"
        )


def read_lines(source: IO[bytes], max_line_bytes: int) -> Iterator[bytes]:
    """Each line of source without its line end; LineTooLong past max_line_bytes."""
    number = 0
    while chunk := source.readline(max_line_bytes + 1):
        number += 1
        line = chunk.removesuffix(b"\n")
        if len(line) > max_line_bytes:
            raise LineTooLong(number, max_line_bytes)
        yield line


def max_line_bytes(client: Client) -> int:
    limits = client.hello()["limits"]
    return int(limits["max_request_bytes"]) * LINE_BYTES_PER_REQUEST_BYTE


def import_documents(
    client: Client, lines: Iterable[bytes], *, overwrite: bool, report: ImportReport | None = None
) -> ImportReport:
    """Into report (a new one by default), which holds what came before an exception
    from lines (LineTooLong, a read error)."""
    report = ImportReport() if report is None else report
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            kind, doc_id, digest, value, expires_at_ms = _read_line(line)
            ttl_s = None
            if expires_at_ms is not None:
                ttl_s = (expires_at_ms - time.time_ns() // 1_000_000) / 1000
                if ttl_s <= 0:
                    report.expired += 1
                    continue
            # create-only: what is there is read first, so that a document already there
            # costs no refused write (which the daemon's stats would count as an error)
            current = None if overwrite else _stored_digest(client, kind, doc_id)
            if current is None:
                written = _write(client, kind, doc_id, value, overwrite=overwrite, ttl_s=ttl_s)
        except _Problem as problem:
            report.problem(number, str(problem), EXIT_USAGE)
            continue
        except Conflict as conflict:  # written meanwhile by another client
            current = conflict.details.get("current")
        except SessionStoreError as error:
            exit_code = EXIT_OF_CODE.get(error.code, EXIT_ERROR)
            report.problem(number, f"{kind} {doc_id!r}: {error.code}: {error}", exit_code)
            continue
        if current == digest:
            report.unchanged += 1
        elif current is not None:
            what = f"{kind} {doc_id!r} is there at another digest ({current}); left alone"
            report.problem(number, what, EXIT_CONFLICT)
        else:
            if written != digest:
                what = f"{kind} {doc_id!r} was written at {written}, not the line's {digest}"
                report.problem(number, what, EXIT_USAGE)
            report.imported += 1
    return report


def _stored_digest(client: Client, kind: str, doc_id: str) -> str | None:
    if kind == "session":
        return client.head(doc_id)["digest"]
    page = client.checkpoint_scan(kind, doc_id, limit=1, values=False)["items"]
    return str(page[0]["digest"]) if page and page[0]["key"] == doc_id else None


class _Problem(ValueError):
    pass


def _read_line(line: bytes) -> tuple[str, str, str, Any, int | None]:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = line[error.start]
        raise _Problem(f"not UTF-8: byte 0x{bad:02x} at offset {error.start}") from None
    try:
        document = jsonform.loads(text)
    except ValueError as error:
        raise _Problem(f"not JSON: {error}") from None
    except RecursionError:
        raise _Problem("not JSON that Python can decode: nested too deeply") from None
    if not isinstance(document, dict):
        raise _Problem("not a JSON object")
    kind, doc_id, digest = document.get("kind"), document.get("id"), document.get("digest")
    if kind not in KINDS:
        raise _Problem(f"kind must be one of {', '.join(KINDS)}")
    if not isinstance(doc_id, str) or not isinstance(digest, str) or "value" not in document:
        raise _Problem("a line holds id and digest (text) and value")
    expires_at_ms = document.get("expires_at_ms")
    if expires_at_ms is not None and (type(expires_at_ms) is not int or expires_at_ms <= 0):
        raise _Problem("expires_at_ms must be a positive integer (ms since the epoch)")
    most = REQUEST_CONTAINERS_MAX - ENVELOPE_CONTAINERS[kind]
    if containers_deep(document["value"]) > JSON_CONTAINERS_MAX:
        raise _Problem(f"value: nested deeper than the daemon takes ({most} levels)")
    try:
        value = from_json_value(document["value"])
    except ValueError as error:
        raise _Problem(f"value: {error}") from None
    if (deep := containers_deep(value)) > most:
        raise _Problem(f"value: nested {deep} levels deep; the daemon takes {most}")
    try:
        cbor2.dumps(value)
    except UnicodeEncodeError:
        raise _Problem("value: text with a lone surrogate escape is not Unicode") from None
    return kind, doc_id, digest, value, expires_at_ms


def _write(
    client: Client, kind: str, doc_id: str, value: Any, *, overwrite: bool, ttl_s: float | None
) -> str:
    """The digest the document was written at; Conflict when it exists (create-only)."""
    ttl = {} if ttl_s is None else {"ttl_s": ttl_s}
    if kind == "session":
        if not isinstance(value, dict) or (value.get("session") or {}).get("id") != doc_id:
            raise _Problem(f"session {doc_id!r}: the value is not that session's snapshot")
        expires = UNSET if ttl_s is None else ttl_s
        expect = UNSET if overwrite else None  # create-only unless told to overwrite
        saved = client.save(value, expect=expect, ttl_s=expires)
        return str(saved["digest"])
    put = {"op": "put", "kind": kind, "key": doc_id, "value": value, **ttl}
    require = [] if overwrite else [{"kind": kind, "key": doc_id, "exists": False}]
    client.txn([put], require=require)
    return snapshot_digest(value)  # the daemon stores the value's canonical form
