# What every client does with the daemon's replies, whatever its transport:
# take one response off the connection, turn a reply into the call's result or
# its typed exception, make sense of replies read after a broken send, and
# resume a watch (WatchResume) after a lost connection or a `lagged` notice.
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeGuard

from .errors import ConnectionLost, error_from_wire
from .reply_types import WatchEvent
from .requests import UNSET, Call, T, make
from .wire.protocol import END_OF_STREAM, NEED_DATA, Connection, Refusal

# what one recv asks for: Python allocates that much before it knows how much
# arrives, and above glibc's mmap threshold (128 KiB) that costs more than the call
RECEIVE_BYTES = 64 * 1024
DEFAULT_TIMEOUT_S = 60.0
MAX_RESPONSE_BYTES = 1024 * 1024 * 1024
WATCH_RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


def take_response(conn: Connection) -> dict[str, Any] | None:
    """The next response, or None when more bytes are needed."""
    message = conn.next_message()
    if message is END_OF_STREAM:
        raise ConnectionLost("the daemon closed the connection")
    if message is NEED_DATA:
        return None
    if not isinstance(message, dict):
        raise ConnectionLost(f"malformed response {message!r}")
    return message


def answers_after_broken_send(replies: list[dict[str, Any]], count: int) -> list[Any] | None:
    """The daemon closed while requests were still being sent. It does that after
    refusing one it cannot take (too_large, a framing error), so the replies read after
    the broken send may hold that refusal: then they stand for the `count` requests,
    the refusal for those it cut off. None when none of them is a refusal."""
    refusals = [reply for reply in replies if reply.get("ok") is not True]
    if not refusals:
        return None
    return replies + [refusals[-1]] * (count - len(replies))


def closes_connection(replies: list[dict[str, Any]]) -> bool:
    """Whether one of the replies is a refusal after which the daemon closes the
    connection (`closing: true`): the next call needs a new one."""
    return any(
        reply.get("ok") is not True and (reply.get("error") or {}).get("closing") is True
        for reply in replies
    )


def result_of(call: Call[T], reply: dict[str, Any]) -> T:
    if reply.get("ok") is True:
        return call.result(reply)
    raise error_from_wire(reply.get("error"))


def results_of(calls: Sequence[Call[Any]], replies: list[dict[str, Any]]) -> list[Any]:
    return [result_of(call, reply) for call, reply in zip(calls, replies, strict=True)]


def backup_ended(message: dict[str, Any]) -> bool:
    """A message of a `backup` stream after its header: True for the end, False for
    payloads; an error reply raises its exception."""
    if message.get("end"):
        return True
    if "payloads" in message:
        return False
    result_of(make("backup"), message)  # an error reply: its exception
    raise ConnectionLost(f"unexpected message in a backup: {sorted(message)}")


# what a watch resumes after: the socket failing, or a reply it cannot frame
RESUMABLE = (ConnectionLost, OSError, Refusal)


class WatchResume:
    """Where a watch stands between connections: the seq to resume after, and how
    many reconnects in a row have failed (the next wait grows with them)."""

    def __init__(self, since: int | None) -> None:
        self.cursor = since
        self.failures = 0

    def request(self) -> dict[str, Any]:
        return make("watch", since=UNSET if self.cursor is None else self.cursor).request

    def started(self, reply: dict[str, Any]) -> None:
        """The watch's first reply: raises its error (Compacted when history is gone)."""
        result_of(make("watch"), reply)
        if self.cursor is None:
            self.cursor = reply["seq"]
        self.failures = 0

    def deliver(self, event: dict[str, Any]) -> TypeGuard[WatchEvent]:
        """True: hand the event on; False: it is a `lagged` notice, resume from there."""
        if event.get("event") == "lagged":
            self.cursor = event["resume_from"]
            return False
        self.cursor = event["seq"]
        return True

    def lost(self) -> float:
        """The connection was lost: seconds to wait before the next one."""
        delay = WATCH_RETRY_S[min(self.failures, len(WATCH_RETRY_S) - 1)]
        self.failures += 1
        return delay
