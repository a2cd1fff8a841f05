# `sessionstore ...`: argument parsing and exit codes only. JSON on stdout,
# errors on stderr, exit 0 on success and non-zero otherwise.
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import cbor2

from . import jsonform
from .client import UNSET, Client
from .errors import SessionStoreError
from .jsonform import from_json_value, to_json_value
from .protocol import END_OF_STREAM, NEED_DATA, Connection, Mode, ProtocolError

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_PROBLEMS = 4


def _print(value: Any) -> None:
    sys.stdout.write(json.dumps(to_json_value(value), ensure_ascii=False) + "\n")


def _read_json(source: str) -> Any:
    if source == "-":
        text = sys.stdin.read()
    else:
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
    return from_json_value(jsonform.loads(text))


def _expect(args: argparse.Namespace) -> Any:
    if getattr(args, "create_only", False):
        return None
    return args.expect if getattr(args, "expect", None) else UNSET


def _encode(_client: Client | None, _args: argparse.Namespace) -> int:
    """JSON (one document, or JSON lines) on stdin -> a CBOR sequence on stdout."""
    text = sys.stdin.read()
    try:
        values = [jsonform.loads(text)]
    except json.JSONDecodeError:
        values = [jsonform.loads(line) for line in text.splitlines() if line.strip()]
    for value in values:
        sys.stdout.buffer.write(cbor2.dumps(from_json_value(value)))
    return 0


def _decode(_client: Client | None, _args: argparse.Namespace) -> int:
    """A CBOR sequence on stdin -> one JSON line per item on stdout."""
    conn = Connection(max_message_bytes=1 << 40, mode=Mode.CBOR)
    conn.receive_data(sys.stdin.buffer.read())
    conn.receive_eof()
    while True:
        message = conn.next_message()
        if message is END_OF_STREAM or message is NEED_DATA:
            return 0
        _print(message)


def _get(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    result = client.load_with_meta(args.session_id)
    if result["snapshot"] is None:
        print(f"sessionstore: no session {args.session_id!r}", file=sys.stderr)
        return EXIT_NOT_FOUND
    _print(result if args.meta else result["snapshot"])
    return 0


def _put(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    _print(client.save(_read_json(args.file), expect=_expect(args), lease=_lease_option(args)))
    return 0


def _rm(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    _print(client.delete(args.session_id, expect=_expect(args), lease=_lease_option(args)))
    return 0


def _ls(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    if args.limit is not None:
        _print(client.list(args.prefix, after=args.after, limit=args.limit))
    else:
        _print(list(client.iter_ids(args.prefix)))
    return 0


def _verify(client: Client | None, _args: argparse.Namespace) -> int:
    assert client is not None
    result = client.verify()
    _print(result)
    return EXIT_PROBLEMS if result["problems"] else 0


def _simple(op: str, arg: str | None = None) -> Any:
    def run(client: Client | None, args: argparse.Namespace) -> int:
        assert client is not None
        fields = {arg: getattr(args, arg)} if arg else {}
        _print(client.call(op, **fields))
        return 0

    return run


def _json_arg(text: str, what: str) -> Any:
    try:
        return from_json_value(jsonform.loads(text))
    except json.JSONDecodeError as error:
        raise ValueError(f"{what} is not JSON: {error}") from None


def _lease_option(args: argparse.Namespace) -> Any:
    if not getattr(args, "lease", None):
        return UNSET
    holder, _, epoch = args.lease.rpartition(":")
    if not holder or not epoch.isdigit():
        raise ValueError("--lease must be HOLDER:EPOCH")
    return (holder, int(epoch))


def _update(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    value = _json_arg(sys.stdin.read() if args.value == "-" else args.value, "value")
    _print(
        client.update(
            args.session_id, args.component, value, expect=_expect(args), lease=_lease_option(args)
        )
    )
    return 0


def _fork(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    _print(
        client.fork(args.session_id, args.new_session_id, args.workspace, lease=_lease_option(args))
    )
    return 0


def _checkpoint(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    if args.action == "put":
        value = _json_arg(sys.stdin.read() if args.value in (None, "-") else args.value, "value")
        _print(
            {
                "seq": client.checkpoint_put(args.kind, args.key, value, lease=_lease_option(args))[
                    "seq"
                ]
            }
        )
    elif args.action == "get":
        value = client.checkpoint_get(args.kind, args.key)
        if value is None:
            print(f"sessionstore: no {args.kind} checkpoint {args.key!r}", file=sys.stderr)
            return EXIT_NOT_FOUND
        _print(value)
    else:
        _print(
            {"deleted": client.checkpoint_delete(args.kind, args.key, lease=_lease_option(args))}
        )
    return 0


def _lease(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    if args.action == "acquire":
        if not args.holder:
            raise ValueError("lease acquire needs --holder")
        _print(client.lease_acquire(args.holder))
    elif args.action == "get":
        _print(client.lease_get())
    else:
        if not args.holder or args.epoch is None:
            raise ValueError("lease release needs --holder and --epoch")
        _print({"released": client.lease_release(args.holder, args.epoch)})
    return 0


def _watch(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    for count, event in enumerate(client.watch(args.since), start=1):
        _print(event)
        sys.stdout.flush()
        if args.count and count >= args.count:
            return 0
    return 0


def _call(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    fields = from_json_value(jsonform.loads(args.args)) if args.args else {}
    if not isinstance(fields, dict):
        raise SystemExit("sessionstore: call arguments must be a JSON object")
    _print(client.call(args.op, **fields))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sessionstore", description="Client for sessionstored.")
    parser.add_argument("--socket", help="daemon socket (default: the contract's search order)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, handler: Any, help_text: str, **kwargs: Any) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text, **kwargs)
        sub.set_defaults(handler=handler, needs_daemon=handler not in (_encode, _decode))
        return sub

    command("ping", _simple("ping"), "check that the daemon answers")
    command("hello", _simple("hello"), "protocol version, capabilities and limits")
    command("stats", _simple("stats"), "counters, including what the last recovery repaired")
    command("verify", _verify, "full integrity check (exit 4 when problems are found)")
    get = command("get", _get, "print a session's snapshot as JSON (exit 3 when absent)")
    get.add_argument("session_id")
    get.add_argument("--meta", action="store_true", help="print snapshot, digest and seq")
    head = command("head", _simple("head", "session_id"), "digest, seq and size of a session")
    head.add_argument("session_id")
    exists = command("exists", _simple("exists", "session_id"), "whether a session exists")
    exists.add_argument("session_id")
    put = command("put", _put, "save a snapshot given as JSON (file or - for stdin)")
    put.add_argument("file", nargs="?", default="-")
    put.add_argument("--expect", help="only if the current digest is this one")
    put.add_argument("--create-only", action="store_true", help="only if the session is absent")
    rm = command("rm", _rm, "delete a session")
    rm.add_argument("session_id")
    rm.add_argument("--expect", help="only if the current digest is this one")
    ls = command("ls", _ls, "list session ids (all pages unless --limit)")
    ls.add_argument("--prefix", default="")
    ls.add_argument("--after")
    ls.add_argument("--limit", type=int)
    call = command("call", _call, "send any op with JSON arguments")
    call.add_argument("op")
    call.add_argument("args", nargs="?", help='JSON object, e.g. \'{"session_id": "x"}\'')
    update = command("update", _update, "replace one component of a session (value as JSON)")
    update.add_argument("session_id")
    update.add_argument("component")
    update.add_argument("value", help="JSON, or - for stdin")
    update.add_argument("--expect", help="only if the current digest is this one")
    fork = command("fork", _fork, "copy a session under a new id with another workspace")
    fork.add_argument("session_id")
    fork.add_argument("new_session_id")
    fork.add_argument("workspace")
    checkpoint = command("checkpoint", _checkpoint, "loop/workflow checkpoints: put, get, rm")
    checkpoint.add_argument("action", choices=("put", "get", "rm"))
    checkpoint.add_argument("kind", choices=("loop", "workflow"))
    checkpoint.add_argument("key")
    checkpoint.add_argument("value", nargs="?", help="JSON map for put, or - for stdin")
    lease = command("lease", _lease, "writer lease: acquire (a takeover), get, release")
    lease.add_argument("action", choices=("acquire", "get", "release"))
    lease.add_argument("--holder")
    lease.add_argument("--epoch", type=int)
    watch = command("watch", _watch, "stream committed changes, one JSON line each")
    watch.add_argument("--since", type=int, help="replay retained changes after this seq")
    watch.add_argument("--count", type=int, help="stop after this many events")
    command("compact", _simple("compact"), "checkpoint the index and drop old WAL segments")
    for sub_parser in (put, rm, update, fork, checkpoint):
        sub_parser.add_argument("--lease", help="HOLDER:EPOCH of the current lease")
    command("encode", _encode, "JSON on stdin -> CBOR on stdout (for socat sessions)")
    command("decode", _decode, "CBOR sequence on stdin -> JSON lines on stdout")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if not args.needs_daemon:
            code: int = args.handler(None, args)
            return code
        with Client(args.socket, timeout=args.timeout) as client:
            code = args.handler(client, args)
            return code
    except SessionStoreError as error:
        detail = f" {json.dumps(to_json_value(error.details))}" if error.details else ""
        print(f"sessionstore: {error.code}: {error.message}{detail}", file=sys.stderr)
        return EXIT_ERROR
    except (OSError, ValueError, ProtocolError) as error:
        print(f"sessionstore: {error}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
