# --help for both command lines: every option's default shown, except where
# there is none to show (unset, off, empty), and descriptions kept as written.
from __future__ import annotations

import argparse


class DefaultsShown(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, [], "") or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)
