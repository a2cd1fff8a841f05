# The `sessionstored` command: a one-line refusal, not a traceback, when the
# daemon's own dependencies are missing (`pip install sessionstore` brings the
# clients and the command line alone; the daemon needs the `daemon` extra).
from __future__ import annotations

import importlib
from collections.abc import Sequence

from ..exit_codes import ExitCode, refuse

# the daemon's imports that the `daemon` extra brings (numpy too, but without it only
# checkpoint_rank is refused)
DAEMON_MODULES = ("prometheus_client", "psycopg", "psycopg_pool")


def missing_modules() -> list[str]:
    missing = []
    for name in DAEMON_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    missing = missing_modules()
    if missing:
        message = (
            f"the daemon's dependencies are not installed ({', '.join(missing)}): "
            "pip install 'sessionstore[daemon]'"
        )
        return refuse("sessionstored", message, ExitCode.FAILED)
    from .cli import main as start

    return start(argv)
