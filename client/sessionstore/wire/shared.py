# What every part of the wire layer shares: the dialects, the sentinels that
# next_message() returns besides messages, the error a peer's bytes raise, and
# the limits.
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal

from .codes import ErrorCode
from .value_class import value_class

DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
MAX_NESTING_DEPTH = 64
MAX_TTL_S = 100 * 365 * 24 * 3600  # the longest expiry a request may ask for: a century

Received = Literal["request", "response"]  # what the peer sends: how errors name it


class Refusal(Exception):
    """The one way to say "answer with error code X": the code (codes.py says when each
    is given), a message for people, details for programs (they become the error
    map's other fields), and fatal when the connection closes after the reply (a
    framing error). Raised where the refusal is found, or carried as a value (a
    mutation's outcome, a large item's preparation in a worker process)."""

    def __init__(
        self, code: ErrorCode, message: str, *, fatal: bool = False, **details: Any
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal
        self.details = details

    def __reduce__(self) -> tuple[Any, ...]:  # raised in a worker process, re-raised here
        return (_refusal, (self.code, self.message, self.fatal, self.details))


def _refusal(code: ErrorCode, message: str, fatal: bool, details: dict[str, Any]) -> Refusal:
    return Refusal(code, message, fatal=fatal, **details)


class Mode(enum.Enum):
    UNDECIDED = "undecided"
    CBOR = "cbor"
    JSON = "json"


class MoreWork:
    """Bytes are buffered but the walk of a large item stopped at its budget: yield to
    others, then call next_message() again."""

    def __repr__(self) -> str:
        return "MORE_WORK"


MORE_WORK = MoreWork()


class NeedData:
    pass


class EndOfStream:
    pass


NEED_DATA = NeedData()
END_OF_STREAM = EndOfStream()  # not None: a CBOR null is a message like any other


@dataclass(frozen=True)
class Deferred:
    """A whole item (or JSON line) too large to decode here: bytes, undecoded, for a caller
    that decodes it elsewhere (the daemon: in a worker process, off its event loop)."""

    data: bytes
    mode: Mode


@value_class
class CanonicalItem:
    """A request argument left undecoded: one item's bytes, checked by the CBOR helper
    and in canonical form. The rules decode only the parts they read (byte_path.py)."""

    data: bytes


def too_large(received: Received, limit: int) -> Refusal:
    return Refusal(
        ErrorCode.TOO_LARGE, f"{received} exceeds max_{received}_bytes={limit}", fatal=True
    )


class Inbox:
    """The bytes received and not yet consumed, and whether the peer has closed."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.eof = False
