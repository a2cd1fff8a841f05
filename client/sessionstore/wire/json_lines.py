# The JSON-lines dialect: when the first byte a peer sends is "{", the connection
# speaks newline-delimited JSON, one message a line, with the value forms of
# jsonform.py (byte strings, non-finite floats, maps with non-text keys).
from __future__ import annotations

import json
from typing import Any

from . import jsonform
from .codes import ErrorCode
from .jsonform import from_json_value
from .shared import (
    END_OF_STREAM,
    NEED_DATA,
    Deferred,
    Inbox,
    Mode,
    Received,
    Refusal,
    too_large,
)


def _json_text_is_unicode(value: Any) -> bool:
    """False when a \\uD800-style escape left a lone surrogate that UTF-8 cannot hold."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class JsonLinesReader:
    """Messages out of an Inbox of JSON lines."""

    def __init__(
        self,
        inbox: Inbox,
        received: Received,
        max_message_bytes: int,
        max_depth: int,
        *,
        defer_above_bytes: int | None,
    ) -> None:
        self.inbox = inbox
        self.received = received
        self.max_message_bytes = max_message_bytes
        self.max_depth = max_depth
        self.defer_above_bytes = defer_above_bytes
        self._searched = 0  # bytes already searched for a newline

    def next_message(self) -> Any:
        while True:
            newline = self.inbox.data.find(b"\n", self._searched)
            if newline < 0:
                if len(self.inbox.data) > self.max_message_bytes:
                    raise too_large(self.received, self.max_message_bytes)
                self._searched = len(self.inbox.data)
                if not self.inbox.eof:
                    return NEED_DATA
                if not self.inbox.data.strip():
                    self.inbox.data.clear()
                    return END_OF_STREAM
                newline = len(self.inbox.data)
            line = bytes(self.inbox.data[:newline])
            del self.inbox.data[: newline + 1]
            self._searched = 0
            if len(line) > self.max_message_bytes:
                raise too_large(self.received, self.max_message_bytes)
            if not line.strip():
                continue
            if self.defer_above_bytes is not None and len(line) > self.defer_above_bytes:
                return Deferred(line, Mode.JSON)
            try:
                value = jsonform.loads(line)
            except (ValueError, RecursionError) as error:
                raise Refusal(
                    ErrorCode.BAD_REQUEST, f"invalid JSON line: {error}", fatal=False
                ) from None
            if jsonform.containers_deep(value) > self.max_depth:
                raise Refusal(
                    ErrorCode.BAD_REQUEST,
                    f"nesting deeper than {self.max_depth} levels",
                    fatal=False,
                )
            if b"\\u" in line and not _json_text_is_unicode(value):
                raise Refusal(
                    ErrorCode.BAD_REQUEST,
                    "text with a lone surrogate escape is not Unicode",
                    fatal=False,
                )
            try:
                return from_json_value(value)
            except ValueError as error:
                raise Refusal(ErrorCode.BAD_REQUEST, f"bad value: {error}", fatal=False) from None
