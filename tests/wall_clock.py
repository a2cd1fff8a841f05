# Time as the tests' daemons read it for expiry. A test that needs a generation
# to have expired moves its daemon's clock past the expires_at_ms the daemon
# reported (the daemons run with --UNSAFE-settable-clock: conftest.py), at once,
# instead of waiting for the time to pass. The clock only moves forward, and a
# restarted daemon reads the system's again.
from __future__ import annotations

import time

from sessionstore.client import Client


def now_ms() -> int:
    """The system's wall clock (the clients', and a daemon's before it was moved)."""
    return time.time_ns() // 1_000_000


def daemon_now_ms(client: Client) -> int:
    return int(client.call("advance_clock", by_ms=0)["now_ms"])


def advance_past(client: Client, expires_at_ms: int) -> int:
    """Move the daemon's clock past expires_at_ms (if it is not already); the time it
    reads then."""
    now = daemon_now_ms(client)
    if now <= expires_at_ms:
        now = int(client.call("advance_clock", by_ms=expires_at_ms - now + 1)["now_ms"])
    return now
