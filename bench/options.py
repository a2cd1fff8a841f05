# Options every bench entry point shares.
from __future__ import annotations

import argparse
import os


def existing_dir(text: str) -> str:
    """--dir: a directory that exists, where the run makes its own temporary one."""
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text}: no such directory")
    return text
