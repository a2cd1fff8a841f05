# `sessionstore ...`: argument parsing and exit codes only. JSON on stdout,
# errors on stderr, exit 0 on success and non-zero otherwise.
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import cbor2

from .client import UNSET, Client
from .errors import SessionStoreError
from .protocol import NEED_DATA, Connection, Mode, ProtocolError, from_json_value, to_json_value

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
    return from_json_value(json.loads(text))


def _expect(args: argparse.Namespace) -> Any:
    if getattr(args, "create_only", False):
        return None
    return args.expect if getattr(args, "expect", None) else UNSET


def _strip_ok(response: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in response.items() if k not in ("ok", "rid")}


def _encode(_client: Client | None, _args: argparse.Namespace) -> int:
    """JSON (one document, or JSON lines) on stdin -> a CBOR sequence on stdout."""
    text = sys.stdin.read()
    try:
        values = [json.loads(text)]
    except json.JSONDecodeError:
        values = [json.loads(line) for line in text.splitlines() if line.strip()]
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
        if message is None or message is NEED_DATA:
            return 0
        _print(message)


def _get(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    result = client.load_with_meta(args.session_id)
    if result["snapshot"] is None:
        print(f"sessionstore: no session {args.session_id!r}", file=sys.stderr)
        return EXIT_NOT_FOUND
    _print(_strip_ok(result) if args.meta else result["snapshot"])
    return 0


def _put(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    _print(_strip_ok(client.save(_read_json(args.file), expect=_expect(args))))
    return 0


def _rm(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    _print(_strip_ok(client.delete(args.session_id, expect=_expect(args))))
    return 0


def _ls(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    if args.limit is not None:
        _print(_strip_ok(client.list(args.prefix, after=args.after, limit=args.limit)))
    else:
        _print(list(client.iter_ids(args.prefix)))
    return 0


def _verify(client: Client | None, _args: argparse.Namespace) -> int:
    assert client is not None
    result = _strip_ok(client.verify())
    _print(result)
    return EXIT_PROBLEMS if result["problems"] else 0


def _simple(op: str, arg: str | None = None) -> Any:
    def run(client: Client | None, args: argparse.Namespace) -> int:
        assert client is not None
        fields = {arg: getattr(args, arg)} if arg else {}
        _print(_strip_ok(client.call(op, **fields)))
        return 0

    return run


def _call(client: Client | None, args: argparse.Namespace) -> int:
    assert client is not None
    fields = from_json_value(json.loads(args.args)) if args.args else {}
    if not isinstance(fields, dict):
        raise SystemExit("sessionstore: call arguments must be a JSON object")
    _print(_strip_ok(client.call(args.op, **fields)))
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
