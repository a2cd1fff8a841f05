# The log's record types, and their bytes.
#
# Every record is a fixed header, then a payload:
#
#     magic "\xa5SL2" | type u8 | kind u8 | flags u16 | batch u64 | seq u64
#     | id hash u64 | payload length u32 | xxh3_64(payload) u64
#     | xxh3_64(the 44 bytes before) u64                      (52 bytes, little endian)
#
# The header has a checksum of its own, so a record whose payload rotted still
# names its type, batch, seq and document (by a hash of kind and id: keyed
# with the store's name key when sealed, so it reveals nothing). That is how
# recovery and `verify` say which document a damaged record held.
#
#   Data     (an intent carrying a new generation):
#            payload = digest (16) | [expires_at_ms u64] | id length u16 | id (UTF-8)
#                      | canonical body
#            expires_at_ms is there when flags has EXPIRES (the generation expires
#            at that wall-clock ms since the epoch); a record without it never does
#   Removal  (an intent removing a document): payload = id length u16 | id;
#            flags EXPIRED when the expiry sweep removed it
#   Commit   (closes a batch: every intent of that batch number is applied):
#            payload = first seq u64 | intents u32 | committed_at_ms u64; seq = last seq
#
# With a key, Data and Removal payloads are sealed (sealing.py) with the first
# 32 header bytes as associated data, so a payload cannot be moved under
# another header. Commit payloads hold only numbers and stay plain.
from __future__ import annotations

import struct
from typing import NamedTuple

import xxhash

from sessionstore.wire.value_class import value_class

from ..documents import Document
from ..errors import CorruptRecord, SealError
from ..sealing import Sealer

RECORD_MAGIC = b"\xa5SL2"
HEADER = struct.Struct("<4sBBHQQQIQ")
HEADER_CHECK = struct.Struct("<Q")
HEADER_BYTES = HEADER.size + HEADER_CHECK.size  # 52
ASSOCIATED_BYTES = 32  # magic .. id hash: what a sealed payload is bound to
DIGEST_BYTES = 16
ID_LENGTH = struct.Struct("<H")
COMMIT_PAYLOAD = struct.Struct("<QIQ")
MAX_PAYLOAD_BYTES = 1 << 31

DATA = 1
REMOVAL = 2
COMMIT = 3
RECORD_TYPES = (DATA, REMOVAL, COMMIT)

EXPIRES = 0x0001  # flags of a Data record whose payload holds expires_at_ms
EXPIRED = 0x0002  # flags of a Removal record the expiry sweep wrote
KNOWN_FLAGS = EXPIRES | EXPIRED
EXPIRY = struct.Struct("<Q")

KIND_CODES = {"s": 1, "l": 2, "w": 3, "L": 4, "k": 5}
KIND_NAMES = {code: name for name, code in KIND_CODES.items()}


class Header(NamedTuple):
    type: int
    kind: int
    batch: int
    seq: int
    id_hash: int
    payload_length: int
    payload_check: int
    flags: int = 0


class Meta(NamedTuple):
    """What an intent record says of its document, without its body."""

    kind: str
    id: str
    digest: bytes | None  # None for a removal
    size: int  # of the body
    expires_at_ms: int
    expired: bool  # a removal by the expiry sweep


@value_class
class Commit:
    batch: int
    first_seq: int
    last_seq: int
    intents: int
    committed_at_ms: int


def _frame(
    kind: int, record_type: int, batch: int, seq: int, id_hash: int, payload: bytes, flags: int = 0
) -> bytes:
    head = HEADER.pack(
        RECORD_MAGIC,
        record_type,
        kind,
        flags,
        batch,
        seq,
        id_hash,
        len(payload),
        xxhash.xxh3_64_intdigest(payload),
    )
    return head + HEADER_CHECK.pack(xxhash.xxh3_64_intdigest(head)) + payload


def _sealed_frame(
    sealer: Sealer,
    kind: int,
    record_type: int,
    batch: int,
    seq: int,
    id_hash: int,
    plain: bytes,
    flags: int = 0,
) -> bytes:
    if not sealer.encrypted:
        return _frame(kind, record_type, batch, seq, id_hash, plain, flags)
    associated = HEADER.pack(RECORD_MAGIC, record_type, kind, flags, batch, seq, id_hash, 0, 0)
    sealed = sealer.seal(plain, associated[:ASSOCIATED_BYTES])
    return _frame(kind, record_type, batch, seq, id_hash, sealed, flags)


def encode_data(sealer: Sealer, batch: int, doc: Document) -> bytes:
    id_bytes = doc.id.encode("utf-8")
    expiry = EXPIRY.pack(doc.expires_at_ms) if doc.expires_at_ms else b""
    plain = b"".join((doc.digest, expiry, ID_LENGTH.pack(len(id_bytes)), id_bytes, doc.body))
    kind = KIND_CODES[doc.kind]
    flags = EXPIRES if doc.expires_at_ms else 0
    id_hash = sealer.id_hash(doc.kind, doc.id)
    return _sealed_frame(sealer, kind, DATA, batch, doc.seq, id_hash, plain, flags)


def encode_removal(
    sealer: Sealer, batch: int, seq: int, kind: str, doc_id: str, *, expired: bool = False
) -> bytes:
    id_bytes = doc_id.encode("utf-8")
    plain = ID_LENGTH.pack(len(id_bytes)) + id_bytes
    code = KIND_CODES[kind]
    flags = EXPIRED if expired else 0
    id_hash = sealer.id_hash(kind, doc_id)
    return _sealed_frame(sealer, code, REMOVAL, batch, seq, id_hash, plain, flags)


def encode_commit(commit: Commit) -> bytes:
    payload = COMMIT_PAYLOAD.pack(commit.first_seq, commit.intents, commit.committed_at_ms)
    return _frame(0, COMMIT, commit.batch, commit.last_seq, 0, payload)


def parse_header(data: bytes | memoryview, offset: int) -> Header | None:
    """The header at offset if it is whole and intact, else None."""
    end = offset + HEADER_BYTES
    if end > len(data) or data[offset : offset + 4] != RECORD_MAGIC:
        return None
    (check,) = HEADER_CHECK.unpack_from(data, offset + HEADER.size)
    if xxhash.xxh3_64_intdigest(data[offset : offset + HEADER.size]) != check:
        return None
    _, record_type, kind, flags, batch, seq, id_hash, length, payload_check = HEADER.unpack_from(
        data, offset
    )
    if record_type not in RECORD_TYPES or length > MAX_PAYLOAD_BYTES or flags & ~KNOWN_FLAGS:
        return None
    return Header(record_type, kind, batch, seq, id_hash, length, payload_check, flags)


def payload_intact(data: bytes | memoryview, offset: int, header: Header) -> bool:
    start = offset + HEADER_BYTES
    end = start + header.payload_length
    return end <= len(data) and xxhash.xxh3_64_intdigest(data[start:end]) == header.payload_check


def record_length(header: Header) -> int:
    return HEADER_BYTES + header.payload_length


def _open_payload(
    sealer: Sealer, path: str, data: bytes | memoryview, offset: int, header: Header
) -> bytes | memoryview:
    start = offset + HEADER_BYTES
    payload = data[start : start + header.payload_length]
    if header.type == COMMIT:
        return payload
    try:
        return sealer.open(bytes(payload), bytes(data[offset : offset + ASSOCIATED_BYTES]))
    except SealError as error:
        raise CorruptRecord(path, start + error.offset, error.reason) from None


def _id_at(path: str, plain: bytes | memoryview, at: int, offset: int) -> tuple[str, int]:
    if at + 2 > len(plain):
        raise CorruptRecord(path, offset, "record payload shorter than its id")
    (length,) = ID_LENGTH.unpack_from(plain, at)
    end = at + 2 + length
    if end > len(plain):
        raise CorruptRecord(path, offset, "record payload shorter than its id")
    try:
        return bytes(plain[at + 2 : end]).decode("utf-8"), end
    except UnicodeDecodeError:
        raise CorruptRecord(path, offset, "record id is not UTF-8") from None


def decode_data(
    sealer: Sealer, path: str, data: bytes | memoryview, offset: int, header: Header
) -> Document:
    """The document in an intact Data record (header and payload checked by the caller)."""
    kind = KIND_NAMES.get(header.kind)
    if kind is None:
        raise CorruptRecord(path, offset, f"unknown document kind {header.kind}")
    plain = _open_payload(sealer, path, data, offset, header)
    digest = bytes(plain[:DIGEST_BYTES])
    expires_at_ms, id_at = _expiry(path, plain, header, offset)
    doc_id, body_at = _id_at(path, plain, id_at, offset)
    return Document(kind, doc_id, header.seq, digest, bytes(plain[body_at:]), expires_at_ms)


def _expiry(path: str, plain: bytes | memoryview, header: Header, offset: int) -> tuple[int, int]:
    """A Data payload's expires_at_ms (0 when it has none) and where its id starts."""
    if not header.flags & EXPIRES:
        return 0, DIGEST_BYTES
    if DIGEST_BYTES + EXPIRY.size > len(plain):
        raise CorruptRecord(path, offset, "record payload shorter than its expiry")
    (expires_at_ms,) = EXPIRY.unpack_from(plain, DIGEST_BYTES)
    return expires_at_ms, DIGEST_BYTES + EXPIRY.size


def decode_commit(path: str, data: bytes | memoryview, offset: int, header: Header) -> Commit:
    if header.payload_length != COMMIT_PAYLOAD.size:
        raise CorruptRecord(path, offset, "commit record of the wrong size")
    first, intents, at_ms = COMMIT_PAYLOAD.unpack_from(data, offset + HEADER_BYTES)
    return Commit(header.batch, first, header.seq, intents, at_ms)


def read_document(
    sealer: Sealer, path: str, offset: int, data: bytes, kind: str, doc_id: str
) -> Document:
    """The document in one whole record read back from path at offset, checked to be
    (kind, doc_id); CorruptRecord names the file and the offset of the damage."""
    try:
        header = parse_header(data, 0)
        if header is None:
            raise CorruptRecord(path, 0, "damaged record header (bit rot or a torn write)")
        if header.type != DATA:
            raise CorruptRecord(path, 0, "not the data record the index names")
        if not payload_intact(data, 0, header):
            raise CorruptRecord(path, HEADER_BYTES, "record payload checksum mismatch (bit rot)")
        doc = decode_data(sealer, path, data, 0, header)
        if doc.kind != kind or doc.id != doc_id:
            raise CorruptRecord(path, 0, "record holds another document")
        if len(data) != record_length(header):
            raise CorruptRecord(path, 0, "record length differs from the index")
    except CorruptRecord as error:
        raise CorruptRecord(path, offset + error.offset, error.reason) from None
    return doc


def decode_meta(
    sealer: Sealer, path: str, data: bytes | memoryview, offset: int, header: Header
) -> Meta:
    """What an intact intent record says of its document, without copying its body."""
    kind = KIND_NAMES.get(header.kind)
    if kind is None:
        raise CorruptRecord(path, offset, f"unknown document kind {header.kind}")
    plain = _open_payload(sealer, path, data, offset, header)
    if header.type == REMOVAL:
        doc_id, _ = _id_at(path, plain, 0, offset)
        return Meta(kind, doc_id, None, 0, 0, bool(header.flags & EXPIRED))
    expires_at_ms, id_at = _expiry(path, plain, header, offset)
    doc_id, body_at = _id_at(path, plain, id_at, offset)
    digest = bytes(plain[:DIGEST_BYTES])
    return Meta(kind, doc_id, digest, len(plain) - body_at, expires_at_ms, False)
