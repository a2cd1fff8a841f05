# The wall clock that expiry reads, in ms since the epoch: when a generation
# expires, whether it has, when a lease was taken. Every part of the daemon reads
# it here, so that a daemon started with --UNSAFE-settable-clock (the tests') can
# have it moved forward by the `advance_clock` op and show expiry at once, where
# a test would otherwise wait for the time to pass. It only ever moves forward.
from __future__ import annotations

import time

_ahead_ms = 0  # how far `advance_clock` has moved this daemon's clock past the system's


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000 + _ahead_ms


def advance(by_ms: int) -> int:
    """Move the clock forward by by_ms (>= 0); the time it reads now."""
    global _ahead_ms
    if by_ms < 0:
        raise ValueError("the clock only moves forward")
    _ahead_ms += by_ms
    return epoch_ms()
