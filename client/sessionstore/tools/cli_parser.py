# The `sessionstore` command line: every command, its arguments and help, and what is
# made from the parser (bash and zsh completion, the man pages).
from __future__ import annotations

import argparse
from typing import Any

from ..replies import DEFAULT_TIMEOUT_S
from ..version import __version__
from .cli_commands import (
    _expire,
    cmd_backup,
    cmd_call,
    cmd_checkpoint,
    cmd_compact,
    cmd_decode,
    cmd_encode,
    cmd_exists,
    cmd_export,
    cmd_fork,
    cmd_get,
    cmd_head,
    cmd_history,
    cmd_import,
    cmd_import_a3s,
    cmd_lease,
    cmd_ls,
    cmd_put,
    cmd_revert,
    cmd_rm,
    cmd_top,
    cmd_update,
    cmd_verify,
    cmd_watch,
    cmd_where,
    simple_command,
)
from .cli_common import (
    EXIT_CODES,
    EXIT_OK,
)
from .helpformat import DefaultsShown, OneLineUsage, positive_seconds


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


def build_parser() -> argparse.ArgumentParser:
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
    common = OneLineUsage(add_help=False)
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
        type=positive_seconds,
        default=argparse.SUPPRESS,
        help=f"seconds to wait for each reply (default: {DEFAULT_TIMEOUT_S})",
    )
    parser = OneLineUsage(
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
            "--ttl",
            type=positive_seconds,
            metavar="SECONDS",
            help="expire that long after the write",
        )

    def lease_option(sub: Any) -> None:
        sub.add_argument(
            "--lease", metavar="HOLDER:EPOCH", help="the current lease, when one is held"
        )

    command("ping", simple_command("ping"), "check that the daemon answers")
    command("hello", simple_command("hello"), "protocol version, capabilities and limits")
    command("stats", simple_command("stats"), "counters, including what the last recovery repaired")
    where = command(
        "where", cmd_where, "the socket and state directory this machine uses, and why", local=True
    )
    where.add_argument(
        "--path-only", action="store_true", help="print only the socket's path (for scripts)"
    )
    command("verify", cmd_verify, "full integrity check (exit 4 when it finds problems)")
    top_view = command(
        "top",
        cmd_top,
        "a live view: requests/s, p50 and p99 by op, batches, watchers (Ctrl-C ends)",
    )
    top_view.add_argument(
        "--interval",
        type=positive_seconds,
        default=1.0,
        metavar="SECONDS",
        help="between views (1)",
    )
    top_view.add_argument("--count", type=_positive_int, help="show this many views, then end")
    backup = command(
        "backup", cmd_backup, "an online, consistent backup of the store at one seq, into FILE"
    )
    backup.add_argument("file", help="the backup file (written whole, or not at all)")
    backup.add_argument(
        "--replace",
        action="store_true",
        help="replace FILE if it exists, once the new one is whole",
    )
    export = command(
        "export", cmd_export, "every document as one JSON line: kind, id, seq, digest, value"
    )
    export.add_argument("file", nargs="?", default="-", help="where to write, or - for stdout")
    import_ = command(
        "import", cmd_import, "documents from JSON lines (`export`'s), create-only by default"
    )
    import_.epilog = (
        "exit status: 0 when every line was imported or found unchanged; 2 when each "
        "problem was a line's own (not JSON, not a document, a digest that is not its "
        "value's, a line too long); 5 when each was a document there at another digest "
        "(create-only); 1 for problems of several kinds or a read error; else as the daemon's "
        "error makes any command exit"
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
    command("compact", cmd_compact, "rewrite the log without dead records, checkpoint the index")
    get = command("get", cmd_get, "print a session's snapshot (exit 3 when absent)")
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
        cmd_history,
        "a session's generations kept, newest first: one JSON line each (exit 3 when absent)",
    )
    history.add_argument("session_id")
    revert = command(
        "revert", cmd_revert, "write back the generation that was current at SEQ, as a new one"
    )
    revert.add_argument("session_id")
    revert.add_argument("seq", type=_seq, help="exit 3 when that generation is no longer kept")
    expect_options(revert)
    lease_option(revert)
    head = command("head", cmd_head, "digest, seq and size of a session (exit 3 when absent)")
    head.add_argument("session_id")
    exists = command("exists", cmd_exists, "whether a session exists (exit 3 when absent)")
    exists.add_argument("session_id")
    put = command("put", cmd_put, "save a snapshot given as JSON")
    put.add_argument("file", nargs="?", default="-", help="a JSON file, or - for standard input")
    expect_options(put, create_only=True)
    lease_option(put)
    ttl_option(put)
    rm = command("rm", cmd_rm, "delete a session (deleted: false when it was absent)")
    rm.add_argument("session_id")
    expect_options(rm)
    lease_option(rm)
    ls = command(
        "ls", cmd_ls, "list session ids, or a kind's keys, in UTF-8 byte order, one per line"
    )
    ls.add_argument(
        "--kind",
        choices=("session", "kv", "loop", "workflow"),
        default="session",
        help="sessions, or the keyed documents of a kind",
    )
    ls.add_argument("--prefix", default="", help="only ids that start with this")
    ls.add_argument("--after", help="start after this id (with --limit: the previous page's next)")
    ls.add_argument("--limit", type=_positive_int, help="at most this many (then a `next`)")
    update = command("update", cmd_update, "replace one component of a session")
    update.add_argument("session_id")
    update.add_argument("component", help="session, artifacts, trace_events, run_records, ...")
    update.add_argument("value", help="the new value as JSON, or - for standard input")
    expect_options(update)
    lease_option(update)
    fork = command("fork", cmd_fork, "copy a session under a new id with another workspace")
    fork.add_argument("session_id")
    fork.add_argument("new_session_id", help="must not exist yet (exit 5 when it does)")
    fork.add_argument("workspace", help="the copy's session.config.workspace")
    fork.add_argument(
        "--at", type=_seq, metavar="SEQ", help="copy the generation that was current at SEQ"
    )
    lease_option(fork)
    checkpoint = command("checkpoint", cmd_checkpoint, "checkpoints: put, get, rm")
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
            sub.add_argument("seconds", type=positive_seconds)
        sub.add_argument("--kind", choices=("loop", "workflow", "kv"))
        lease_option(sub)
    lease = command("lease", cmd_lease, "the writer lease: acquire (a takeover), get, release")
    lease.add_argument("action", choices=("acquire", "get", "release"))
    lease.add_argument("--holder", help="who holds it (acquire, release)")
    lease.add_argument("--epoch", type=int, help="the epoch acquire gave (release)")
    watch = command("watch", cmd_watch, "stream committed changes, one JSON line each")
    watch.add_argument(
        "--since", type=_seq, help="replay retained changes after this seq (default: now)"
    )
    watch.add_argument(
        "--count", type=_positive_int, help="stop after this many events (default: never)"
    )
    call = command("call", cmd_call, "send any op with JSON arguments")
    call.add_argument("op")
    call.add_argument(
        "args", nargs="?", metavar="ARGS", help='a JSON object, e.g. \'{"session_id": "x"}\''
    )
    migrate = command(
        "import-a3s",
        cmd_import_a3s,
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
        "completion", cmd_completion, "print a bash or zsh completion script", local=True
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    command("encode", cmd_encode, "JSON on stdin -> CBOR on stdout (for socat)", local=True)
    command("decode", cmd_decode, "a CBOR sequence on stdin -> JSON lines on stdout", local=True)
    return parser


def cmd_completion(args: argparse.Namespace) -> int:
    """Completion generated from this very parser (shtab), so that it never drifts."""
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))
    return EXIT_OK


def manual_pages() -> dict[str, str]:
    """A man page (roff) for `sessionstore` and one for each command, from the parser
    (argparse-manpage): name -> text. `make install` writes them."""
    from argparse_manpage.manpage import Manpage

    def page(parser: argparse.ArgumentParser, name: str, summary: str) -> str:
        manpage = Manpage(parser)
        # the title and NAME line man, whatis and apropos read: "sessionstore-ls - ..."
        manpage.prog, manpage.description = name, summary
        manpage.source, manpage.manual = f"sessionstore {__version__}", "sessionstore manual"
        return str(manpage)

    parser = build_parser()
    pages = {"sessionstore": page(parser, "sessionstore", "the sessionstore daemon's client")}
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    summaries = {action.dest: action.help or "" for action in commands._choices_actions}
    for name, sub in commands.choices.items():
        sub.prog = f"sessionstore {name}"  # as the synopsis shows it
        pages[f"sessionstore-{name}"] = page(sub, f"sessionstore-{name}", summaries[name])
    return pages
