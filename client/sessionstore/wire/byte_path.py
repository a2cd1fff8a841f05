# The daemon's way through a request without decoding what no rule reads.
#
# The compiled helper (cbor_bytes) walks each request as its bytes arrive,
# resuming where the last read ended, and says whether the store accepts it as it
# is, once canonicalised, or leaves it to the decoder (cbor_framing.py decides
# then, with its own errors: tags, indefinite lengths, non-text keys, anything
# refused). A request the helper accepts is a map with text keys; its small
# arguments are decoded in one cbor2 call over their bytes spliced together, and
# the arguments an op names as documents (a save's snapshot, a checkpoint's value)
# stay bytes: a CanonicalItem, checked, canonical, stored as received.
#
# Without the compiled helper this path is off: the Python twin walks bytes a
# hundred times slower than cbor2 decodes them (bench/frontend_cost.py), so the
# decoder path is the pure-Python daemon's fast one.
from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import cbor2

from . import cbor_bytes
from .cbor_bytes_python import head
from .shared import NEED_DATA, CanonicalItem, Deferred, Inbox, Mode

USE_DECODER: Any = object()  # the helper leaves this item to the decoder
_OP_KEY = cbor2.dumps("op")
MAP, ARRAY = 5, 4


class ByteReader:
    """Requests out of an Inbox through the compiled helper, or USE_DECODER."""

    def __init__(
        self,
        max_message_bytes: int,
        max_depth: int,
        max_items: int | None,
        documents: Mapping[str, frozenset[str]],
        defer_above_bytes: int | None = None,
        defer_canonical_above_bytes: int | None = None,
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.max_depth = max_depth
        self.max_items = max_items if max_items is not None else 2**62
        # op -> the encoded names of the arguments kept as bytes
        self.documents = {
            op: {cbor2.dumps(name): name for name in names} for op, names in documents.items()
        }
        # Larger items come out as Deferred: those to canonicalise above the first (that
        # costs about four walks: measured, a 63 MiB request held the loop for 0.9 s),
        # canonical ones above the second (their documents are not decoded here).
        self.defer_above_bytes = defer_above_bytes
        self.defer_canonical_above_bytes = defer_canonical_above_bytes
        self._walker: Any = None

    def next_message(self, inbox: Inbox) -> Any:
        data = inbox.data
        if self._walker is None:
            if major_type(data) != MAP:
                return USE_DECODER  # not a request: the decoder says so
            self._walker = cbor_bytes.Walker(
                0, self.max_message_bytes, self.max_depth, self.max_items
            )
        status, _, end = self._walker.walk(data)
        if status == cbor_bytes.INCOMPLETE and not inbox.eof:
            return NEED_DATA
        self._walker = None
        if status == cbor_bytes.CANONICAL:
            item = bytes(data) if end == len(data) else bytes(data[:end])
            limit = self.defer_canonical_above_bytes
        elif status == cbor_bytes.VALID:
            if self.defer_above_bytes is not None and end > self.defer_above_bytes:
                item = bytes(data[:end])
                del data[:end]
                return Deferred(item, Mode.CBOR)  # canonicalised in the worker
            canonical = cbor_bytes.canonicalise(data, 0, end, self.max_depth)
            if canonical is None:
                return USE_DECODER  # equal keys: the decoder names them
            item, limit = canonical, None
        else:
            return USE_DECODER
        del data[:end]
        if limit is not None and len(item) > limit:
            return Deferred(item, Mode.CBOR)  # the worker takes it as it is
        return self._message(item)

    def _message(self, item: bytes) -> dict[str, Any]:
        pairs = _pairs(item, 0, len(item))
        documents: dict[bytes, str] = {}
        for key_at, value_at, end in pairs:
            if item[key_at:value_at] == _OP_KEY:
                op = _text(item[value_at:end])
                documents = self.documents.get(op, {}) if isinstance(op, str) else {}
                break
        return _decoded_keeping(item, pairs, documents)


def _pairs(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """(key, value, end) offsets of each entry of the canonical map at data[start:end]."""
    offsets = cbor_bytes.entries(data, start, end)
    return [(offsets[i], offsets[i + 1], offsets[i + 2]) for i in range(0, len(offsets) - 1, 2)]


def _decoded_keeping(
    data: bytes, pairs: list[tuple[int, int, int]], keep: Mapping[bytes, str]
) -> dict[str, Any]:
    """The map of these entries, decoded but for the arrays and maps under the keys (by
    their encoded bytes) in keep: those stay CanonicalItem bytes."""
    kept: dict[str, CanonicalItem] = {}
    small: list[bytes] = []
    for key_at, value_at, end in pairs:
        name = keep.get(data[key_at:value_at])
        if name is not None and major_type(data, value_at) in (MAP, ARRAY):
            kept[name] = CanonicalItem(data[value_at:end])
        else:
            small.append(data[key_at:end])
    message: dict[str, Any] = cbor2.loads(head(MAP, len(small)) + b"".join(small))
    message.update(kept)
    return message


def array_keeping(item: CanonicalItem, keep: frozenset[str]) -> list[Any]:
    """A canonical array's items, decoded; of its maps, the arrays and maps under the names
    in keep stay CanonicalItem bytes (a txn's ops keep their values)."""
    data = item.data
    offsets = cbor_bytes.entries(data, 0, len(data))
    encoded_names = {cbor2.dumps(name): name for name in keep}
    out = []
    for start, end in itertools.pairwise(offsets):
        if major_type(data, start) == MAP:
            out.append(_decoded_keeping(data, _pairs(data, start, end), encoded_names))
        else:
            out.append(cbor2.loads(data[start:end]))
    return out


def map_fields(data: bytes, start: int = 0, end: int | None = None) -> dict[str, tuple[int, int]]:
    """Where each value of the canonical text-keyed map at data[start:end] lies, by key (end
    known: its last value is not walked). A map at 0 is all of data."""
    if end is None:
        end = len(data) if start == 0 else -1
    offsets = cbor_bytes.entries(data, start, end)
    fields = {}
    for i in range(0, len(offsets) - 1, 2):
        value_at = offsets[i + 1]
        fields[_text(data[offsets[i] : value_at])] = (value_at, offsets[i + 2])
    return fields


# The text keys map_fields has met, and the ops requests named, by their encoding:
# the same few dozen names (a snapshot's components, a session's fields, the ops)
# come back in every request, and a dict lookup costs a tenth of decoding one.
_KEYS: dict[bytes, Any] = {}
MAX_REMEMBERED_KEYS = 4096


def _text(encoded: bytes) -> Any:
    """The decoded item (a key, an op's name), looked up if met before."""
    key = _KEYS.get(encoded)
    if key is None:
        key = cbor2.loads(encoded)
        if isinstance(key, str) and len(_KEYS) < MAX_REMEMBERED_KEYS:
            _KEYS[encoded] = key
    return key


def raw_entries(data: bytes) -> dict[bytes, bytes]:
    """The canonical map that is all of data, as encoded key -> encoded value."""
    return {data[k:v]: data[v:end] for k, v, end in _pairs(data, 0, len(data))}


def raw_map(entries: Mapping[bytes, bytes]) -> bytes:
    """The canonical map of encoded keys and values: entries sorted by their key bytes."""
    ordered = sorted(entries.items())
    return head(MAP, len(ordered)) + b"".join(key + value for key, value in ordered)


def major_type(data: bytes | bytearray, start: int = 0) -> int:
    return data[start] >> 5


def decode_span(data: bytes, span: tuple[int, int]) -> Any:
    return cbor2.loads(data[span[0] : span[1]])
