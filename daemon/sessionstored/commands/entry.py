# The `sessionstored` command: a one-line refusal, not a traceback, when the
# daemon's own dependencies are missing (`pip install sessionstore` brings the
# clients and the command line alone; the daemon needs the `daemon` extra).
from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from ..exit_codes import ExitCode, refuse

# the daemon's imports that the `daemon` extra brings (numpy too, but without it only
# checkpoint_rank is refused)
DAEMON_MODULES = ("prometheus_client", "psycopg", "psycopg_pool")


def missing_modules() -> list[str]:
    """Looked up, not imported: the start imports what it uses when it uses it."""
    return [name for name in DAEMON_MODULES if importlib.util.find_spec(name) is None]


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
