# The wire contract's error codes, one vocabulary for the protocol, the daemon's
# ops and storage, and the clients' exceptions (errors.py has one class per code).
from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    BAD_REQUEST = "bad_request"
    UNKNOWN_OP = "unknown_op"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    FENCED = "fenced"
    INVALID_SNAPSHOT = "invalid_snapshot"
    TOO_LARGE = "too_large"
    COMPACTED = "compacted"
    NO_SPACE = "no_space"
    IO_ERROR = "io_error"
    READ_ONLY = "read_only"
    UNAUTHORIZED = "unauthorized"
    OVERLOADED = "overloaded"
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal"
