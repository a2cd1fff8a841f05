# `sessionstore ...`: runs the command the parser (cli_parser.py) picked, with the
# commands in cli_commands.py. Results go to stdout (cli_common.py), errors to stderr
# naming what is at fault and the fix, and each kind of outcome has one exit code,
# the same for every command (EXIT_CODES).
from __future__ import annotations

import io
import sys
from collections.abc import Sequence

from ..client import Client
from ..errors import NoDaemon, SessionStoreError
from ..paths import client_socket
from ..replies import DEFAULT_TIMEOUT_S
from ..wire import jsonform
from ..wire.codes import ErrorCode
from ..wire.jsonform import to_json_value
from ..wire.protocol import Refusal
from .cli_common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OF_CODE,
    EXIT_OK,
    EXIT_USAGE,
    Output,
    UsageError,
)
from .cli_parser import build_parser


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
    args = build_parser().parse_args(argv)
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
