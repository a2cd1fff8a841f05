# Theory of operation
#
# The wire is a CBOR sequence (RFC 8742) each way: items back to back, no length
# prefix. cbor2 decodes one item but ignores trailing bytes and will happily
# allocate whatever a header claims, so this module finds item boundaries itself
# with a small resumable walker over the CBOR headers (ItemScanner). The walker
# enforces the size cap (a declared string length over the cap is refused before
# a byte of it is buffered) and the nesting cap, and rejects the few encodings the
# store does not accept (tags other than bignums, simple values other than
# false/true/null), so cbor2 only ever sees one complete, bounded item.
#
# When the first byte a peer sends is "{", the connection speaks newline-delimited
# JSON instead, with byte strings spelled {"$bytes": "<base64>"}.
#
# Fast path: an item that arrives within FAST_PATH_MAX_BYTES is framed by
# cbor2's C decoder itself (configured with the same rules: depth, no duplicate
# keys, tags refused but bignums); it never allocates what a header merely
# claims. Larger items are walked by ItemScanner as they arrive, then decoded
# the same way, so both paths accept the same language. Maps come out in
# canonical key order, and the decoder leaves a Hint (last_hint) that spares the
# daemon most of the canonical re-encode of every snapshot: an item with none of
# the bytes 0xF9..0xFB (which no UTF-8 text contains) has no floats, so plain
# encoding of it is canonical; otherwise, unless a map mixed key types, cbor2's
# canonical mode is exact. One translate() pass classifies the bytes.
#
# No I/O happens here (the h11 pattern): Connection.receive_data() takes bytes,
# next_message() hands back decoded messages, encode() turns a message into
# bytes. Feeding one byte at a time gives the same messages as feeding all at
# once, which the tests check.
from __future__ import annotations

import contextlib
import enum
import io
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import cbor2

from . import jsonform
from .canonical import Hint, OrderingHook
from .codes import ErrorCode
from .jsonform import from_json_value

PROTOCOL_VERSION = 1
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
MAX_NESTING_DEPTH = 64
BIGNUM_TAGS = (2, 3)
FAST_PATH_MAX_BYTES = 1024 * 1024
# An incomplete item is walked by ItemScanner (to refuse a header that claims too
# much) only once it has stayed incomplete this many reads or grown this large:
# a normal request that arrives in two or three reads is framed by C alone.
PARTIAL_SCAN_AFTER_READS = 4
PARTIAL_SCAN_AFTER_BYTES = 256 * 1024
# Byte classes for one translate() pass over an item: 2 = an initial byte of a
# half/single/double float (never in UTF-8 text), 1 = one that may start a simple
# value other than false/true/null (0xE0-0xF3 also lead multi-byte UTF-8, so
# their presence only means "look closer").
_FLOAT_CLASS, _SIMPLE_CLASS = b"\x02", b"\x01"
_BYTE_CLASSES = bytes(
    2 if 0xF9 <= b <= 0xFB else 1 if 0xE0 <= b <= 0xF3 or b in (0xF7, 0xF8) else 0
    for b in range(256)
)


class ProtocolError(Exception):
    """A peer's mistake, reported on the wire as `code`; `fatal` closes the connection."""

    def __init__(self, code: ErrorCode, message: str, *, fatal: bool) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal


class _RefuseTags(Mapping[int, Any]):
    """cbor2 semantic_decoders that refuse every built-in tag but the bignums."""

    def __getitem__(self, tag: int) -> Any:
        if tag in BIGNUM_TAGS:
            raise KeyError(tag)
        return _refuse_tag

    def __contains__(self, tag: object) -> bool:
        return tag not in BIGNUM_TAGS

    def __iter__(self) -> Iterator[int]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _refuse_tag(*_args: Any) -> Any:
    raise ValueError("CBOR tags other than bignums are not accepted")


_REFUSE_TAGS = _RefuseTags()


def _decoder(fp: io.BytesIO, max_depth: int, hook: OrderingHook | None) -> Any:
    return cbor2.CBORDecoder(
        fp,
        semantic_decoders=_REFUSE_TAGS,
        tag_hook=_refuse_tag,
        object_hook=hook,
        max_depth=max_depth,
        allow_duplicate_keys=False,
    )


def _failure_offset(item: bytes, max_depth: int) -> int:
    """Where decoding fails, exactly: decoded again without read-ahead (errors only)."""
    fp = io.BytesIO(item)
    decoder = cbor2.CBORDecoder(
        fp,
        semantic_decoders=_REFUSE_TAGS,
        tag_hook=_refuse_tag,
        max_depth=max_depth,
        allow_duplicate_keys=False,
        read_size=1,
    )
    with contextlib.suppress(*_DECODE_ERRORS):
        decoder.decode()
    return fp.tell()


_PLAIN_LEAVES = frozenset({str, int, bool, bytes, type(None)})


def _refuse_simple_values(value: Any) -> bool:
    """Raise on a simple value other than false/true/null; return whether a float was seen.
    Exact types first: the common leaves and containers cost one set or identity test."""
    floats = False
    stack = [value]
    pop, push = stack.pop, stack.extend
    leaves = _PLAIN_LEAVES
    while stack:
        item = pop()
        kind = type(item)
        if kind in leaves:
            continue
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    stack.append(key)
            push(item.values())
        elif kind is list:
            push(item)
        elif kind is float:
            floats = True
        elif item is cbor2.undefined or isinstance(item, cbor2.CBORSimpleValue):
            raise ProtocolError(
                ErrorCode.BAD_REQUEST, "simple value other than false/true/null", fatal=True
            )
        elif isinstance(item, Mapping):  # frozendict: maps used as keys
            push(item.keys())
            push(item.values())
        elif isinstance(item, (list, tuple)):  # tuples: arrays used as keys
            push(item)
        elif isinstance(item, float):
            floats = True
    return floats


_DECODE_ERRORS = (cbor2.CBORDecodeError, ValueError, TypeError, OverflowError, RecursionError)


class Mode(enum.Enum):
    UNDECIDED = "undecided"
    CBOR = "cbor"
    JSON = "json"


class MoreWork:
    """Bytes are buffered but the scan of a large item stopped at its budget: yield to
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


class _Frame:
    __slots__ = ("kind", "remaining")

    # kind: "c" counted container (array, map, tag), "i" indefinite container,
    # 2 or 3: indefinite byte/text string whose chunks must have that major type.
    def __init__(self, kind: str | int, remaining: int) -> None:
        self.kind = kind
        self.remaining = remaining


class ItemScanner:
    """Finds where one CBOR item ends, resumably, without decoding it."""

    def __init__(self, max_item_bytes: int, max_depth: int = MAX_NESTING_DEPTH) -> None:
        self.max_item_bytes = max_item_bytes
        self.max_depth = max_depth
        self.reset(0)

    def reset(self, start: int) -> None:
        self.start = start
        self.pos = start
        self.stack: list[_Frame] = []
        self.paused = False

    def _too_large(self) -> ProtocolError:
        return ProtocolError(
            ErrorCode.TOO_LARGE,
            f"request exceeds max_request_bytes={self.max_item_bytes}",
            fatal=True,
        )

    def _bad(self, message: str) -> ProtocolError:
        return ProtocolError(
            ErrorCode.BAD_REQUEST, f"{message} at byte {self.pos - self.start}", fatal=True
        )

    def scan(self, buf: bytes | bytearray, budget_bytes: int | None = None) -> int | None:
        """Return the end offset of the item that starts at self.start, or None. With a
        budget, stop after walking that many more bytes (self.paused: call again)."""
        end = len(buf)
        stop = end if budget_bytes is None else min(end, self.pos + budget_bytes)
        self.paused = False
        limit = self.start + self.max_item_bytes
        while True:
            pos = self.pos
            if pos >= limit:
                raise self._too_large()
            if pos >= stop:
                self.paused = stop < end
                return None
            initial = buf[pos]
            major = initial >> 5
            info = initial & 0x1F
            if info < 24:
                argument = info
                header = 1
            elif info < 28:
                width = 1 << (info - 24)
                if pos + 1 + width > end:
                    return None
                argument = int.from_bytes(buf[pos + 1 : pos + 1 + width], "big")
                header = 1 + width
            elif info == 31:
                argument = -1
                header = 1
            else:
                raise self._bad("reserved additional information")

            top = self.stack[-1] if self.stack else None
            chunk_major = top.kind if top is not None and isinstance(top.kind, int) else None
            if (
                chunk_major is not None
                and initial != 0xFF
                and (major != chunk_major or argument < 0)
            ):
                raise self._bad("bad chunk in indefinite-length string")

            if initial == 0xFF:
                if top is None or top.kind == "c":
                    raise self._bad("unexpected break")
                self.stack.pop()
                self.pos = pos + 1
                if self._item_done():
                    return self.pos
                continue

            if major in (0, 1):
                if argument < 0:
                    raise self._bad("indefinite integer")
                self.pos = pos + header
            elif major in (2, 3):
                if argument < 0:
                    self._push(major, -1)
                    self.pos = pos + header
                    continue
                if pos + header + argument > limit:
                    raise self._too_large()
                if pos + header + argument > end:
                    return None
                self.pos = pos + header + argument
            elif major in (4, 5):
                self.pos = pos + header
                if argument < 0:
                    self._push("i", -1)
                    continue
                count = argument * (2 if major == 5 else 1)
                if count > self.max_item_bytes:
                    raise self._too_large()
                if count:
                    self._push("c", count)
                    continue
            elif major == 6:
                if argument not in BIGNUM_TAGS:
                    raise self._bad(f"CBOR tag {argument} is not accepted")
                self.pos = pos + header
                self._push("c", 1)
                continue
            else:  # major 7
                if info in (20, 21, 22) or info in (25, 26, 27):
                    self.pos = pos + header
                else:
                    raise self._bad("simple value other than false/true/null")
            if self._item_done():
                return self.pos

    def _push(self, kind: str | int, remaining: int) -> None:
        if len(self.stack) >= self.max_depth:
            raise ProtocolError(
                ErrorCode.BAD_REQUEST, f"nesting deeper than {self.max_depth} levels", fatal=True
            )
        self.stack.append(_Frame(kind, remaining))

    def _item_done(self) -> bool:
        """One item finished: count it against its container; True when the top item ends."""
        while self.stack:
            top = self.stack[-1]
            if top.remaining < 0:
                return False
            top.remaining -= 1
            if top.remaining:
                return False
            self.stack.pop()
        return True


def _json_text_is_unicode(value: Any) -> bool:
    """False when a \\uD800-style escape left a lone surrogate that UTF-8 cannot hold."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_depth_ok(value: Any, max_depth: int) -> bool:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= max_depth:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


@dataclass(frozen=True)
class RawCBOR:
    """Bytes that already are one encoded CBOR item, spliced into a message as they are."""

    data: bytes


def _encode_raw(encoder: Any, value: Any) -> None:
    if isinstance(value, RawCBOR):
        encoder.write(value.data)
        return
    raise cbor2.CBOREncodeTypeError(f"cannot encode {type(value).__name__}")


def encode(message: Any, mode: Mode) -> bytes:
    if mode is Mode.JSON:
        return jsonform.dumps(message).encode() + b"\n"
    return bytes(cbor2.dumps(message, default=_encode_raw))


@dataclass(frozen=True)
class Deferred:
    """A whole item (or JSON line) too large to decode here: bytes, undecoded, for a caller
    that decodes it elsewhere (the daemon: in a worker process, off its event loop)."""

    data: bytes
    mode: Mode


@dataclass
class Connection:
    """One side of a connection: bytes in, decoded messages out."""

    max_message_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_depth: int = MAX_NESTING_DEPTH
    mode: Mode = Mode.UNDECIDED
    _buffer: bytearray = field(default_factory=bytearray)
    _scanner: ItemScanner | None = None
    _fast_fp: io.BytesIO | None = None
    _incomplete_reads: int = 0
    _json_scanned: int = 0
    order_maps: bool = False  # the daemon's side: hand out maps in canonical order, set last_hint
    last_hint: Hint = Hint.NONE
    _hook: OrderingHook | None = None
    _eof: bool = False
    _broken: bool = False
    # items larger than this come out as Deferred; decoding one here costs at most this
    # many bytes' worth of work
    defer_above_bytes: int | None = None
    # walk at most this many bytes of a large item per call (then MORE_WORK)
    scan_budget_bytes: int | None = None

    def receive_data(self, data: bytes) -> None:
        self._buffer += data
        self._fast_fp = None

    def receive_eof(self) -> None:
        self._eof = True

    @property
    def at_eof(self) -> bool:
        return self._eof and not self._buffer

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def next_message(self) -> Any:
        """A decoded message, NEED_DATA, END_OF_STREAM (EOF with nothing buffered), or raise
        ProtocolError."""
        if self._broken:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "connection already failed", fatal=True)
        if self.mode is Mode.UNDECIDED:
            if not self._buffer:
                return END_OF_STREAM if self._eof else NEED_DATA
            self.mode = Mode.JSON if self._buffer[0] == 0x7B else Mode.CBOR
        try:
            if self.mode is Mode.JSON:
                return self._next_json()
            return self._next_cbor()
        except ProtocolError as error:
            if error.fatal:
                self._broken = True
            raise

    def _next_cbor(self) -> Any:
        self.last_hint = Hint.NONE
        self._hook = OrderingHook() if self.order_maps else None
        if not self._buffer:
            return END_OF_STREAM if self._eof else NEED_DATA
        defer = self.defer_above_bytes
        if defer is not None and self._scanner is None and len(self._buffer) > defer:
            small = self._first_item_within(defer)
            if small is not None:
                return small
            # the first item is larger than that (or broken): the scanner finds its end
            self._scanner = ItemScanner(self.max_message_bytes, self.max_depth + 1)
        if len(self._buffer) <= FAST_PATH_MAX_BYTES and (
            defer is None or len(self._buffer) <= defer
        ):
            if self._fast_fp is None:
                self._fast_fp = io.BytesIO(bytes(self._buffer))
            fp = self._fast_fp
            start = fp.tell()
            try:
                value = _decoder(fp, self.max_depth, self._hook).decode()
            except cbor2.CBORDecodeEOF:
                fp.seek(start)
                if self._eof:  # the limits first, as for an item cut into pieces
                    self._scanner = self._scanner or ItemScanner(
                        self.max_message_bytes, self.max_depth + 1
                    )
                    self._scanner.scan(self._buffer)
                    raise ProtocolError(
                        ErrorCode.BAD_REQUEST, "stream ended inside a CBOR item", fatal=True
                    ) from None
                # Incomplete. If it stays so, walk what has arrived (resumably, each byte
                # once) to refuse a header that claims more than the limit before its
                # bytes are buffered.
                self._incomplete_reads += 1
                if (
                    self._scanner is None
                    and self._incomplete_reads < PARTIAL_SCAN_AFTER_READS
                    and len(self._buffer) < PARTIAL_SCAN_AFTER_BYTES
                ):
                    return NEED_DATA
                if self._scanner is None:
                    self._scanner = ItemScanner(self.max_message_bytes, self.max_depth + 1)
                if self._scanner.scan(self._buffer) is None:
                    return NEED_DATA
                raise ProtocolError(
                    ErrorCode.BAD_REQUEST, "undecodable CBOR item", fatal=True
                ) from None
            except _DECODE_ERRORS as error:
                # The first problem in byte order wins, however the bytes arrived: the
                # limits get to look at exactly what the decoder read before it failed.
                failed_at = _failure_offset(bytes(self._buffer), self.max_depth)
                self._scanner = self._scanner or ItemScanner(
                    self.max_message_bytes, self.max_depth + 1
                )
                self._scanner.scan(bytes(self._buffer[:failed_at]))
                raise ProtocolError(
                    ErrorCode.BAD_REQUEST, f"undecodable CBOR item: {error}", fatal=True
                ) from None
            self._scanner = None
            self._incomplete_reads = 0
            end = fp.tell() - start
            if end > self.max_message_bytes:
                raise ProtocolError(
                    ErrorCode.TOO_LARGE,
                    f"request exceeds max_request_bytes={self.max_message_bytes}",
                    fatal=True,
                )
            return self._accept(value, end)
        if self._scanner is None:
            self._scanner = ItemScanner(self.max_message_bytes, self.max_depth + 1)
        end_or_none = self._scanner.scan(self._buffer, self.scan_budget_bytes)
        if end_or_none is None:
            if self._scanner.paused:
                return MORE_WORK
            if self._eof:
                raise ProtocolError(
                    ErrorCode.BAD_REQUEST, "stream ended inside a CBOR item", fatal=True
                )
            return NEED_DATA
        self._scanner = None
        self._fast_fp = None
        if defer is not None and end_or_none > defer:
            data = bytes(self._buffer[:end_or_none])
            del self._buffer[:end_or_none]
            return Deferred(data, Mode.CBOR)
        try:
            fp = io.BytesIO(self._buffer[:end_or_none])
            value = _decoder(fp, self.max_depth, self._hook).decode()
        except _DECODE_ERRORS as error:
            raise ProtocolError(
                ErrorCode.BAD_REQUEST, f"undecodable CBOR item: {error}", fatal=True
            ) from None
        return self._accept(value, end_or_none)

    def _first_item_within(self, window: int) -> Any:
        """The first buffered item if it ends within `window` bytes, else None."""
        fp = io.BytesIO(bytes(self._buffer[:window]))
        try:
            value = _decoder(fp, self.max_depth, self._hook).decode()
        except (cbor2.CBORDecodeEOF, *_DECODE_ERRORS):
            self._hook = OrderingHook() if self.order_maps else None  # forget the attempt
            return None
        self._fast_fp = None
        return self._accept(value, fp.tell())

    def _accept(self, value: Any, end: int) -> Any:
        classes = bytes(self._buffer[:end]).translate(_BYTE_CLASSES)
        del self._buffer[:end]
        special = _FLOAT_CLASS in classes
        if special or _SIMPLE_CLASS in classes:
            # those bytes also occur inside integers and text: the walk knows for sure
            special = _refuse_simple_values(value)
        if self._hook is None or self._hook.needs_bytewise:
            self.last_hint = Hint.NONE
        elif not special:
            self.last_hint = Hint.PLAIN
        else:
            self.last_hint = Hint.UNIFORM_KEYS
        return value

    def _next_json(self) -> Any:
        while True:
            newline = self._buffer.find(b"\n", self._json_scanned)
            if newline < 0:
                if len(self._buffer) > self.max_message_bytes:
                    raise ProtocolError(
                        ErrorCode.TOO_LARGE,
                        f"request exceeds max_request_bytes={self.max_message_bytes}",
                        fatal=True,
                    )
                self._json_scanned = len(self._buffer)
                if not self._eof:
                    return NEED_DATA
                if not self._buffer.strip():
                    self._buffer.clear()
                    return END_OF_STREAM
                newline = len(self._buffer)
            line = bytes(self._buffer[:newline])
            del self._buffer[: newline + 1]
            self._json_scanned = 0
            if len(line) > self.max_message_bytes:
                raise ProtocolError(
                    ErrorCode.TOO_LARGE,
                    f"request exceeds max_request_bytes={self.max_message_bytes}",
                    fatal=True,
                )
            if not line.strip():
                continue
            if self.defer_above_bytes is not None and len(line) > self.defer_above_bytes:
                return Deferred(line, Mode.JSON)
            try:
                value = jsonform.loads(line)
            except (ValueError, RecursionError) as error:
                raise ProtocolError(
                    ErrorCode.BAD_REQUEST, f"invalid JSON line: {error}", fatal=False
                ) from None
            if not _json_depth_ok(value, self.max_depth):
                raise ProtocolError(
                    ErrorCode.BAD_REQUEST,
                    f"nesting deeper than {self.max_depth} levels",
                    fatal=False,
                )
            if b"\\u" in line and not _json_text_is_unicode(value):
                raise ProtocolError(
                    ErrorCode.BAD_REQUEST,
                    "text with a lone surrogate escape is not Unicode",
                    fatal=False,
                )
            try:
                return from_json_value(value)
            except ValueError as error:
                raise ProtocolError(
                    ErrorCode.BAD_REQUEST, f"bad value: {error}", fatal=False
                ) from None

    def encode(self, message: Any) -> bytes:
        return encode(message, Mode.CBOR if self.mode is Mode.UNDECIDED else self.mode)


SCALAR_TYPES = (str, int, float, bool, bytes, type(None))


@dataclass(frozen=True)
class Request:
    op: str
    args: dict[str, Any]
    rid: Any = None
    has_rid: bool = False
    canonical_hint: Hint = Hint.NONE  # see Connection.last_hint


def parse_request(message: Any, *, canonical_hint: Hint = Hint.NONE) -> Request:
    """Classify a decoded item as a request; a well-framed but wrong item is a soft error."""
    if not isinstance(message, dict):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "a request must be a map", fatal=False)
    if not all(isinstance(key, str) for key in message):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "request keys must be text", fatal=False)
    op = message.get("op")
    if not isinstance(op, str) or not op:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "missing or non-text 'op'", fatal=False)
    has_rid = "rid" in message
    rid = message.get("rid")
    if has_rid and not isinstance(rid, SCALAR_TYPES):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "'rid' must be a scalar", fatal=False)
    return Request(op=op, args=message, rid=rid, has_rid=has_rid, canonical_hint=canonical_hint)


def ok_response(request: Request | None, **fields: Any) -> dict[str, Any]:
    response: dict[str, Any] = {"ok": True}
    if request is not None and request.has_rid:
        response["rid"] = request.rid
    response.update(fields)
    return response


def error_response(
    request: Request | None, code: ErrorCode, message: str, **details: Any
) -> dict[str, Any]:
    response: dict[str, Any] = {"ok": False}
    if request is not None and request.has_rid:
        response["rid"] = request.rid
    response["error"] = {"code": code, "message": message, **details}
    return response
