# Waiting for something a test cannot make happen sooner (another process's
# progress, a daemon's state) by looking for it, never for a guessed time.
from __future__ import annotations

import time
from collections.abc import Callable

POLL_S = 0.01  # how often the condition is looked at


def until(done: Callable[[], object], what: str, limit_s: float = 60.0) -> None:
    """Return as soon as done() is true; fail naming `what` after limit_s."""
    deadline = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(POLL_S)
