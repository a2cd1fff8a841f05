from __future__ import annotations

from typing import Any

from .wire.codes import ErrorCode


class SessionStoreError(Exception):
    code: str = ErrorCode.INTERNAL  # a wire ErrorCode, or "connection_lost" (client-side only)

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class ConnectionLost(SessionStoreError):
    code = "connection_lost"


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


class BadRequest(SessionStoreError):
    code = ErrorCode.BAD_REQUEST


class UnknownOp(SessionStoreError):
    code = ErrorCode.UNKNOWN_OP


class NotFound(SessionStoreError):
    code = ErrorCode.NOT_FOUND


class Conflict(SessionStoreError):
    code = ErrorCode.CONFLICT

    @property
    def current(self) -> str | None:
        value = self.details.get("current")
        return value if isinstance(value, str) else None


class Fenced(SessionStoreError):
    code = ErrorCode.FENCED


class InvalidSnapshot(SessionStoreError):
    code = ErrorCode.INVALID_SNAPSHOT


class TooLarge(SessionStoreError):
    code = ErrorCode.TOO_LARGE


class Compacted(SessionStoreError):
    code = ErrorCode.COMPACTED


class NoSpace(SessionStoreError):
    code = ErrorCode.NO_SPACE


class IOFailure(SessionStoreError):
    code = ErrorCode.IO_ERROR


class ReadOnly(SessionStoreError):
    code = ErrorCode.READ_ONLY


class Unauthorized(SessionStoreError):
    code = ErrorCode.UNAUTHORIZED


class Overloaded(SessionStoreError):
    code = ErrorCode.OVERLOADED


class ShuttingDown(SessionStoreError):
    code = ErrorCode.SHUTTING_DOWN


class InternalError(SessionStoreError):
    code = ErrorCode.INTERNAL


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
