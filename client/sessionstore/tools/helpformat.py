# The parsers of both command lines: --help shows every option's default, except
# where there is none to show (unset, off, empty), with descriptions kept as written;
# a usage error is one line, as every other refusal is.
from __future__ import annotations

import argparse
import math
from typing import NoReturn

from ..wire.shared import MAX_TTL_S

USAGE_EXIT_CODE = 2  # both command lines' code for a bad option or argument


class DefaultsShown(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, [], "") or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


class OneLineUsage(argparse.ArgumentParser):
    """A bad option or value prints `prog: reason (see `prog --help`)` and exits 2,
    instead of the usage (every option, on a screenful) before the reason."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT_CODE, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _seconds(text: str, *, zero_allowed: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    least = 0.0 if zero_allowed else math.nextafter(0.0, 1.0)
    if not least <= value <= MAX_TTL_S:  # nan too
        what = "0 or more" if zero_allowed else "a positive number of"
        raise argparse.ArgumentTypeError(f"{text} is not {what} seconds, at most a century")
    return value


def positive_seconds(text: str) -> float:
    """An option's type: seconds, finite and above zero."""
    return _seconds(text, zero_allowed=False)


def seconds_or_zero(text: str) -> float:
    """An option's type: seconds, finite, zero allowed."""
    return _seconds(text, zero_allowed=True)
