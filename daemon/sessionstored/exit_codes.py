# How sessionstored and its subcommands end: one set of numbers for all of them, for
# systemd, scripts and the tests alike. A refusal prints one line to stderr first.
# The numbers mean what they mean for the `sessionstore` command line (its EXIT_CODES,
# sessionstore/tools/cli_common.py), and the daemon's own take numbers the command line
# does not use, so that no exit status means two things.
from __future__ import annotations

import enum
import sys

from sessionstore.tools.helpformat import USAGE_EXIT_CODE


class ExitCode(enum.IntEnum):
    OK = 0
    # could not start (the listener, the store) or the command failed; a retry may work
    FAILED = 1
    # a bad flag, value or combination: fix the command line or the environment
    BAD_USAGE = USAGE_EXIT_CODE
    # a write or an fsync failed while serving: systemd restarts the daemon and recovery
    # runs (the fail-stop rule)
    STORAGE_FAILURE = 8


def refuse(program: str, message: str, code: ExitCode) -> int:
    """Print `program: message` to stderr; the exit code to return."""
    print(f"{program}: {message}", file=sys.stderr)
    return int(code)
