# The wall clock as the daemon's expiry reads it: tests that need a generation to
# have expired wait until the clock has passed its expires_at_ms (as the daemon
# reported it), never for a guessed number of seconds.
from __future__ import annotations

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def until_past(expires_at_ms: int) -> None:
    """Return once the wall clock has passed expires_at_ms."""
    while now_ms() <= expires_at_ms:
        time.sleep(max(0.001, (expires_at_ms - now_ms() + 1) / 1000))
