# The `sessionstore` commands, each a function of the client, its arguments and the
# output, returning the exit code (cli_common.py); cli_parser.py names them.
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import cbor2

from ..client import UNSET, Client
from ..errors import SessionStoreError
from ..paths import client_socket, default_socket, state_dir
from ..wire import jsonform
from ..wire.jsonform import from_json_value
from ..wire.protocol import END_OF_STREAM, NEED_DATA, Connection, Mode
from . import a3s_import, backup_command, json_export, top
from .cli_common import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    Output,
    UsageError,
    expect,
    json_arg,
    lease_option,
    read_json,
    with_progress,
)

Handler = Callable[[Client, argparse.Namespace, Output], int]


def cmd_get(client: Client, args: argparse.Namespace, out: Output) -> int:
    at = UNSET if args.at is None else args.at
    result = client.load_with_meta(args.session_id, at=at)
    if result["snapshot"] is None:
        print(f"sessionstore: no session {args.session_id!r}", file=sys.stderr)
        return EXIT_NOT_FOUND
    out.emit(result if args.meta else result["snapshot"])
    return EXIT_OK


def cmd_head(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.head(args.session_id)
    out.emit(result)
    return EXIT_OK if result["found"] else EXIT_NOT_FOUND


def cmd_exists(client: Client, args: argparse.Namespace, out: Output) -> int:
    found = client.exists(args.session_id)
    out.emit({"exists": found}, lambda value: "yes" if value["exists"] else "no")
    return EXIT_OK if found else EXIT_NOT_FOUND


def cmd_put(client: Client, args: argparse.Namespace, out: Output) -> int:
    snapshot = read_json(args.file)
    saved = client.save(snapshot, expect=expect(args), lease=lease_option(args), ttl_s=_ttl(args))
    out.emit(saved)
    return EXIT_OK


def _ttl(args: argparse.Namespace) -> float | Any:
    return args.ttl if args.ttl is not None else UNSET


def _expire(client: Client, args: argparse.Namespace, out: Output) -> int:
    """EXPIRE ID SECONDS, and PERSIST ID (seconds None): exit 3 when there is no such one."""
    seconds = getattr(args, "seconds", None)
    if args.kind is None:
        result = client.expire(args.id, seconds, lease=lease_option(args))
    else:
        result = client.expire(None, seconds, kind=args.kind, key=args.id, lease=lease_option(args))
    out.emit(result)
    if not result["found"]:
        what = f"{args.kind} document" if args.kind else "session"
        print(f"sessionstore: no {what} {args.id!r}", file=sys.stderr)
        return EXIT_NOT_FOUND
    return EXIT_OK


def cmd_rm(client: Client, args: argparse.Namespace, out: Output) -> int:
    out.emit(client.delete(args.session_id, expect=expect(args), lease=lease_option(args)))
    return EXIT_OK


def _ls_page(
    client: Client, args: argparse.Namespace, after: str | None, limit: int
) -> tuple[list[str], str | None]:
    if args.kind == "session":
        page = client.list(args.prefix, after=after, limit=limit)
        return page["ids"], page["next"]
    found = client.checkpoint_scan(
        args.kind, args.prefix, after=after, limit=min(limit, 1000), values=False
    )
    return [item["key"] for item in found["items"]], found["next"]


def cmd_ls(client: Client, args: argparse.Namespace, out: Output) -> int:
    """One id (or key) per line, on a terminal or through a pipe; with --json one line
    {"ids": [...], "next": cursor or null}, the same shape with or without --limit."""
    ids: list[str] = []
    after, cursor = args.after, None
    while True:
        want = args.limit - len(ids) if args.limit is not None else 1000
        page, cursor = _ls_page(client, args, after, want)
        ids.extend(page)
        if cursor is None or (args.limit is not None and len(ids) >= args.limit):
            break
        after = cursor
    if args.json:
        out.emit({"ids": ids, "next": cursor})
    else:
        for doc_id in ids:
            sys.stdout.write(doc_id + "\n")
        sys.stdout.flush()
        if not ids and sys.stdout.isatty():
            print("(none)", file=sys.stderr)
    if cursor is not None and not args.json:
        print(f"sessionstore: more after {cursor!r}: pass --after {cursor!r}", file=sys.stderr)
    return EXIT_OK


def cmd_verify(client: Client, _args: argparse.Namespace, out: Output) -> int:
    result = with_progress("verify", client.verify)
    out.emit(result)
    return EXIT_PROBLEMS if result["problems"] else EXIT_OK


def cmd_compact(client: Client, _args: argparse.Namespace, out: Output) -> int:
    out.emit(with_progress("compact", client.compact))
    return EXIT_OK


def simple_command(op: str) -> Handler:
    def run(client: Client, _args: argparse.Namespace, out: Output) -> int:
        out.emit(client.call(op))
        return EXIT_OK

    return run


def cmd_update(client: Client, args: argparse.Namespace, out: Output) -> int:
    value = json_arg(sys.stdin.read() if args.value == "-" else args.value, "value")
    result = client.update(
        args.session_id, args.component, value, expect=expect(args), lease=lease_option(args)
    )
    out.emit(result)
    return EXIT_OK


def cmd_fork(client: Client, args: argparse.Namespace, out: Output) -> int:
    lease, at = lease_option(args), UNSET if args.at is None else args.at
    out.emit(client.fork(args.session_id, args.new_session_id, args.workspace, lease=lease, at=at))
    return EXIT_OK


def cmd_history(client: Client, args: argparse.Namespace, out: Output) -> int:
    generations = client.history(args.session_id)
    if not generations:
        print(f"sessionstore: no session {args.session_id!r}", file=sys.stderr)
        return EXIT_NOT_FOUND
    for generation in generations:
        print(json.dumps(generation, sort_keys=True))
    return EXIT_OK


def cmd_revert(client: Client, args: argparse.Namespace, out: Output) -> int:
    reverted = client.revert(
        args.session_id, args.seq, expect=expect(args), lease=lease_option(args)
    )
    out.emit(reverted)
    return EXIT_OK


def cmd_checkpoint(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.action != "put" and args.value is not None:
        raise UsageError(f"checkpoint {args.action} takes no value: unexpected {args.value!r}")
    lease = lease_option(args)
    if args.action == "put":
        text = sys.stdin.read() if args.value in (None, "-") else args.value
        value = json_arg(text, "value")
        put = client.checkpoint_put(args.kind, args.key, value, lease=lease, ttl_s=_ttl(args))
        out.emit({"seq": put["seq"]})
    elif args.action == "get":
        found = client.call("checkpoint_get", kind=args.kind, key=args.key)
        if found["value"] is None:
            print(f"sessionstore: no {args.kind} checkpoint {args.key!r}", file=sys.stderr)
            return EXIT_NOT_FOUND
        out.emit(found if args.meta else found["value"])
    else:
        out.emit({"deleted": client.checkpoint_delete(args.kind, args.key, lease=lease)})
    return EXIT_OK


def cmd_lease(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.action == "acquire":
        if not args.holder:
            raise UsageError("lease acquire needs --holder NAME")
        lease = client.lease_acquire(args.holder)
        out.emit(lease)
        print(
            f"sessionstore: write with --lease {lease['holder']}:{lease['epoch']}", file=sys.stderr
        )
    elif args.action == "get":
        out.emit(client.lease_get())
    else:
        if not args.holder or args.epoch is None:
            raise UsageError("lease release needs --holder NAME and --epoch N")
        out.emit({"released": client.lease_release(args.holder, args.epoch)})
    return EXIT_OK


def cmd_watch(client: Client, args: argparse.Namespace, out: Output) -> int:
    current = client.stats()["seq"]
    since = args.since if args.since is not None else current
    stop = f", stopping after {args.count} events" if args.count else " (Ctrl-C to stop)"
    print(f"sessionstore: watching changes after seq {since}{stop}", file=sys.stderr)
    if since > current:
        print(
            f"sessionstore: the store is at seq {current}: waiting until it passes {since}",
            file=sys.stderr,
        )
    single_line = Output(force_json=True)  # one line per event, on a terminal too
    for count, event in enumerate(client.watch(since), start=1):
        single_line.emit(event)
        if args.count and count >= args.count:
            break
    return EXIT_OK


def cmd_call(client: Client, args: argparse.Namespace, out: Output) -> int:
    fields = json_arg(args.args, "ARGS") if args.args else {}
    if not isinstance(fields, dict):
        raise UsageError('call: the arguments must be a JSON object, e.g. \'{"session_id": "x"}\'')
    out.emit(client.call(args.op, **fields))
    return EXIT_OK


def cmd_import_a3s(client: Client, args: argparse.Namespace, out: Output) -> int:
    try:
        key = a3s_import.read_key(args.key_file) if args.key_file else None
    except (OSError, ValueError) as error:
        raise UsageError(str(error)) from None
    try:
        report = a3s_import.import_store(
            client,
            Path(args.dir),
            key=key,
            dry_run=args.dry_run,
            overwrite=args.overwrite,
            progress=a3s_import.tty_progress,
        )
    except a3s_import.ImportProblem as problem:
        raise UsageError(str(problem)) from None
    for what, why in report.refused:
        print(f"sessionstore: import-a3s: refused {what}: {why}", file=sys.stderr)
    for what in report.changed:
        print(
            f"sessionstore: import-a3s: {what} changed since it was imported; left alone "
            "(--overwrite replaces it)",
            file=sys.stderr,
        )
    summary = report.as_dict()
    summary["dry_run"] = args.dry_run

    def human(value: dict[str, Any]) -> str:
        verb = "would import" if args.dry_run else "imported"
        lines = [
            f"{verb} {value['imported']}, skipped {value['skipped']} (already there), "
            f"refused {len(value['refused'])}, changed and left alone "
            f"{len(value['changed_not_overwritten'])}, temp files ignored "
            f"{len(value['temp_files_ignored'])}",
            *value["recovery"],
        ]
        return "\n".join(lines)

    out.emit(summary, human)
    return EXIT_OK if report.complete else EXIT_ERROR


def _opened(stack: contextlib.ExitStack[bool | None], path: str, mode: str) -> IO[Any]:
    """The file at path (- is standard input or output), closed with the stack: text in
    UTF-8, or bytes with a "b" mode."""
    binary = "b" in mode
    if path == "-":
        stream = sys.stdin if mode.startswith("r") else sys.stdout
        return stream.buffer if binary else stream
    try:
        return stack.enter_context(open(path, mode, encoding=None if binary else "utf-8"))
    except OSError as error:
        raise UsageError(f"{path}: {error.strerror}") from None


def cmd_backup(client: Client, args: argparse.Namespace, out: Output) -> int:
    if os.path.lexists(args.file) and not args.replace:
        raise UsageError(f"{args.file} exists (--replace replaces it once the backup is whole)")
    summary = backup_command.take_backup(client, args.file, backup_command.tty_progress())

    def human(value: dict[str, Any]) -> str:
        return (
            f"{value['path']}: {value['documents']} documents at seq {value['seq']}, "
            f"{value['payload_bytes']} bytes in {value['seconds']} s"
        )

    out.emit(summary, human)
    return EXIT_OK


def cmd_export(client: Client, args: argparse.Namespace, _out: Output) -> int:
    count = 0
    with contextlib.ExitStack() as stack:
        target = _opened(stack, args.file, "w")
        for line in json_export.export_documents(client):
            target.write(jsonform.json_line(line) + "\n")
            count += 1
    print(f"sessionstore: exported {count} documents", file=sys.stderr)
    return EXIT_OK


def cmd_import(client: Client, args: argparse.Namespace, out: Output) -> int:
    max_line_bytes = (
        args.max_line_mib << 20 if args.max_line_mib else json_export.max_line_bytes(client)
    )
    report = json_export.ImportReport()
    with contextlib.ExitStack() as stack:
        lines = json_export.read_lines(_opened(stack, args.file, "rb"), max_line_bytes)
        try:
            json_export.import_documents(client, lines, overwrite=args.overwrite, report=report)
        except json_export.LineTooLong as error:
            report.stop(str(error), EXIT_USAGE)
        except OSError as error:  # a read error part way
            report.stop(f"{args.file}: {error.strerror}", EXIT_ERROR)
    for line, problem in report.problems:
        print(f"sessionstore: import: line {line}: {problem}", file=sys.stderr)
    if report.stopped is not None:
        print(f"sessionstore: import: {report.stopped}", file=sys.stderr)

    def human(value: dict[str, Any]) -> str:
        return (
            f"imported {value['imported']}, unchanged {value['unchanged']}, "
            f"problems {len(value['problems'])}"
        )

    out.emit(report.as_dict(), human)
    return report.exit_code()


def cmd_encode(args: argparse.Namespace) -> int:
    """JSON (one document, or JSON lines) on stdin -> a CBOR sequence on stdout."""
    text = sys.stdin.read()
    try:
        values = [jsonform.loads(text)]
    except ValueError:
        try:
            values = [jsonform.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as error:
            raise UsageError(
                f"encode: standard input is not JSON or JSON lines ({error})"
            ) from None
    for value in values:
        sys.stdout.buffer.write(cbor2.dumps(from_json_value(value)))
    return EXIT_OK


def cmd_decode(args: argparse.Namespace) -> int:
    """A CBOR sequence on stdin -> one JSON line per item on stdout."""
    conn = Connection(max_message_bytes=1 << 40, mode=Mode.CBOR)
    conn.receive_data(sys.stdin.buffer.read())
    conn.receive_eof()
    out = Output(force_json=True)
    while True:
        message = conn.next_message()
        if message is END_OF_STREAM or message is NEED_DATA:
            return EXIT_OK
        out.emit(message)


def cmd_top(client: Client, args: argparse.Namespace, out: Output) -> int:
    return top.run(client, sys.stdout, args.interval, args.count)


def cmd_where(args: argparse.Namespace) -> int:
    socket = client_socket(args.socket)
    if args.path_only:
        print(socket.path)
        return EXIT_OK
    daemon_socket = default_socket(os.environ, os.getuid())
    state = state_dir(None, os.environ)
    served = _served(socket.path)
    listening = "a daemon is listening" if served is not None else "no daemon answers there"
    report = {
        "socket": socket.path,
        "socket_reason": socket.reason,
        "socket_status": listening,
        "serves": served,  # what that daemon says it serves: its state dir or database
        "daemon_default_socket": daemon_socket.path,
        "daemon_default_socket_reason": daemon_socket.reason,
        "state_dir": state.path,
        "state_dir_reason": state.reason,
    }

    def human(r: dict[str, Any]) -> str:
        lines = [f"socket     {r['socket']}: {r['socket_reason']}; {r['socket_status']}"]
        if r["serves"] is not None:
            lines.append(f"serves     {r['serves']}: as that daemon says")
        lines.append(
            f"defaults   a daemon started here binds {r['daemon_default_socket']}: "
            f"{r['daemon_default_socket_reason']}; keeps its state in {r['state_dir']}: "
            f"{r['state_dir_reason']}"
        )
        return "\n".join(lines)

    Output(args.json).emit(report, human)
    return EXIT_OK


def _served(path: str) -> str | None:
    """The state directory (or database) the daemon at path serves, or None if no daemon
    answers there."""
    try:
        with Client(path, timeout=2) as client:
            stats = client.stats()
    except (SessionStoreError, OSError):
        return None
    return str(stats.get("state_dir") or stats.get("database") or "an unnamed store")
