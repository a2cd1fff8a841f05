from __future__ import annotations

from typing import Any

from .wire.codes import ErrorCode


class SessionStoreError(Exception):
    """Every error a client raises: `code` is the wire error code (or
    "connection_lost"), `message` the daemon's words, `details` the rest of the
    error map (`current` for a conflict, `oldest_seq` for compacted, ...)."""

    code: str = ErrorCode.INTERNAL  # a wire ErrorCode, or "connection_lost" (client-side only)

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


# Three tiers under SessionStoreError, for a caller that handles errors by kind
# (each error below names its tier in its bases):
#   InputError: the request itself is wrong; sent again unchanged, it fails again.
#   PreconditionFailed: the store is not as the request required (a digest moved, a
#     lease is held, a document is missing or no longer kept); read, decide, retry.
#   RetryLater: the daemon could not do it now (overloaded, stopping, disk full, an
#     I/O error); the same request may succeed later. An I/O error is the one whose
#     write may still have landed (a failed sync), and a damaged record's read fails
#     until it is repaired: IOFailure says so.
# ConnectionLost (and Timeout) stand apart: whether a write was applied is unknown.


class InputError(SessionStoreError):
    """The request is wrong in itself: fix it before sending it again."""


class PreconditionFailed(SessionStoreError):
    """The store is not in the state the request required; nothing was written."""


class RetryLater(SessionStoreError):
    """The daemon could not serve the request now; the same request may succeed later
    (IOFailure: read a write back first)."""


class ConnectionLost(SessionStoreError):
    """The socket failed, or the daemon closed the connection. Whether a write sent just
    before was applied is unknown: read it back (or retry it under `expect`)."""

    code = "connection_lost"


class Timeout(ConnectionLost):
    """No reply came within the client's timeout. The client closes the connection (a
    late reply would answer the next request), so, as for any ConnectionLost, whether
    a write was applied is unknown."""

    code = "timeout"


class NoDaemon(ConnectionLost):
    """Nothing answers at the socket: no daemon runs there."""

    def __init__(self, socket_path: str, error: OSError) -> None:
        super().__init__(
            f"no daemon answers at {socket_path} ({error.strerror or error}): start one with "
            f"`sessionstored --socket {socket_path}` (or `make run` in a checkout), or pass "
            "the socket of the one you run (--socket, $SESSIONSTORE_SOCKET)"
        )
        self.socket_path = socket_path


class UnsafeSocketDirectory(ConnectionLost):
    """The /tmp fallback's directory is not ours and 0700: someone else could have put a
    socket of their own there."""


class BadRequest(InputError):
    """The request is malformed: not a map, no op, a required argument missing or of
    the wrong type. Retrying it unchanged fails the same way."""

    code = ErrorCode.BAD_REQUEST


class UnknownOp(InputError):
    """The daemon has no op of that name (an older daemon: see `hello`)."""

    code = ErrorCode.UNKNOWN_OP


class NotFound(PreconditionFailed):
    """`update` or `revert` of a missing session, or `fork` of a missing source."""

    code = ErrorCode.NOT_FOUND


class Conflict(PreconditionFailed):
    """A compare-and-swap failed: an `expect` not met, a create-only save of an
    existing session, a `fork` onto an existing id, a `txn` requirement not met.
    `current` is the digest that stands now."""

    code = ErrorCode.CONFLICT

    @property
    def current(self) -> str | None:
        value = self.details.get("current")
        return value if isinstance(value, str) else None


class Fenced(PreconditionFailed):
    """A write without the current lease while one is held; `details` carry the
    holder and epoch that hold it."""

    code = ErrorCode.FENCED

    @property
    def holder(self) -> str | None:
        """Who holds the lease now."""
        value = self.details.get("holder")
        return value if isinstance(value, str) else None

    @property
    def epoch(self) -> int | None:
        """The epoch of the lease that holds."""
        value = self.details.get("epoch")
        return value if isinstance(value, int) else None


class InvalidSnapshot(InputError):
    """The snapshot breaks the document rules (docs/protocol.md, "The snapshot
    document"): nothing was written."""

    code = ErrorCode.INVALID_SNAPSHOT


class TooLarge(InputError):
    """A request, snapshot or value over the daemon's limit (`hello`'s `limits`), or
    a range delete or txn over its count limit."""

    code = ErrorCode.TOO_LARGE


class Compacted(PreconditionFailed):
    """What was asked for is no longer kept: a `watch` since a seq older than the
    retained history, or a `load`/`revert`/`fork` at a generation older than the
    oldest kept; `details["oldest_seq"]` says where history starts."""

    code = ErrorCode.COMPACTED

    @property
    def oldest_seq(self) -> int | None:
        """Where the kept history starts: the oldest seq that can still be asked for."""
        value = self.details.get("oldest_seq")
        return value if isinstance(value, int) else None


class NoSpace(RetryLater):
    """The daemon's disk is full: writes are refused until space is freed; deletes
    still work."""

    code = ErrorCode.NO_SPACE


class IOFailure(RetryLater):
    """A read found a damaged record (the message names the file and offset; it fails
    again until repaired), the disk or the database failed the request, or an injected
    fault did. A write refused this way may still have landed: read it back before
    sending it again."""

    code = ErrorCode.IO_ERROR


class ReadOnly(SessionStoreError):
    """Reserved by the protocol for a daemon that takes no writes; sessionstored does
    not send it today."""

    code = ErrorCode.READ_ONLY


class Unauthorized(SessionStoreError):
    """This peer may not connect, or may only read and sent a write (`--allow-uid`,
    `--read-only-uid`)."""

    code = ErrorCode.UNAUTHORIZED


class Overloaded(RetryLater):
    """The daemon has as many connections as it takes (`--max-connections`): try
    again later."""

    code = ErrorCode.OVERLOADED


class ShuttingDown(RetryLater):
    """The daemon is stopping; a write refused this way was not applied."""

    code = ErrorCode.SHUTTING_DOWN


class InternalError(SessionStoreError):
    """A bug in the daemon (counted in `stats`), or a reply the client cannot read."""

    code = ErrorCode.INTERNAL


# Raised by the client side alone (no wire code of the daemon's):


class StaleOwner(SessionStoreError):
    """An adapter made with owner=: another owner has taken this thread or session over,
    and this owner's write changed nothing. Stop writing to it, or take it back over
    (fencing the other)."""

    code = "stale_owner"


class UnresolvedEffect(SessionStoreError):
    """sessionstore.effects: an earlier run intended this effect and never recorded its
    outcome, so it may or may not have happened; the tool was not run. Settle it with
    resolve(key, result) or retry(key)."""

    code = "unresolved_effect"

    def __init__(self, key: str, record: dict[str, Any]) -> None:
        error = f" (it raised: {record['error']})" if record.get("error") else ""
        super().__init__(
            f"effect {key!r} was intended at {record['at_ms']} ms and its outcome was never"
            f" recorded{error}: resolve it or retry it",
            {"key": key, "record": record},
        )
        self.key = key


ERROR_CLASSES: dict[str, type[SessionStoreError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        UnknownOp,
        NotFound,
        Conflict,
        Fenced,
        InvalidSnapshot,
        TooLarge,
        Compacted,
        NoSpace,
        IOFailure,
        ReadOnly,
        Unauthorized,
        Overloaded,
        ShuttingDown,
        InternalError,
    )
}


def error_from_wire(error: Any) -> SessionStoreError:
    if not isinstance(error, dict):
        return InternalError(f"malformed error reply: {error!r}")
    code = error.get("code")
    message = str(error.get("message", ""))
    details = {k: v for k, v in error.items() if k not in ("code", "message")}
    cls = ERROR_CLASSES.get(code if isinstance(code, str) else "", InternalError)
    return cls(message, details)
