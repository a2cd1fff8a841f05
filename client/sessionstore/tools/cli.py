# `sessionstore ...`: argument parsing, output and exit codes. Results on
# stdout (readable on a terminal, one compact JSON line per result under a pipe
# or with --json), errors on stderr naming what is at fault and the fix, and
# one exit code per kind of outcome, the same for every command (EXIT_CODES).
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

import cbor2

from ..client import UNSET, Client
from ..errors import NoDaemon, SessionStoreError
from ..paths import client_socket, default_socket, state_dir
from ..replies import DEFAULT_TIMEOUT_S
from ..version import __version__
from ..wire import jsonform
from ..wire.codes import ErrorCode
from ..wire.jsonform import from_json_value, to_json_value
from ..wire.protocol import END_OF_STREAM, NEED_DATA, Connection, Mode, Refusal
from . import a3s_import, backup_command, json_export, top
from .helpformat import DefaultsShown

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_PROBLEMS = 4
EXIT_CONFLICT = 5
EXIT_FENCED = 6
EXIT_UNAVAILABLE = 7
EXIT_INTERRUPTED = 130

EXIT_CODES = (
    (EXIT_OK, "success"),
    (EXIT_ERROR, "any other failure (io_error, no_space, unauthorized, internal, ...)"),
    (EXIT_USAGE, "usage: a bad option or argument, input that is not JSON, bad_request, "
     "invalid_snapshot, too_large"),
    (
        EXIT_NOT_FOUND,
        "not found: get, head, exists, history, checkpoint get of something absent; "
        "a generation no longer kept (get --at, revert, fork --at)",
    ),
    (EXIT_PROBLEMS, "verify found problems"),
    (EXIT_CONFLICT, "conflict: --expect or --create-only not met, fork onto an existing id"),
    (EXIT_FENCED, "fenced: a lease is held and --lease was missing or stale"),
    (EXIT_UNAVAILABLE, "unavailable: no daemon on the socket, connection lost, overloaded, "
     "shutting down"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
)  # fmt: skip

EXIT_OF_CODE = {
    ErrorCode.NOT_FOUND: EXIT_NOT_FOUND,
    ErrorCode.COMPACTED: EXIT_NOT_FOUND,  # a generation no longer kept
    ErrorCode.CONFLICT: EXIT_CONFLICT,
    ErrorCode.FENCED: EXIT_FENCED,
    ErrorCode.BAD_REQUEST: EXIT_USAGE,
    ErrorCode.UNKNOWN_OP: EXIT_USAGE,
    ErrorCode.INVALID_SNAPSHOT: EXIT_USAGE,
    ErrorCode.TOO_LARGE: EXIT_USAGE,
    ErrorCode.OVERLOADED: EXIT_UNAVAILABLE,
    ErrorCode.SHUTTING_DOWN: EXIT_UNAVAILABLE,
    "connection_lost": EXIT_UNAVAILABLE,
}

PROGRESS_REFRESH_S = 0.2


class UsageError(Exception):
    """The command line or its input is wrong: exit 2 with this message."""


class Output:
    def __init__(self, force_json: bool) -> None:
        self.pretty = not force_json and sys.stdout.isatty()

    def emit(self, value: Any, human: Callable[[Any], str] | None = None) -> None:
        if self.pretty:
            text = human(value) if human else json.dumps(value, indent=2, ensure_ascii=False)
        else:
            text = jsonform.json_line(to_json_value(value))
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def _read_json(source: str) -> Any:
    name = "standard input" if source == "-" else source
    if source == "-":
        if sys.stdin.isatty():
            raise UsageError(
                "put: give a JSON file (sessionstore put snapshot.json), or pipe one in "
                "(sessionstore put - < snapshot.json)"
            )
        text = sys.stdin.read()
    else:
        try:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as error:
            raise UsageError(f"cannot read {source}: {error.strerror}") from None
    try:
        return from_json_value(jsonform.loads(text))
    except ValueError as error:
        raise UsageError(f"{name} is not valid JSON ({error})") from None


def _json_arg(text: str, what: str) -> Any:
    try:
        return from_json_value(jsonform.loads(text))
    except ValueError as error:
        raise UsageError(f"{what} is not valid JSON ({error}): {text[:60]!r}") from None


def _expect(args: argparse.Namespace) -> Any:
    if getattr(args, "create_only", False):
        return None
    return args.expect if getattr(args, "expect", None) else UNSET


def _lease_option(args: argparse.Namespace) -> Any:
    if not getattr(args, "lease", None):
        return UNSET
    holder, _, epoch = args.lease.rpartition(":")
    if not holder or not epoch.isdigit():
        raise UsageError(
            f"--lease must be HOLDER:EPOCH (as `lease acquire` prints), not {args.lease!r}"
        )
    return (holder, int(epoch))


def _with_progress(what: str, work: Callable[[], Any]) -> Any:
    """work() with an elapsed-time bar on a terminal (the daemon reports no fraction)."""
    if not sys.stderr.isatty():
        return work()
    from tqdm import tqdm

    result: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as error:
            failure.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    with tqdm(desc=what, bar_format="{desc}: {elapsed}", file=sys.stderr, leave=False) as bar:
        while worker.is_alive():
            worker.join(PROGRESS_REFRESH_S)
            bar.refresh()
    if failure:
        raise failure[0]
    return result[0]


# -- the commands ------------------------------------------------------------------

Handler = Callable[[Client, argparse.Namespace, Output], int]


def _get(client: Client, args: argparse.Namespace, out: Output) -> int:
    at = UNSET if args.at is None else args.at
    result = client.load_with_meta(args.session_id, at=at)
    if result["snapshot"] is None:
        print(f"sessionstore: no session {args.session_id!r}", file=sys.stderr)
        return EXIT_NOT_FOUND
    out.emit(result if args.meta else result["snapshot"])
    return EXIT_OK


def _head(client: Client, args: argparse.Namespace, out: Output) -> int:
    result = client.head(args.session_id)
    out.emit(result)
    return EXIT_OK if result["found"] else EXIT_NOT_FOUND


def _exists(client: Client, args: argparse.Namespace, out: Output) -> int:
    found = client.exists(args.session_id)
    out.emit({"exists": found}, lambda value: "yes" if value["exists"] else "no")
    return EXIT_OK if found else EXIT_NOT_FOUND


def _put(client: Client, args: argparse.Namespace, out: Output) -> int:
    snapshot = _read_json(args.file)
    saved = client.save(snapshot, expect=_expect(args), lease=_lease_option(args), ttl_s=_ttl(args))
    out.emit(saved)
    return EXIT_OK


def _ttl(args: argparse.Namespace) -> float | Any:
    return args.ttl if args.ttl is not None else UNSET


def _expire(client: Client, args: argparse.Namespace, out: Output) -> int:
    """EXPIRE ID SECONDS, and PERSIST ID (seconds None): exit 3 when there is no such one."""
    seconds = getattr(args, "seconds", None)
    if args.kind is None:
        result = client.expire(args.id, seconds, lease=_lease_option(args))
    else:
        result = client.expire(
            None, seconds, kind=args.kind, key=args.id, lease=_lease_option(args)
        )
    out.emit(result)
    if not result["found"]:
        what = f"{args.kind} document" if args.kind else "session"
        print(f"sessionstore: no {what} {args.id!r}", file=sys.stderr)
        return EXIT_NOT_FOUND
    return EXIT_OK


def _rm(client: Client, args: argparse.Namespace, out: Output) -> int:
    out.emit(client.delete(args.session_id, expect=_expect(args), lease=_lease_option(args)))
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


def _ls(client: Client, args: argparse.Namespace, out: Output) -> int:
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


def _verify(client: Client, _args: argparse.Namespace, out: Output) -> int:
    result = _with_progress("verify", client.verify)
    out.emit(result)
    return EXIT_PROBLEMS if result["problems"] else EXIT_OK


def _compact(client: Client, _args: argparse.Namespace, out: Output) -> int:
    out.emit(_with_progress("compact", client.compact))
    return EXIT_OK


def _simple(op: str) -> Handler:
    def run(client: Client, _args: argparse.Namespace, out: Output) -> int:
        out.emit(client.call(op))
        return EXIT_OK

    return run


def _update(client: Client, args: argparse.Namespace, out: Output) -> int:
    value = _json_arg(sys.stdin.read() if args.value == "-" else args.value, "value")
    result = client.update(
        args.session_id, args.component, value, expect=_expect(args), lease=_lease_option(args)
    )
    out.emit(result)
    return EXIT_OK


def _fork(client: Client, args: argparse.Namespace, out: Output) -> int:
    lease, at = _lease_option(args), UNSET if args.at is None else args.at
    out.emit(client.fork(args.session_id, args.new_session_id, args.workspace, lease=lease, at=at))
    return EXIT_OK


def _history(client: Client, args: argparse.Namespace, out: Output) -> int:
    generations = client.history(args.session_id)
    if not generations:
        print(f"sessionstore: no session {args.session_id!r}", file=sys.stderr)
        return EXIT_NOT_FOUND
    for generation in generations:
        print(json.dumps(generation, sort_keys=True))
    return EXIT_OK


def _revert(client: Client, args: argparse.Namespace, out: Output) -> int:
    reverted = client.revert(
        args.session_id, args.seq, expect=_expect(args), lease=_lease_option(args)
    )
    out.emit(reverted)
    return EXIT_OK


def _checkpoint(client: Client, args: argparse.Namespace, out: Output) -> int:
    if args.action != "put" and args.value is not None:
        raise UsageError(f"checkpoint {args.action} takes no value: unexpected {args.value!r}")
    lease = _lease_option(args)
    if args.action == "put":
        text = sys.stdin.read() if args.value in (None, "-") else args.value
        value = _json_arg(text, "value")
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


def _lease(client: Client, args: argparse.Namespace, out: Output) -> int:
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


def _watch(client: Client, args: argparse.Namespace, out: Output) -> int:
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


def _call(client: Client, args: argparse.Namespace, out: Output) -> int:
    fields = _json_arg(args.args, "ARGS") if args.args else {}
    if not isinstance(fields, dict):
        raise UsageError('call: the arguments must be a JSON object, e.g. \'{"session_id": "x"}\'')
    out.emit(client.call(args.op, **fields))
    return EXIT_OK


def _import_a3s(client: Client, args: argparse.Namespace, out: Output) -> int:
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


def _backup(client: Client, args: argparse.Namespace, out: Output) -> int:
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


def _export(client: Client, args: argparse.Namespace, _out: Output) -> int:
    count = 0
    with contextlib.ExitStack() as stack:
        target = _opened(stack, args.file, "w")
        for line in json_export.export_documents(client):
            target.write(jsonform.json_line(line) + "\n")
            count += 1
    print(f"sessionstore: exported {count} documents", file=sys.stderr)
    return EXIT_OK


def _import(client: Client, args: argparse.Namespace, out: Output) -> int:
    max_line_bytes = (
        args.max_line_mib << 20 if args.max_line_mib else json_export.max_line_bytes(client)
    )
    report = json_export.ImportReport()
    with contextlib.ExitStack() as stack:
        lines = json_export.read_lines(_opened(stack, args.file, "rb"), max_line_bytes)
        try:
            json_export.import_documents(client, lines, overwrite=args.overwrite, report=report)
        except json_export.LineTooLong as error:
            report.stopped = str(error)
        except OSError as error:  # a read error part way
            report.stopped = f"{args.file}: {error.strerror}"
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
    return EXIT_OK if not report.problems and report.stopped is None else EXIT_ERROR


def _encode(args: argparse.Namespace) -> int:
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


def _decode(args: argparse.Namespace) -> int:
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


def _completion(args: argparse.Namespace) -> int:
    """Completion generated from this very parser (shtab), so that it never drifts."""
    import shtab

    print(shtab.complete(_parser(), shell=args.shell))
    return EXIT_OK


def manual_pages() -> dict[str, str]:
    """A man page (roff) for `sessionstore` and one for each command, from the parser
    (argparse-manpage): name -> text. `make install` writes them."""
    from argparse_manpage.manpage import Manpage

    parser = _parser()
    pages = {"sessionstore": str(Manpage(parser))}
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, sub in commands.choices.items():
        sub.prog = f"sessionstore {name}"
        pages[f"sessionstore-{name}"] = str(Manpage(sub))
    return pages


def _top(client: Client, args: argparse.Namespace, out: Output) -> int:
    return top.run(client, sys.stdout, args.interval, args.count)


def _where(args: argparse.Namespace) -> int:
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


# -- the parser ------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not 1 or more")
    return value


def _seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a seq (a whole number)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a seq: seqs start at 0")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


class _Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit 2, as every other refusal is."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"sessionstore: {message} (see `{self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    codes = "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES)
    epilog = (
        "The socket: --socket, else $SESSIONSTORE_SOCKET, else $RUNTIME_DIRECTORY,\n"
        "$XDG_RUNTIME_DIR or /tmp/sessionstored-$UID (the daemon's own default), else\n"
        "/run/sessionstored/sessionstored.sock when a systemd unit made it.\n"
        "`sessionstore where` shows which and why.\n\n"
        f"Exit codes (every command):\n{codes}"
    )
    formatter = DefaultsShown

    # before or after the command alike (`sessionstore --json ls`, `sessionstore ls --json`)
    common = _Parser(add_help=False)
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="one compact JSON line per result, on a terminal too (the format under a pipe)",
    )
    common.add_argument(
        "--socket",
        default=argparse.SUPPRESS,
        help="the daemon's socket (default: the search order below)",
    )
    common.add_argument(
        "--timeout",
        type=_seconds,
        default=argparse.SUPPRESS,
        help=f"seconds to wait for each reply (default: {DEFAULT_TIMEOUT_S})",
    )
    parser = _Parser(
        prog="sessionstore",
        description="Client for sessionstored, the crash-safe session store.",
        epilog=epilog,
        formatter_class=DefaultsShown,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"sessionstore {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Any, help_text: str, *, local: bool = False) -> Any:
        sub = commands.add_parser(
            name, help=help_text, description=help_text, formatter_class=formatter, parents=[common]
        )
        sub.set_defaults(handler=handler, local=local)
        return sub

    def expect_options(sub: Any, create_only: bool = False) -> None:
        sub.add_argument(
            "--expect", metavar="DIGEST", help="only if the current digest is this one"
        )
        if create_only:
            sub.add_argument(
                "--create-only", action="store_true", help="only if the session does not exist"
            )

    def ttl_option(sub: Any) -> None:
        sub.add_argument(
            "--ttl", type=_seconds, metavar="SECONDS", help="expire that long after the write"
        )

    def lease_option(sub: Any) -> None:
        sub.add_argument(
            "--lease", metavar="HOLDER:EPOCH", help="the current lease, when one is held"
        )

    command("ping", _simple("ping"), "check that the daemon answers")
    command("hello", _simple("hello"), "protocol version, capabilities and limits")
    command("stats", _simple("stats"), "counters, including what the last recovery repaired")
    where = command(
        "where", _where, "the socket and state directory this machine uses, and why", local=True
    )
    where.add_argument(
        "--path-only", action="store_true", help="print only the socket's path (for scripts)"
    )
    command("verify", _verify, "full integrity check (exit 4 when it finds problems)")
    top_view = command(
        "top", _top, "a live view: requests/s, p50 and p99 by op, batches, watchers (Ctrl-C ends)"
    )
    top_view.add_argument(
        "--interval", type=float, default=1.0, metavar="SECONDS", help="between views (1)"
    )
    top_view.add_argument("--count", type=_positive_int, help="show this many views, then end")
    backup = command(
        "backup", _backup, "an online, consistent backup of the store at one seq, into FILE"
    )
    backup.add_argument("file", help="the backup file (written whole, or not at all)")
    backup.add_argument(
        "--replace",
        action="store_true",
        help="replace FILE if it exists, once the new one is whole",
    )
    export = command(
        "export", _export, "every document as one JSON line: kind, id, seq, digest, value"
    )
    export.add_argument("file", nargs="?", default="-", help="where to write, or - for stdout")
    import_ = command(
        "import", _import, "documents from JSON lines (`export`'s), create-only by default"
    )
    import_.add_argument("file", nargs="?", default="-", help="JSON lines, or - for stdin")
    import_.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a document that is there at another digest",
    )
    import_.add_argument(
        "--max-line-mib",
        type=_positive_int,
        metavar="MIB",
        help="the longest line read (default: 4 x the daemon's max_request_bytes); "
        "a longer line stops the import",
    )
    command("compact", _compact, "rewrite the log without dead records, checkpoint the index")
    get = command("get", _get, "print a session's snapshot (exit 3 when absent)")
    get.add_argument("session_id")
    get.add_argument(
        "--meta", action="store_true", help="print the snapshot with its digest and seq"
    )
    get.add_argument(
        "--at",
        type=_seq,
        metavar="SEQ",
        help="the generation that was current at this seq (exit 3 when it is no longer kept)",
    )
    history = command(
        "history",
        _history,
        "a session's generations kept, newest first: one JSON line each (exit 3 when absent)",
    )
    history.add_argument("session_id")
    revert = command(
        "revert", _revert, "write back the generation that was current at SEQ, as a new one"
    )
    revert.add_argument("session_id")
    revert.add_argument("seq", type=_seq, help="exit 3 when that generation is no longer kept")
    expect_options(revert)
    lease_option(revert)
    head = command("head", _head, "digest, seq and size of a session (exit 3 when absent)")
    head.add_argument("session_id")
    exists = command("exists", _exists, "whether a session exists (exit 3 when absent)")
    exists.add_argument("session_id")
    put = command("put", _put, "save a snapshot given as JSON")
    put.add_argument("file", nargs="?", default="-", help="a JSON file, or - for standard input")
    expect_options(put, create_only=True)
    lease_option(put)
    ttl_option(put)
    rm = command("rm", _rm, "delete a session (deleted: false when it was absent)")
    rm.add_argument("session_id")
    expect_options(rm)
    lease_option(rm)
    ls = command("ls", _ls, "list session ids, or a kind's keys, in UTF-8 byte order, one per line")
    ls.add_argument(
        "--kind",
        choices=("session", "kv", "loop", "workflow"),
        default="session",
        help="sessions, or the keyed documents of a kind",
    )
    ls.add_argument("--prefix", default="", help="only ids that start with this")
    ls.add_argument("--after", help="start after this id (with --limit: the previous page's next)")
    ls.add_argument("--limit", type=_positive_int, help="at most this many (then a `next`)")
    update = command("update", _update, "replace one component of a session")
    update.add_argument("session_id")
    update.add_argument("component", help="session, artifacts, trace_events, run_records, ...")
    update.add_argument("value", help="the new value as JSON, or - for standard input")
    expect_options(update)
    lease_option(update)
    fork = command("fork", _fork, "copy a session under a new id with another workspace")
    fork.add_argument("session_id")
    fork.add_argument("new_session_id", help="must not exist yet (exit 5 when it does)")
    fork.add_argument("workspace", help="the copy's session.config.workspace")
    fork.add_argument(
        "--at", type=_seq, metavar="SEQ", help="copy the generation that was current at SEQ"
    )
    lease_option(fork)
    checkpoint = command("checkpoint", _checkpoint, "checkpoints: put, get, rm")
    checkpoint.add_argument("action", choices=("put", "get", "rm"))
    checkpoint.add_argument("kind", choices=("loop", "workflow", "kv"))
    checkpoint.add_argument("key")
    checkpoint.add_argument("value", nargs="?", help="for put: a JSON map, or - for standard input")
    lease_option(checkpoint)
    ttl_option(checkpoint)
    checkpoint.add_argument(
        "--meta", action="store_true", help="for get: print the value with its expires_at_ms"
    )
    for name, summary in (
        ("expire", "make a session (or with --kind, a document) expire SECONDS from now"),
        ("persist", "remove a session's (or with --kind, a document's) expiry"),
    ):
        sub = command(name, _expire, f"{summary} (exit 3 when absent)")
        sub.add_argument("id", help="the session id, or with --kind the document's key")
        if name == "expire":
            sub.add_argument("seconds", type=_seconds)
        sub.add_argument("--kind", choices=("loop", "workflow", "kv"))
        lease_option(sub)
    lease = command("lease", _lease, "the writer lease: acquire (a takeover), get, release")
    lease.add_argument("action", choices=("acquire", "get", "release"))
    lease.add_argument("--holder", help="who holds it (acquire, release)")
    lease.add_argument("--epoch", type=int, help="the epoch acquire gave (release)")
    watch = command("watch", _watch, "stream committed changes, one JSON line each")
    watch.add_argument(
        "--since", type=_seq, help="replay retained changes after this seq (default: now)"
    )
    watch.add_argument(
        "--count", type=_positive_int, help="stop after this many events (default: never)"
    )
    call = command("call", _call, "send any op with JSON arguments")
    call.add_argument("op")
    call.add_argument(
        "args", nargs="?", metavar="ARGS", help='a JSON object, e.g. \'{"session_id": "x"}\''
    )
    migrate = command(
        "import-a3s",
        _import_a3s,
        "bring an a3s-code-core FileSessionStore across (exit 0 when every document came "
        "across, 1 when any was refused or left alone)",
    )
    migrate.add_argument("dir", help="the upstream store's directory")
    migrate.add_argument("--key-file", help="the host key a sealed store was written with")
    migrate.add_argument("--dry-run", action="store_true", help="report, write nothing")
    migrate.add_argument(
        "--overwrite", action="store_true", help="replace documents that changed since"
    )
    completion = command(
        "completion", _completion, "print a bash or zsh completion script", local=True
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    command("encode", _encode, "JSON on stdin -> CBOR on stdout (for socat)", local=True)
    command("decode", _decode, "a CBOR sequence on stdin -> JSON lines on stdout", local=True)
    return parser


def _error_message(error: SessionStoreError, socket_path: str) -> str:
    if isinstance(error, NoDaemon):
        choice = client_socket(socket_path)
        return (
            f"no daemon is listening on {choice.path} ({choice.reason}). Start one with "
            "`make run` in the repository (or `sessionstored`), or point --socket at it; "
            "`sessionstore where` shows where clients look"
        )
    message = f"{error.code}: {error.message}"
    if error.code == ErrorCode.FENCED and error.details.get("holder") is not None:
        # never the epoch to copy: a stale holder that pasted it would defeat the fence
        return (
            f"fenced: the lease is held by {error.details['holder']!r}, and only its holder "
            "may write; to take over, `sessionstore lease acquire --holder NAME` and write "
            "with the --lease it prints"
        )
    if error.code == ErrorCode.CONFLICT:
        current = error.details.get("current")
        return f"{message} (current digest: {current or 'none'})"
    extra = {k: v for k, v in error.details.items() if k != "current"}
    return message + (f" {jsonform.json_line(to_json_value(extra))}" if extra else "")


def _encode_output_whatever_the_locale(as_json: bool) -> None:
    """JSON is UTF-8 whatever the locale (RFC 8259, section 8.1); text for a person
    is in the terminal's encoding, with what it cannot show escaped. Under LC_ALL=C
    an id such as "équipe" would otherwise end the command with a traceback."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        if as_json or not sys.stdout.isatty():
            sys.stdout.reconfigure(encoding="utf-8")
        else:
            sys.stdout.reconfigure(errors="backslashreplace")
    if isinstance(sys.stderr, io.TextIOWrapper):
        sys.stderr.reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.json = getattr(args, "json", False)
    _encode_output_whatever_the_locale(args.json)
    args.socket = getattr(args, "socket", None)
    args.timeout = getattr(args, "timeout", DEFAULT_TIMEOUT_S)
    try:
        if args.local:
            code: int = args.handler(args)
            return code
        with Client(args.socket, timeout=args.timeout) as client:
            code = args.handler(client, args, Output(args.json))
            return code
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except UsageError as error:
        print(f"sessionstore: {error}", file=sys.stderr)
        return EXIT_USAGE
    except SessionStoreError as error:
        print(f"sessionstore: {_error_message(error, args.socket)}", file=sys.stderr)
        return EXIT_OF_CODE.get(error.code, EXIT_ERROR)
    except BrokenPipeError:  # `sessionstore ls | head`: the reader has what it wanted
        return EXIT_OK
    except (OSError, Refusal) as error:
        print(f"sessionstore: {error}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
