# The pure-Python twin of the compiled CBOR helper (cbor_core.c holds the theory
# of operation): the same functions, the same verdicts, reasons and
# offsets, byte for byte. tests/test_cbor_bytes.py holds the two equal. It runs
# where no C compiler built the helper, and it is the reference that reads
# more easily than the C.
from __future__ import annotations

import math
import struct

CANONICAL, VALID, OTHER, INCOMPLETE, ERROR = range(5)
(
    R_NONE,
    R_RESERVED,
    R_INDEFINITE,
    R_TAG,
    R_KEY,
    R_SIMPLE,
    R_UTF8,
    R_DEPTH,
    R_ITEMS,
    R_TOO_LARGE,
    R_BREAK,
    R_DUPLICATE,
) = range(12)

STACK_FRAMES = 512
MAX_DEPTH_ACCEPTED = 512
_SIZE_LIMIT = 2**62  # the C side's SIZE_MAX / 4: no real limit reaches it
_SHORTEST_ABOVE = {24: 23, 25: 0xFF, 26: 0xFFFF, 27: 0xFFFFFFFF}
_FLT_MAX = struct.unpack(">f", b"\x7f\x7f\xff\xff")[0]

Verdict = tuple[int, int, int]  # (status, reason, position)


def _head_length(info: int) -> int:
    return 1 if info < 24 else 1 + (1 << (info - 24))


def _argument(data: bytes | bytearray, pos: int, info: int) -> int:
    if info < 24:
        return info
    return int.from_bytes(data[pos + 1 : pos + 1 + (1 << (info - 24))], "big")


def _valid_utf8(text: bytes) -> bool:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _fits_half(value: float) -> bool:
    try:
        return bool(struct.unpack(">e", struct.pack(">e", value))[0] == value)
    except OverflowError:
        return False


def _fits_single(value: float) -> bool:
    return abs(value) <= _FLT_MAX and bool(
        struct.unpack(">f", struct.pack(">f", value))[0] == value
    )


def _float_of(info: int, bits: int) -> float:
    form = {25: ">e", 26: ">f", 27: ">d"}[info]
    packed = bits.to_bytes(struct.calcsize(form), "big")
    return float(struct.unpack(form, packed)[0])


def _float_is_shortest(info: int, bits: int) -> bool:
    if info == 25:
        return not ((bits & 0x7C00) == 0x7C00 and bits & 0x3FF) or bits == 0x7E00
    value = _float_of(info, bits)
    if math.isnan(value) or math.isinf(value):
        return False
    return not _fits_half(value) if info == 26 else not _fits_single(value)


class _Frame:
    __slots__ = ("has_key", "is_map", "key", "remaining")

    def __init__(self, remaining: int, is_map: bool) -> None:
        self.remaining = remaining
        self.is_map = is_map
        self.has_key = False
        self.key = b""


class Walker:
    """A walk over one item that resumes as more bytes arrive: each call gets the bytes
    of every earlier call, perhaps with more after them."""

    def __init__(self, start: int, limit: int, max_depth: int, max_items: int) -> None:
        if start < 0:
            raise ValueError("offsets outside the data")
        if not 0 <= max_depth <= MAX_DEPTH_ACCEPTED:
            raise ValueError(f"max_depth must be 0..{MAX_DEPTH_ACCEPTED}")
        if limit < 0 or max_items < 0:
            raise ValueError("limit and max_items must not be negative")
        self._start = start
        self._hard_end = start + min(limit, _SIZE_LIMIT)
        self._max_depth = min(max_depth, STACK_FRAMES)
        self._max_items = max_items
        self._stack: list[_Frame] = []
        self._items = 0
        self._canonical = True
        self._pos = start
        self._final: Verdict | None = None

    def _finish(self, status: int, reason: int, position: int) -> Verdict:
        self._final = (status, reason, position)
        return self._final

    def walk(self, data: bytes | bytearray) -> Verdict:
        if self._start > len(data):
            raise ValueError("offsets outside the data")
        if self._final is not None:
            return self._final
        length = len(data)
        hard_end = self._hard_end
        stack = self._stack
        while True:
            pos = self._pos
            if pos >= hard_end:
                return self._finish(ERROR, R_TOO_LARGE, pos)
            if pos >= length:
                return INCOMPLETE, R_NONE, length
            top = stack[-1] if stack else None
            is_key = top is not None and top.is_map and top.remaining % 2 == 0
            initial = data[pos]
            major, info = initial >> 5, initial & 0x1F
            head_size = _head_length(info) if info < 28 else 1
            if info < 28 and head_size > length - pos and head_size <= hard_end - pos:
                return INCOMPLETE, R_NONE, length
            self._items += 1
            if self._items > self._max_items:
                return self._finish(ERROR, R_ITEMS, pos)
            if 28 <= info <= 30:
                return self._finish(ERROR, R_RESERVED, pos)
            if info == 31:
                if major == 7:
                    return self._finish(ERROR, R_BREAK, pos)
                if 2 <= major <= 5:
                    return self._finish(OTHER, R_INDEFINITE, pos)
                return self._finish(ERROR, R_RESERVED, pos)
            if is_key and major != 3:
                return self._finish(OTHER, R_KEY, pos)
            if head_size > hard_end - pos:
                return self._finish(ERROR, R_TOO_LARGE, pos)
            argument = _argument(data, pos, info)
            if major != 7 and info >= 24 and argument <= _SHORTEST_ABOVE[info]:
                self._canonical = False  # set again, harmlessly, if the item is cut short
            item_start = pos
            if major in (0, 1):
                pos += head_size
            elif major in (2, 3):
                if argument > hard_end - pos - head_size:
                    return self._finish(ERROR, R_TOO_LARGE, pos)
                if argument > length - pos - head_size:
                    self._items -= 1  # counted again when its bytes are here
                    return INCOMPLETE, R_NONE, length
                if major == 3 and not _valid_utf8(
                    bytes(data[pos + head_size : pos + head_size + argument])
                ):
                    return self._finish(ERROR, R_UTF8, pos)
                pos += head_size + argument
                if is_key:
                    assert top is not None
                    key = bytes(data[item_start:pos])
                    if self._canonical and top.has_key:
                        if key == top.key:
                            return self._finish(OTHER, R_DUPLICATE, item_start)
                        if key < top.key:
                            self._canonical = False
                    top.has_key = True
                    top.key = key
            elif major in (4, 5):
                if argument > hard_end - pos:
                    return self._finish(ERROR, R_TOO_LARGE, pos)
                if argument and len(stack) >= self._max_depth:
                    return self._finish(ERROR, R_DEPTH, item_start)
                pos += head_size
                if argument:
                    stack.append(_Frame(argument * 2 if major == 5 else argument, major == 5))
                    self._pos = pos
                    continue
            elif major == 6:
                return self._finish(OTHER if argument in (2, 3) else ERROR, R_TAG, pos)
            else:
                if 25 <= info <= 27:
                    if not _float_is_shortest(info, argument):
                        self._canonical = False
                elif not 20 <= info <= 22:
                    return self._finish(ERROR, R_SIMPLE, pos)
                pos += head_size
            self._pos = pos
            while stack:
                stack[-1].remaining -= 1
                if stack[-1].remaining:
                    break
                stack.pop()
            if not stack:
                status = CANONICAL if self._canonical else VALID
                return self._finish(status, R_NONE, self._pos)


def walk(
    data: bytes | bytearray, start: int, limit: int, max_depth: int, max_items: int
) -> Verdict:
    if not 0 <= start <= len(data):
        raise ValueError("offsets outside the data")
    return Walker(start, limit, max_depth, max_items).walk(data)


def item_end(data: bytes | bytearray, start: int) -> int:
    """Where the item at start ends, for bytes already walked; 0 when malformed."""
    length = len(data)
    pending = 1
    pos = start
    while pending:
        if pos >= length:
            return 0
        major, info = data[pos] >> 5, data[pos] & 0x1F
        if info >= 28:
            return 0
        head_size = _head_length(info)
        if head_size > length - pos:
            return 0
        argument = _argument(data, pos, info)
        pos += head_size
        pending -= 1
        if major in (2, 3):
            if argument > length - pos:
                return 0
            pos += argument
        elif major in (4, 5):
            if argument > length - pos:
                return 0
            pending += argument * 2 if major == 5 else argument
        elif major == 6:
            pending += 1
        if pending > length - pos + 1:
            return 0
    return pos


def entries(data: bytes | bytearray, start: int, end: int = -1) -> tuple[int, ...]:
    """The offsets of a definite container's items, then where it ends. end: where the
    container is known to end, so that its last item need not be walked."""
    length = len(data)
    if not 0 <= start <= length or not -1 <= end <= length:
        raise ValueError("offsets outside the data")
    major = data[start] >> 5 if start < length else 0
    info = data[start] & 0x1F if start < length else 31
    if major not in (4, 5) or info > 27 or start + _head_length(info) > length:
        raise ValueError("no definite array or map at that offset")
    count = _argument(data, start, info)
    pos = start + _head_length(info)
    if major == 5:
        count = length + 1 if count > length else count * 2
    if count > length - pos:
        raise ValueError("container longer than the data")
    offsets = [pos]
    for number in range(count):
        if number + 1 == count and end >= 0:
            pos = end if end >= pos else 0
        else:
            pos = item_end(data, pos)
        if not pos:
            raise ValueError("malformed item inside the container")
        offsets.append(pos)
    return tuple(offsets)


# -- the snapshot rules' fast path ------------------------------------------------

MAX_ID_BYTES = 1024  # ops/snapshot.py's MAX_ID_BYTES
_NULL = 0xF6
_PLAIN_ARRAYS = frozenset({b"artifacts", b"trace_events", b"verification_reports"})


def _read_head(data: bytes | bytearray, pos: int, length: int) -> tuple[int, int, int] | None:
    """(major, argument, where its content starts) of a definite head at pos."""
    if pos >= length:
        return None
    info = data[pos] & 0x1F
    if info >= 28 or _head_length(info) > length - pos:
        return None
    return data[pos] >> 5, _argument(data, pos, info), pos + _head_length(info)


def _text_at(data: bytes | bytearray, at: int, length: int) -> tuple[int, int] | None:
    head = _read_head(data, at, length)
    if head is None or head[0] != 3 or head[1] > length - head[2]:
        return None
    return head[2], head[2] + head[1]


def _map_values(
    data: bytes | bytearray, at: int, end: int, names: tuple[bytes, ...]
) -> list[int] | None:
    """Where the map at data[at] (ending by end) holds each name's value (0: no such
    key), in one pass; None when the bytes are not such a map."""
    head = _read_head(data, at, end)
    if head is None or head[0] != 5 or head[1] > end - head[2]:
        return None
    found, pos = [0] * len(names), head[2]
    for _ in range(head[1]):
        key = _text_at(data, pos, end)
        if key is None:
            return None
        value_end = item_end(data[:end], key[1])
        if not value_end:
            return None
        for k, name in enumerate(names):
            if data[key[0] : key[1]] == name:
                found[k] = key[1]
        pos = value_end
    return found


def _map_value(data: bytes | bytearray, at: int, end: int, name: bytes) -> int | None:
    found = _map_values(data, at, end, (name,))
    return None if found is None else found[0]


def _array_items(data: bytes | bytearray, at: int, end: int) -> tuple[int, int] | None:
    """(count, first item's offset) of the array at data[at]."""
    head = _read_head(data, at, end)
    if head is None or head[0] != 4 or head[1] > end - head[2]:
        return None
    return head[1], head[2]


def _session_id_at(data: bytes | bytearray, at: int, end: int) -> tuple[int, int] | None:
    id_at = _map_value(data, at, end, b"id")
    if not id_at:
        return None
    span = _text_at(data, id_at, end)
    if span is None or not 0 < span[1] - span[0] <= MAX_ID_BYTES or 0 in data[span[0] : span[1]]:
        return None
    return span


def _all_text(data: bytes | bytearray, at: int, end: int) -> bool:
    items = _array_items(data, at, end)
    if items is None:
        return False
    pos = items[1]
    for _ in range(items[0]):
        span = _text_at(data, pos, end)
        if span is None:
            return False
        pos = span[1]
    return True


def _tasks_owned(data: bytes | bytearray, at: int, end: int, owner: bytes) -> bool:
    items = _array_items(data, at, end)
    if items is None:
        return False
    pos = items[1]
    for _ in range(items[0]):
        task_end = item_end(data[:end], pos)
        parent_at = _map_value(data, pos, task_end, b"parent_session_id") if task_end else None
        if parent_at is None:
            return False
        if parent_at and data[parent_at] != _NULL:
            span = _text_at(data, parent_at, task_end)
            if span is None or data[span[0] : span[1]] not in (b"", owner):
                return False
        pos = task_end
    return True


MAX_OUTLINED_RUNS = 256  # more run records: the rules in Python read them


def _unsigned_at(data: bytes | bytearray, at: int, end: int) -> int | None:
    head = _read_head(data, at, end)
    return head[1] if head is not None and head[0] == 0 else None


def _events_in_order(data: bytes | bytearray, at: int, end: int) -> tuple[bool, int] | None:
    """(whether there was an event, the last sequence) of events whose sequences are
    unsigned integers, strictly increasing; None for anything else."""
    items = _array_items(data, at, end)
    if items is None:
        return None
    pos, largest = items[1], None
    for _ in range(items[0]):
        event_end = item_end(data[:end], pos)
        sequence_at = _map_value(data, pos, event_end, b"sequence") if event_end else None
        sequence = _unsigned_at(data, sequence_at, event_end) if sequence_at else None
        if sequence is None or (largest is not None and sequence <= largest):
            return None
        largest, pos = sequence, event_end
    return (largest is not None, largest or 0)


def _run_in_order(data: bytes | bytearray, at: int, end: int, owner: bytes) -> int | None:
    """A run record of this session, in order: its text run id's offset (0: none);
    None when the rules in Python must read it."""
    record = _map_values(data, at, end, (b"snapshot", b"events"))
    if record is None or not record[0]:
        return None
    snapshot_at, events_at = record
    snapshot_end = item_end(data[:end], snapshot_at)
    fields = (
        _map_values(data, snapshot_at, snapshot_end, (b"session_id", b"id", b"event_count"))
        if snapshot_end
        else None
    )
    if fields is None:
        return None
    owner_at, run_id_at, count_at = fields
    if owner_at:
        span = _text_at(data, owner_at, snapshot_end)
        if span is None or data[span[0] : span[1]] != owner:
            return None
    if run_id_at and data[run_id_at] == _NULL:
        run_id_at = 0
    if run_id_at and _text_at(data, run_id_at, snapshot_end) is None:
        return None
    events = _events_in_order(data, events_at, end) if events_at else (False, 0)
    if events is None:
        return None
    if count_at and data[count_at] != _NULL:
        event_count = _unsigned_at(data, count_at, snapshot_end)
        if event_count is None or (events[0] and event_count <= events[1]):
            return None
    return run_id_at


def _runs_in_order(data: bytes | bytearray, at: int, end: int, owner: bytes) -> bool:
    items = _array_items(data, at, end)
    if items is None or items[0] > MAX_OUTLINED_RUNS:
        return False
    pos, seen = items[1], set[bytes]()
    for _ in range(items[0]):
        record_end = item_end(data[:end], pos)
        run_id_at = _run_in_order(data, pos, record_end, owner) if record_end else None
        if run_id_at is None:
            return False
        if run_id_at:
            span = _text_at(data, run_id_at, record_end)
            assert span is not None  # checked by _run_in_order
            run_id = bytes(data[span[0] : span[1]])
            if run_id in seen:
                return False
            seen.add(run_id)
        pos = record_end
    return True


def snapshot_outline(data: bytes | bytearray) -> tuple[int, int] | None:
    """The usual stored snapshot (the canonical bytes of one map, all of data): where
    its session id's text is, when every snapshot rule holds without decoding (run ids,
    where given, text; at most MAX_OUTLINED_RUNS run records); None when the rules in
    Python must decide (ops/snapshot.py)."""
    length = len(data)
    head = _read_head(data, 0, length)
    if head is None or head[0] != 5 or head[1] > length - head[2]:
        return None
    pos, version, session, tasks_at, runs_at = head[2], False, None, 0, 0
    for _ in range(head[1]):
        key = _text_at(data, pos, length)
        if key is None:
            return None
        at, end = key[1], item_end(data, key[1])
        if not end:
            return None
        name = bytes(data[key[0] : key[1]])
        if name == b"schema_version":
            version = end - at == 1 and data[at] == 0x01  # the integer 1
            if not version:
                return None
        elif name == b"session":
            session = _session_id_at(data, at, end)
            if session is None:
                return None
        elif name in _PLAIN_ARRAYS:
            if _array_items(data, at, end) is None:
                return None
        elif name == b"retained_artifact_uris":
            if not _all_text(data, at, end):
                return None
        elif name == b"run_records":
            runs_at = at  # read once the session's id is known
        elif name == b"subagent_tasks":
            tasks_at = at
        pos = end
    if not version or session is None or pos != length:
        return None
    owner = bytes(data[session[0] : session[1]])
    if runs_at and not _runs_in_order(data, runs_at, length, owner):
        return None
    if tasks_at and not _tasks_owned(data, tasks_at, length, owner):
        return None
    return session


# -- canonicalise ---------------------------------------------------------------


class _Unhandled(Exception):
    pass


def head(major: int, argument: int) -> bytes:
    """The shortest head_size of a data item (RFC 8949 section 3), used by every encoder here."""
    if argument < 24:
        return bytes([major << 5 | argument])
    for info, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if argument < 1 << (8 * width):
            return bytes([major << 5 | info]) + argument.to_bytes(width, "big")
    raise ValueError("length does not fit in 64 bits")


def _float(value: float) -> bytes:
    if math.isnan(value):
        return b"\xf9\x7e\x00"
    if math.isinf(value) or _fits_half(value):
        return b"\xf9" + struct.pack(">e", value)
    if _fits_single(value):
        return b"\xfa" + struct.pack(">f", value)
    return b"\xfb" + struct.pack(">d", value)


def _canonical_item(
    data: bytes, pos: int, end: int, depth: int, max_depth: int
) -> tuple[bytes, int]:
    if pos >= end:
        raise _Unhandled
    major, info = data[pos] >> 5, data[pos] & 0x1F
    if info >= 28:
        raise _Unhandled
    head_size = _head_length(info)
    if head_size > end - pos:
        raise _Unhandled
    argument = _argument(data, pos, info)
    pos += head_size
    if major in (0, 1):
        return head(major, argument), pos
    if major in (2, 3):
        if argument > end - pos:
            raise _Unhandled
        return head(major, argument) + data[pos : pos + argument], pos + argument
    if major == 4:
        if (argument and depth >= max_depth) or argument > end - pos:
            raise _Unhandled
        parts = [head(4, argument)]
        for _ in range(argument):
            part, pos = _canonical_item(data, pos, end, depth + 1, max_depth)
            parts.append(part)
        return b"".join(parts), pos
    if major == 5:
        if (argument and depth >= max_depth) or argument > end - pos:
            raise _Unhandled
        pairs = []
        for _ in range(argument):
            if pos >= end or data[pos] >> 5 != 3:
                raise _Unhandled
            key, pos = _canonical_item(data, pos, end, depth + 1, max_depth)
            value, pos = _canonical_item(data, pos, end, depth + 1, max_depth)
            pairs.append((key, value))
        pairs.sort(key=lambda pair: pair[0])
        if any(pairs[i - 1][0] == pairs[i][0] for i in range(1, len(pairs))):
            raise _Unhandled
        return head(5, argument) + b"".join(key + value for key, value in pairs), pos
    if major == 6:
        raise _Unhandled
    if 20 <= info <= 22:
        return data[pos - 1 : pos], pos
    if 25 <= info <= 27:
        return _float(_float_of(info, argument)), pos
    raise _Unhandled


def canonicalise(data: bytes | bytearray, start: int, end: int, max_depth: int) -> bytes | None:
    if not 0 <= start <= end <= len(data):
        raise ValueError("offsets outside the data")
    if not 0 <= max_depth <= MAX_DEPTH_ACCEPTED:
        raise ValueError(f"max_depth must be 0..{MAX_DEPTH_ACCEPTED}")
    status, _, position = walk(data[:end], start, end - start, max_depth, 2**64 - 1)
    if status not in (CANONICAL, VALID) or position != end:
        return None
    if status == CANONICAL:
        return bytes(data[start:end])
    try:
        encoded, pos = _canonical_item(bytes(data), start, end, 0, max_depth)
    except _Unhandled:
        return None
    return encoded if pos == end else None
