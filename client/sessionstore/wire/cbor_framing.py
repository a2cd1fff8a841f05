# CBOR framing: where one item of a CBOR sequence (RFC 8742) ends, and decoding it.
#
# cbor2 decodes one item but ignores trailing bytes and will happily allocate
# whatever a header claims, so item boundaries are found here with a small
# resumable walker over the CBOR headers (ItemWalker). The walker enforces the
# size cap (a declared string length over the cap is refused before a byte of it
# is buffered) and the nesting cap, and rejects the few encodings the store does
# not accept (tags: in requests all of them, in responses all but bignums; simple
# values other than false/true/null),
# so cbor2 only ever sees one complete, bounded item.
#
# Fast path: an item that arrives within FAST_PATH_MAX_BYTES is framed by
# cbor2's C decoder itself (configured with the same rules: depth, no duplicate
# keys, the same tags refused); it never allocates what a header merely
# claims. Larger items are walked by ItemWalker as they arrive, then decoded
# the same way, so both paths accept the same language. A reader that defers
# large items hands back those above its threshold undecoded (Deferred), and
# walks them in slices of its budget (MORE_WORK between slices).
#
# Maps come out in canonical key order, and the reader leaves a Hint
# (last_hint) that spares the daemon most of the canonical re-encode of every
# snapshot: an item with none of the bytes 0xF9..0xFB (which no UTF-8 text
# contains) has no floats, so plain encoding of it is canonical; otherwise,
# unless a map needs the bytewise sort, cbor2's canonical mode is exact. One
# translate() pass classifies the bytes.
from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Mapping
from typing import Any

import cbor2

from .byte_path import USE_DECODER, ByteReader
from .canonical import Hint, OrderingHook
from .codes import ErrorCode
from .shared import (
    END_OF_STREAM,
    MAX_NESTING_DEPTH,
    MORE_WORK,
    NEED_DATA,
    Deferred,
    Inbox,
    Mode,
    Received,
    Refusal,
    too_large,
)

BIGNUM_TAGS = (2, 3)
FAST_PATH_MAX_BYTES = 1024 * 1024
# An incomplete item is walked by ItemWalker (to refuse a header that claims too
# much) only once it has stayed incomplete this many reads or grown this large:
# a normal request that arrives in two or three reads is framed by C alone.
PARTIAL_WALK_AFTER_READS = 4
PARTIAL_WALK_AFTER_BYTES = 256 * 1024


# Byte classes for one translate() pass over an item: 2 = an initial byte of a
# half/single/double float (never in UTF-8 text), 1 = one that may start a simple
# value other than false/true/null (0xE0-0xF3 also lead multi-byte UTF-8, so
# their presence only means "look closer").
_FLOAT_CLASS, _SIMPLE_CLASS = b"\x02", b"\x01"
_BYTE_CLASSES = bytes(
    2 if 0xF9 <= b <= 0xFB else 1 if 0xE0 <= b <= 0xF3 or b in (0xF7, 0xF8) else 0
    for b in range(256)
)


class _RefuseTags(Mapping[int, Any]):
    """cbor2 semantic_decoders that refuse every built-in tag but those accepted."""

    def __init__(self, accepted: tuple[int, ...]) -> None:
        self.accepted = accepted

    def __getitem__(self, tag: int) -> Any:
        if tag in self.accepted:
            raise KeyError(tag)
        return _refuse_tag

    def __contains__(self, tag: object) -> bool:
        return tag not in self.accepted

    def __iter__(self) -> Iterator[int]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _refuse_tag(*_args: Any) -> Any:
    raise ValueError("CBOR tags are not accepted")


# Requests carry no tags, bignums included: an integer beyond 64 bits has no JSON
# form that reads back, so it is refused in both dialects. Responses may hold
# bignums, which documents stored before that rule can contain.
ACCEPTED_TAGS: dict[Received, tuple[int, ...]] = {"request": (), "response": BIGNUM_TAGS}
_REFUSE_TAGS = {received: _RefuseTags(tags) for received, tags in ACCEPTED_TAGS.items()}


def _decoder(fp: io.BytesIO, max_depth: int, hook: OrderingHook | None, received: Received) -> Any:
    return cbor2.CBORDecoder(
        fp,
        semantic_decoders=_REFUSE_TAGS[received],
        tag_hook=_refuse_tag,
        object_hook=hook.hook if hook is not None else None,
        max_depth=max_depth,
        allow_duplicate_keys=False,
    )


def _failure_offset(item: bytes, max_depth: int, received: Received) -> int:
    """Where decoding fails, exactly: decoded again without read-ahead (errors only)."""
    fp = io.BytesIO(item)
    decoder = cbor2.CBORDecoder(
        fp,
        semantic_decoders=_REFUSE_TAGS[received],
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
            raise Refusal(
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


class _Frame:
    __slots__ = ("kind", "remaining")

    # kind: "c" counted container (array, map, tag), "i" indefinite container,
    # 2 or 3: indefinite byte/text string whose chunks must have that major type.
    def __init__(self, kind: str | int, remaining: int) -> None:
        self.kind = kind
        self.remaining = remaining


class ItemWalker:
    """Finds where one CBOR item ends, resumably, without decoding it."""

    def __init__(
        self,
        max_item_bytes: int,
        max_depth: int = MAX_NESTING_DEPTH,
        received: Received = "request",
        max_items: int | None = None,
    ) -> None:
        self.max_item_bytes = max_item_bytes
        self.max_depth = max_depth
        self.received = received
        self.max_items = max_items  # data items in one message (they cost memory decoded)
        self.reset(0)

    def reset(self, start: int) -> None:
        self.start = start
        self.pos = start
        self.stack: list[_Frame] = []
        self.paused = False
        self.items = 0

    def _too_large(self) -> Refusal:
        return too_large(self.received, self.max_item_bytes)

    def _bad(self, message: str) -> Refusal:
        return Refusal(
            ErrorCode.BAD_REQUEST, f"{message} at byte {self.pos - self.start}", fatal=True
        )

    def walk(self, buf: bytes | bytearray, budget_bytes: int | None = None) -> int | None:
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
            self.items += 1
            if self.max_items is not None and self.items > self.max_items:
                raise Refusal(
                    ErrorCode.TOO_LARGE,
                    f"{self.received} holds more than {self.max_items} CBOR data items",
                    fatal=True,
                )
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
                if argument not in ACCEPTED_TAGS[self.received]:
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
            raise Refusal(
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


class CborReader:
    """Messages out of an Inbox of CBOR bytes."""

    def __init__(
        self,
        inbox: Inbox,
        received: Received,
        max_message_bytes: int,
        max_depth: int,
        *,
        order_maps: bool,
        defer_above_bytes: int | None,
        walk_budget_bytes: int | None,
        max_items: int | None,
        byte_reader: ByteReader | None = None,
    ) -> None:
        self.inbox = inbox
        self.byte_reader = byte_reader
        self._decoder_owns_item = False  # the byte reader left the current item to us
        self.max_items = max_items
        self.received = received
        self.max_message_bytes = max_message_bytes
        self.max_depth = max_depth
        self.order_maps = order_maps
        self.defer_above_bytes = defer_above_bytes
        self.walk_budget_bytes = walk_budget_bytes
        self.last_hint = Hint.NONE
        self._walker: ItemWalker | None = None
        self._fast_fp: io.BytesIO | None = None
        self._fast_bytes = b""  # what _fast_fp reads
        self._incomplete_reads = 0
        # one per reader, reset per message (measured: 1.5 us a message to make one)
        self._hook: OrderingHook | None = OrderingHook() if order_maps else None

    def data_arrived(self) -> None:
        self._fast_fp = None  # the fast path's view of the buffer is stale

    def _walker_in_use(self) -> ItemWalker:
        if self._walker is None:
            self._walker = ItemWalker(
                self.max_message_bytes, self.max_depth + 1, self.received, self.max_items
            )
        return self._walker

    def next_message(self) -> Any:
        self.last_hint = Hint.NONE
        if not self.inbox.data:
            return END_OF_STREAM if self.inbox.eof else NEED_DATA
        if self.byte_reader is not None and not self._decoder_owns_item:
            message = self.byte_reader.next_message(self.inbox)
            if message is not USE_DECODER:
                self._fast_fp = None
                return message
            self._decoder_owns_item = True
        if self._hook is not None:
            self._hook.needs_bytewise = False
        defer = self.defer_above_bytes
        if defer is not None and self._walker is None and len(self.inbox.data) > defer:
            small = self._first_item_within(defer)
            if small is not None:
                return small
            self._walker_in_use()  # the first item is larger (or broken): walk it
        if len(self.inbox.data) <= FAST_PATH_MAX_BYTES and (
            defer is None or len(self.inbox.data) <= defer
        ):
            if self._fast_fp is None:
                self._fast_bytes = bytes(self.inbox.data)
                self._fast_fp = io.BytesIO(self._fast_bytes)
            fp = self._fast_fp
            start = fp.tell()
            try:
                # a decoder per message: cbor2's panics when reused after a failed decode
                value = _decoder(fp, self.max_depth, self._hook, self.received).decode()
            except cbor2.CBORDecodeEOF:
                fp.seek(start)
                if self.inbox.eof:  # the limits first, as for an item cut into pieces
                    self._walker_in_use().walk(self.inbox.data)
                    raise Refusal(
                        ErrorCode.BAD_REQUEST, "stream ended inside a CBOR item", fatal=True
                    ) from None
                # Incomplete. If it stays so, walk what has arrived (resumably, each byte
                # once) to refuse a header that claims more than the limit before its
                # bytes are buffered.
                self._incomplete_reads += 1
                if (
                    self._walker is None
                    and self._incomplete_reads < PARTIAL_WALK_AFTER_READS
                    and len(self.inbox.data) < PARTIAL_WALK_AFTER_BYTES
                ):
                    return NEED_DATA
                if self._walker_in_use().walk(self.inbox.data) is None:
                    return NEED_DATA
                raise Refusal(ErrorCode.BAD_REQUEST, "undecodable CBOR item", fatal=True) from None
            except _DECODE_ERRORS as error:
                # The first problem in byte order wins, however the bytes arrived: the
                # limits get to look at exactly what the decoder read before it failed.
                failed_at = _failure_offset(bytes(self.inbox.data), self.max_depth, self.received)
                self._walker_in_use().walk(bytes(self.inbox.data[:failed_at]))
                raise Refusal(
                    ErrorCode.BAD_REQUEST, f"undecodable CBOR item: {error}", fatal=True
                ) from None
            self._walker = None
            self._incomplete_reads = 0
            end = fp.tell() - start
            if end > self.max_message_bytes:
                raise too_large(self.received, self.max_message_bytes)
            if start == 0 and end == len(self._fast_bytes):  # the whole buffer: no copy
                self.inbox.data.clear()
                return self._accept(value, end, self._fast_bytes)
            return self._accept(value, end)
        walker = self._walker_in_use()
        end_or_none = walker.walk(self.inbox.data, self.walk_budget_bytes)
        if end_or_none is None:
            if walker.paused:
                return MORE_WORK
            if self.inbox.eof:
                raise Refusal(ErrorCode.BAD_REQUEST, "stream ended inside a CBOR item", fatal=True)
            return NEED_DATA
        self._walker = None
        self._fast_fp = None
        if defer is not None and end_or_none > defer:
            data = bytes(self.inbox.data[:end_or_none])
            del self.inbox.data[:end_or_none]
            self._decoder_owns_item = False
            return Deferred(data, Mode.CBOR)
        try:
            fp = io.BytesIO(self.inbox.data[:end_or_none])
            value = _decoder(fp, self.max_depth, self._hook, self.received).decode()
        except _DECODE_ERRORS as error:
            raise Refusal(
                ErrorCode.BAD_REQUEST, f"undecodable CBOR item: {error}", fatal=True
            ) from None
        return self._accept(value, end_or_none)

    def _first_item_within(self, window: int) -> Any:
        """The first buffered item if it ends within `window` bytes, else None."""
        fp = io.BytesIO(bytes(self.inbox.data[:window]))
        try:
            value = _decoder(fp, self.max_depth, self._hook, self.received).decode()
        except (cbor2.CBORDecodeEOF, *_DECODE_ERRORS):
            if self._hook is not None:
                self._hook.needs_bytewise = False  # forget the attempt
            return None
        self._fast_fp = None
        return self._accept(value, fp.tell())

    def _accept(self, value: Any, end: int, item: bytes | None = None) -> Any:
        """item: the message's bytes when the caller has them; else they lead the inbox."""
        self._decoder_owns_item = False
        if item is None:
            item = bytes(self.inbox.data[:end])
            del self.inbox.data[:end]
        classes = item.translate(_BYTE_CLASSES)
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
