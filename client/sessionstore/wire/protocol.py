# Theory of operation
#
# A connection carries one dialect each way, chosen by the first byte the peer
# sends: a CBOR sequence (RFC 8742; cbor_framing.py finds where each item ends
# and decodes it), or, when that byte is "{", newline-delimited JSON
# (json_lines.py, with the value forms of jsonform.py). messages.py is the
# envelope on top: what makes an item a request, the shape of replies, encoding.
#
# Connection is the state machine: UNDECIDED until a byte arrives, then CBOR or
# JSON, and FAILED for good after a framing error (the peer's bytes can no
# longer be trusted to start where a message starts). The daemon's connections
# receive requests and the clients' receive responses; each names what it
# received in its errors ("request exceeds max_request_bytes", or "response
# ..."), the way h11 tells the local side from the remote one.
#
# No I/O happens here (the h11 pattern): receive_data() takes bytes,
# next_message() hands back decoded messages (or NEED_DATA, END_OF_STREAM, and
# for a reader that defers large items, Deferred and MORE_WORK), encode() turns
# a message into bytes. Feeding one byte at a time gives the same messages as
# feeding all at once, which the tests check.
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import cbor_bytes as _cbor_bytes
from .byte_path import ByteReader
from .canonical import Hint
from .cbor_framing import FAST_PATH_MAX_BYTES, CborReader, ItemWalker
from .codes import ErrorCode
from .json_lines import JsonLinesReader
from .messages import (
    PROTOCOL_VERSION,
    SCALAR_TYPES,
    RawCBOR,
    Request,
    encode,
    encode_request,
    error_response,
    ok_response,
    parse_request,
    refusal_response,
)
from .shared import (
    DEFAULT_MAX_REQUEST_BYTES,
    END_OF_STREAM,
    MAX_NESTING_DEPTH,
    MORE_WORK,
    NEED_DATA,
    Deferred,
    EndOfStream,
    Inbox,
    Mode,
    MoreWork,
    NeedData,
    Received,
    Refusal,
)

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "END_OF_STREAM",
    "FAST_PATH_MAX_BYTES",
    "MAX_NESTING_DEPTH",
    "MORE_WORK",
    "NEED_DATA",
    "PROTOCOL_VERSION",
    "SCALAR_TYPES",
    "Connection",
    "Deferred",
    "EndOfStream",
    "ItemWalker",
    "Mode",
    "MoreWork",
    "NeedData",
    "RawCBOR",
    "Refusal",
    "Request",
    "encode",
    "error_response",
    "ok_response",
    "parse_request",
    "refusal_response",
]


MAX_LEADING_WHITESPACE_BYTES = 4096
_WHITESPACE = b" \t\r\n"


def _first_significant(data: bytearray) -> int | None:
    """The first byte that is not JSON whitespace. A request is a map, and no CBOR map
    starts with these bytes, so skipping them to find "{" costs a CBOR peer nothing."""
    for index in range(min(len(data), MAX_LEADING_WHITESPACE_BYTES)):
        if data[index] not in _WHITESPACE:
            return data[index]
    return None


class Connection:
    """One side of a connection: bytes in, decoded messages out."""

    def __init__(
        self,
        max_message_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_depth: int = MAX_NESTING_DEPTH,
        mode: Mode = Mode.UNDECIDED,
        *,
        received: Received = "response",
        order_maps: bool = False,
        defer_above_bytes: int | None = None,
        walk_budget_bytes: int | None = None,
        max_items: int | None = None,
        cbor_bytes: bool | None = None,
        documents: Mapping[str, frozenset[str]] | None = None,
        defer_canonical_above_bytes: int | None = None,
    ) -> None:
        """received: what the peer sends ("request" on the daemon's side). order_maps:
        hand out maps in canonical order and set last_hint (the daemon). Items over
        defer_above_bytes come out as Deferred; a large item is walked at most
        walk_budget_bytes per call (then MORE_WORK). cbor_bytes: take requests through
        the compiled helper (byte_path.py; by default where it is built), keeping the
        arguments that `documents` names per op as CanonicalItem bytes; there, items to
        canonicalise over defer_above_bytes and canonical ones over
        defer_canonical_above_bytes come out as Deferred."""
        self.max_message_bytes = max_message_bytes
        self.max_depth = max_depth
        self.mode = mode
        self.received = received
        self._inbox = Inbox()
        self._failed = False
        use_bytes = cbor_bytes if cbor_bytes is not None else _cbor_bytes.compiled
        byte_reader = (
            ByteReader(
                max_message_bytes,
                max_depth,
                max_items,
                documents or {},
                defer_above_bytes,
                defer_canonical_above_bytes,
            )
            if use_bytes and order_maps and received == "request"
            else None
        )
        self._cbor = CborReader(
            self._inbox,
            received,
            max_message_bytes,
            max_depth,
            order_maps=order_maps,
            defer_above_bytes=defer_above_bytes,
            walk_budget_bytes=walk_budget_bytes,
            max_items=max_items,
            byte_reader=byte_reader,
        )
        self._json = JsonLinesReader(
            self._inbox,
            received,
            max_message_bytes,
            max_depth,
            defer_above_bytes=defer_above_bytes,
        )

    @property
    def failed(self) -> bool:
        """A refusal ended the connection's stream for good (mode says which dialect)."""
        return self._failed

    @property
    def last_hint(self) -> Hint:
        """What decoding the last CBOR message learned about encoding it canonically."""
        return self._cbor.last_hint

    def receive_data(self, data: bytes) -> None:
        self._inbox.data += data
        self._cbor.data_arrived()

    def receive_eof(self) -> None:
        self._inbox.eof = True

    @property
    def idle(self) -> bool:
        """Nothing buffered and no EOF: the next message needs more bytes (next_message
        would say NEED_DATA)."""
        return not self._inbox.data and not self._inbox.eof and not self._failed

    @property
    def buffered(self) -> int:
        return len(self._inbox.data)

    def next_message(self) -> Any:
        """A decoded message, NEED_DATA, END_OF_STREAM (EOF with nothing buffered), or raise
        Refusal."""
        if self._failed:
            raise Refusal(ErrorCode.BAD_REQUEST, "connection already failed", fatal=True)
        if self.mode is Mode.UNDECIDED:
            first = _first_significant(self._inbox.data)
            if first is None:  # nothing yet, or only whitespace: a JSON-lines peer's habit
                if self._inbox.eof:
                    return END_OF_STREAM
                if len(self._inbox.data) <= MAX_LEADING_WHITESPACE_BYTES:
                    return NEED_DATA
                first = self._inbox.data[0]
            self.mode = Mode.JSON if first == 0x7B else Mode.CBOR
        try:
            if self.mode is Mode.JSON:
                return self._json.next_message()
            return self._cbor.next_message()
        except Refusal as error:
            if error.fatal:
                self._failed = True
            raise

    def encode(self, message: Any) -> bytes:
        mode = Mode.CBOR if self.mode is Mode.UNDECIDED else self.mode
        if self.received == "response":  # a client's request
            return encode_request(message, mode)
        return encode(message, mode)
