# Watch streams. Every committed change lands in the store's history (after it
# is durable, in seq order); a watcher keeps a cursor into it and sends what
# lies beyond. Nothing is skipped: a watcher whose cursor falls out of the
# retained history, or too far behind the newest change, gets one `lagged`
# event with the seq to resume from and is disconnected, and resumes with
# `since`. Watchers share the history, so a slow one costs no memory.
#
# Lag counts what the watcher has not read, not only what is not yet sent: the
# events sitting unread in the socket (the kernel's count of unread bytes,
# mapped back to the events that filled them) are behind too, so the bound holds
# whether or not the watcher reads. An event is written only when the socket has
# room for it, and while it has none the stream waits for room or for the next
# change, which may push the lag past the bound. The `lagged` event goes out
# when the socket can take it, after the events already queued, so resuming from
# its seq is gapless; a watcher that takes nothing for WATCH_SEND_TIMEOUT_S then
# is dropped without it. Either way: a log line and a `stats` counter. The lag
# bound applies once a watcher has caught up: replaying a long `since` backlog
# is not lagging.
from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import trio

from sessionstore.wire.canonical import digest_text

from ..config import WATCH_SEND_TIMEOUT_S
from ..storage.engine import Engine
from ..storage.mutations import (
    KV_DOCUMENT,
    LEASE,
    LOOP_CHECKPOINT,
    SESSION,
    WORKFLOW_CHECKPOINT,
    Committed,
)

log = logging.getLogger("sessionstored.watch")

WATCH_BATCH_EVENTS = 256  # at ~150 bytes each, well inside the room a writable socket has
DEFAULT_MAX_LAG_CHANGES = 10_000
CHECKPOINT_KIND_NAMES = {
    LOOP_CHECKPOINT: "loop",
    WORKFLOW_CHECKPOINT: "workflow",
    KV_DOCUMENT: "kv",
}


def event_of(change: Committed) -> dict[str, Any]:
    base: dict[str, Any] = {"seq": change.seq, "committed_at_ms": change.committed_at_ms}
    if change.expired:  # removed by the expiry sweep
        base["expired"] = True
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


class Sink(Protocol):
    """Where a stream goes: a watcher's connection (front/watch_sink.py), or a test's."""

    sent_bytes: int

    async def send(self, message: dict[str, Any]) -> None: ...

    def unread_bytes(self) -> int: ...

    def writable(self) -> bool: ...

    async def wait_writable(self) -> None: ...


class Broadcaster:
    def __init__(
        self,
        store: Engine,
        max_lag_changes: int = DEFAULT_MAX_LAG_CHANGES,
        send_timeout_s: float = WATCH_SEND_TIMEOUT_S,
    ) -> None:
        self.store = store
        self.max_lag_changes = max_lag_changes
        self.send_timeout_s = send_timeout_s
        self._changed = trio.Event()
        self._closed = False
        self.watchers = 0
        self.cut_off = 0  # told `lagged` (or dropped while being told)
        self.dropped = 0  # took nothing for WATCH_SEND_TIMEOUT_S: left without the event

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

    async def stream(self, cursor: int, sink: Sink) -> None:
        """Send every change after cursor, then live ones, until closed or lagging."""
        self.watchers += 1
        caught_up = False
        delivered = cursor  # the newest seq the watcher has read
        in_flight: deque[tuple[int, int]] = deque()  # (sent_bytes once written, seq)
        try:
            while not self._closed:
                changed = self._changed
                read_up_to = sink.sent_bytes - sink.unread_bytes()
                while in_flight and in_flight[0][0] <= read_up_to:
                    delivered = in_flight.popleft()[1]
                behind = self.store.seq - delivered
                oldest = self.store.history.oldest_seq()
                out_of_history = self.store.seq > cursor and (oldest is None or oldest > cursor + 1)
                if out_of_history or (caught_up and behind > self.max_lag_changes):
                    await self._cut_off(sink, cursor, behind, out_of_history)
                    return
                changes = self.store.history.after(cursor, WATCH_BATCH_EVENTS)
                if not changes:
                    caught_up = True
                    await changed.wait()
                    continue
                if not sink.writable():
                    await _room_or_change(sink, changed)
                    continue  # either way, the lag is measured again first
                with trio.move_on_after(self.send_timeout_s) as timeout:
                    for change in changes:
                        await sink.send(event_of(change))
                        cursor = change.seq
                        in_flight.append((sink.sent_bytes, cursor))
                if timeout.cancelled_caught:
                    self._dropped(cursor, "a batch of events")
                    return
        finally:
            self.watchers -= 1

    async def _cut_off(self, sink: Sink, cursor: int, behind: int, out_of_history: bool) -> None:
        self.cut_off += 1
        why = "its history was compacted away" if out_of_history else f"{behind} changes behind"
        log.warning(
            "watcher cut off: %s (--watch-max-lag %d); told lagged, resume_from %d",
            why,
            self.max_lag_changes,
            cursor,
        )
        with trio.move_on_after(self.send_timeout_s) as timeout:
            if not sink.writable():
                await sink.wait_writable()
            await sink.send({"event": "lagged", "resume_from": cursor})
        if timeout.cancelled_caught:
            self._dropped(cursor, "the lagged event")

    def _dropped(self, cursor: int, what: str) -> None:
        self.dropped += 1
        log.warning(
            "watcher dropped: it read nothing for %.0f s, so %s never went out (resume_from %d)",
            self.send_timeout_s,
            what,
            cursor,
        )


async def _room_or_change(sink: Sink, changed: trio.Event) -> None:
    """Return when the socket has room or a new change is published."""
    async with trio.open_nursery() as nursery:

        async def first(wait: Callable[[], Any]) -> None:
            await wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(first, sink.wait_writable)
        nursery.start_soon(first, changed.wait)
