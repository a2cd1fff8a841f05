# Watch streams. Every committed change lands in the store's history (after it
# is durable, in seq order); a watcher keeps a cursor into it and sends what
# lies beyond. Nothing is skipped: a watcher whose cursor falls out of the
# retained history, or too far behind the newest change, gets one `lagged`
# event with the seq to resume from and is disconnected, and resumes with
# `since`. Watchers share the history, so a slow one costs no memory. The lag
# limit applies once a watcher has caught up: replaying a long `since` backlog
# is not lagging.
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from sessionstore.canonical import digest_text

from .storage.mutations import LEASE, LOOP_CHECKPOINT, SESSION, WORKFLOW_CHECKPOINT, Committed
from .storage.store import Store

WATCH_BATCH_EVENTS = 512
DEFAULT_MAX_LAG_CHANGES = 10_000
WATCH_SEND_TIMEOUT_S = 30.0
CHECKPOINT_KIND_NAMES = {LOOP_CHECKPOINT: "loop", WORKFLOW_CHECKPOINT: "workflow"}


def event_of(change: Committed) -> dict[str, Any]:
    base: dict[str, Any] = {"seq": change.seq, "committed_at_ms": change.committed_at_ms}
    if change.kind == SESSION:
        if change.digest is None:
            return {"event": "delete", "session_id": change.id, **base}
        return {
            "event": "commit",
            "session_id": change.id,
            "digest": digest_text(change.digest),
            **base,
        }
    if change.kind in CHECKPOINT_KIND_NAMES:
        return {
            "event": "checkpoint",
            "kind": CHECKPOINT_KIND_NAMES[change.kind],
            "key": change.id,
            "deleted": change.digest is None,
            **base,
        }
    if change.kind == LEASE:
        return {"event": "lease", **base}
    return {"event": "change", "kind": change.kind, **base}


class Broadcaster:
    def __init__(self, store: Store, max_lag_changes: int = DEFAULT_MAX_LAG_CHANGES) -> None:
        self.store = store
        self.max_lag_changes = max_lag_changes
        self._changed = trio.Event()
        self._closed = False
        self.watchers = 0

    def published(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def close(self) -> None:
        self._closed = True
        self.published()

    def compacted_before(self, since: int) -> int | None:
        """oldest_seq when changes after `since` are no longer all retained, else None."""
        if since >= self.store.seq:
            return None
        oldest = self.store.history.oldest_seq()
        if oldest is None or oldest > since + 1:
            return oldest if oldest is not None else self.store.seq + 1
        return None

    async def stream(self, cursor: int, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        """Send every change after cursor, then live ones, until closed or lagging."""
        self.watchers += 1
        caught_up = False
        try:
            while not self._closed:
                changed = self._changed
                oldest = self.store.history.oldest_seq()
                behind = self.store.seq - cursor
                out_of_history = behind > 0 and (oldest is None or oldest > cursor + 1)
                if out_of_history or (caught_up and behind > self.max_lag_changes):
                    await send({"event": "lagged", "resume_from": cursor})
                    return
                changes = self.store.history.after(cursor, WATCH_BATCH_EVENTS)
                if not changes:
                    caught_up = True
                    await changed.wait()
                    continue
                with trio.move_on_after(WATCH_SEND_TIMEOUT_S) as timeout:
                    for change in changes:
                        await send(event_of(change))
                        cursor = change.seq
                if timeout.cancelled_caught:
                    return  # a watcher that does not read for this long is dropped
        finally:
            self.watchers -= 1
