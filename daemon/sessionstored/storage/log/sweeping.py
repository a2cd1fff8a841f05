# The log engine's side of the expiry sweep (engine.Expiry), on the readers' thread
# like publish(): the schedule (expiries.py) says what is due and when next, and the
# index whether a due generation the sweep did not remove is still due.
from __future__ import annotations

from ..mutations import Expire
from .state import LogState


class LogExpiry:
    def __init__(self, state: LogState) -> None:
        self.state = state

    def next_ms(self) -> int | None:
        return self.state.expiries.next_ms()

    def due(self, now_ms: int, limit: int) -> list[Expire]:
        return self.state.expiries.due(now_ms, limit)

    def retry(self, expire: Expire) -> None:
        """A due generation the sweep did not remove (the sweep failed, a full disk say,
        or the writer's clock had it unexpired): it is due again, unless a write since
        gave the document another expiry, or none, or removed it."""
        entry = self.state.index.get(expire.kind, expire.id)
        if entry is not None and entry.expires_at_ms == expire.expires_at_ms:
            self.state.expiries.schedule(expire.kind, expire.id, expire.expires_at_ms)
