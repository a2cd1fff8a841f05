# What every `sessionstore` command shares: the exit codes (one per kind of outcome,
# the same for every command), the output (readable on a terminal, one compact JSON
# line per result under a pipe or with --json), and reading JSON arguments.
from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..client import UNSET
from ..wire import jsonform
from ..wire.codes import ErrorCode
from ..wire.jsonform import from_json_value, to_json_value
from .helpformat import USAGE_EXIT_CODE

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = USAGE_EXIT_CODE
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
    (EXIT_UNAVAILABLE, "unavailable: no daemon on the socket, connection lost, timeout, "
     "overloaded, shutting down"),
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
    "timeout": EXIT_UNAVAILABLE,
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


def read_json(source: str) -> Any:
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


def json_arg(text: str, what: str) -> Any:
    try:
        return from_json_value(jsonform.loads(text))
    except ValueError as error:
        raise UsageError(f"{what} is not valid JSON ({error}): {text[:60]!r}") from None


def expect(args: argparse.Namespace) -> Any:
    if getattr(args, "create_only", False):
        return None
    return args.expect if getattr(args, "expect", None) else UNSET


def lease_option(args: argparse.Namespace) -> Any:
    if not getattr(args, "lease", None):
        return UNSET
    holder, _, epoch = args.lease.rpartition(":")
    if not holder or not epoch.isdigit():
        raise UsageError(
            f"--lease must be HOLDER:EPOCH (as `lease acquire` prints), not {args.lease!r}"
        )
    return (holder, int(epoch))


def with_progress(what: str, work: Callable[[], Any]) -> Any:
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
