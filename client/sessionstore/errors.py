from __future__ import annotations

from typing import Any


class SessionStoreError(Exception):
    code = "internal"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class ConnectionLost(SessionStoreError):
    code = "connection_lost"


class BadRequest(SessionStoreError):
    code = "bad_request"


class UnknownOp(SessionStoreError):
    code = "unknown_op"


class NotFound(SessionStoreError):
    code = "not_found"


class Conflict(SessionStoreError):
    code = "conflict"

    @property
    def current(self) -> str | None:
        value = self.details.get("current")
        return value if isinstance(value, str) else None


class Fenced(SessionStoreError):
    code = "fenced"


class InvalidSnapshot(SessionStoreError):
    code = "invalid_snapshot"


class TooLarge(SessionStoreError):
    code = "too_large"


class Compacted(SessionStoreError):
    code = "compacted"


class NoSpace(SessionStoreError):
    code = "no_space"


class IOFailure(SessionStoreError):
    code = "io_error"


class ReadOnly(SessionStoreError):
    code = "read_only"


class Unauthorized(SessionStoreError):
    code = "unauthorized"


class Overloaded(SessionStoreError):
    code = "overloaded"


class ShuttingDown(SessionStoreError):
    code = "shutting_down"


class InternalError(SessionStoreError):
    code = "internal"


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
