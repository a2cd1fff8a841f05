# What damaged bytes in the log mean: which document a damaged record held,
# and whether damage at the end of the log is a torn write or bit rot.
#
# Naming the document. A record whose header is intact names it by the header's
# id hash (and, in plaintext, by the id in its payload). A record whose header
# failed its checksum may still tell:
#   - one damaged byte in a header is repaired from the header's own checksum
#     (every value at every position is tried: 11,220 hashes of 44 bytes, a few
#     ms, and a false match is a 64-bit collision); the repaired header names
#     the document exactly, and its payload opens under a key;
#   - else, if its payload still matches the payload checksum in that header, the
#     damage lies in the header's first 32 bytes or in its own checksum: in
#     plaintext the id is read from the payload and confirmed by the id hash
#     (or taken with the header's kind when the hash itself was hit); sealed,
#     the payload opens if only the magic was hit;
#   - otherwise the header's id hash, when it is the hash of a document the
#     index or an earlier batch knows, names that document.
# Where none of these tells, the damage is recorded without a document, and
# `verify` and the log at start say that it cannot be told.
#
# Torn write or rot. Only the last batch can be torn, by a crash before its sync
# returned. Bytes that a torn write did not land read as the zeros the segment
# was filled with (a rewind and a cut torn tail are zeros too), so in a torn
# batch every damaged region holds a sector fragment of zeros: at the region's
# start (a header that never landed), 16 bytes or more anywhere (no header
# field, commit payload or single flipped byte makes a run that long), or at
# least 3 at the end of the region when it is the last thing in the log (the
# commit record's time ends in 2 zero bytes of its own). A damaged region
# without one is rot in a batch that was acknowledged: corruption, never
# rolled back. (Rot that lands in a body holding 16 zero bytes at a sector
# boundary is still taken for a torn write.)
from __future__ import annotations

from collections.abc import Callable, Iterable

from xxhash import xxh3_64_intdigest

from ..errors import SealError
from ..sealing import Sealer
from .index_checkpoint import DamageRow
from .records import (
    ASSOCIATED_BYTES,
    COMMIT,
    DATA,
    DIGEST_BYTES,
    EXPIRES,
    EXPIRY,
    HEADER,
    HEADER_BYTES,
    HEADER_CHECK,
    ID_LENGTH,
    KIND_CODES,
    KIND_NAMES,
    RECORD_MAGIC,
    REMOVAL,
    Header,
    payload_intact,
)

SECTOR_BYTES = 512  # the smallest unit a disk writes whole
TORN_ZERO_RUN_BYTES = 16  # a run of zeros this long is not a header's or one flip's
TORN_TAIL_ZERO_BYTES = 3  # a commit record's last 2 bytes are zeros of its own
UNTOLD = "damaged record header: the document it held cannot be told"

KnownHash = Callable[[int], str | None]  # id hash -> the id of a document it names


def raw_header(data: bytes, offset: int) -> Header | None:
    """The header's fields as they stand, checked by nothing."""
    if offset + HEADER_BYTES > len(data):
        return None
    return _fields(data[offset : offset + HEADER.size])


def _fields(head: bytes | bytearray) -> Header:
    _, record_type, kind, flags, batch, seq, id_hash, length, check = HEADER.unpack(head)
    return Header(record_type, kind, batch, seq, id_hash, length, check, flags)


def repaired_header(data: bytes, offset: int) -> bytes | None:
    """The header's first 44 bytes as written, if one byte of the 52 is damaged."""
    if offset + HEADER_BYTES > len(data):
        return None
    head = bytearray(data[offset : offset + HEADER.size])
    stored = data[offset + HEADER.size : offset + HEADER_BYTES]
    (check,) = HEADER_CHECK.unpack(stored)
    computed = HEADER_CHECK.pack(xxh3_64_intdigest(head))
    if sum(a != b for a, b in zip(computed, stored, strict=True)) <= 1:
        return bytes(head)  # the damage is in the check itself
    for position in range(len(head)):
        was = head[position]
        for value in range(256):
            if value != was:
                head[position] = value
                if xxh3_64_intdigest(head) == check:
                    return bytes(head)
        head[position] = was
    return None


def _ids_in(plain: bytes, record_type: int, flags: int = 0) -> list[tuple[int, str]]:
    """(type, id) for each layout the payload could have: a Data record's id follows its
    digest, and its expires_at_ms when it has one (the flags say so, if they survived)."""
    out = []
    data_at = [DIGEST_BYTES + EXPIRY.size, DIGEST_BYTES]
    if not flags & EXPIRES:
        data_at.reverse()
    layouts = (record_type,) if record_type in (DATA, REMOVAL) else (DATA, REMOVAL)
    for layout, at in [(t, a) for t in layouts for a in (data_at if t == DATA else [0])]:
        if at + 2 > len(plain):
            continue
        (length,) = ID_LENGTH.unpack_from(plain, at)
        if at + 2 + length > len(plain) or length == 0:
            continue
        try:
            out.append((layout, plain[at + 2 : at + 2 + length].decode("utf-8")))
        except UnicodeDecodeError:
            continue
    return out


def _named_by_payload(
    sealer: Sealer, data: bytes, offset: int, raw: Header, matches: bool
) -> tuple[int, str] | None:
    """(id hash, id) read from the payload of a record whose header is damaged."""
    start = offset + HEADER_BYTES
    if sealer.encrypted:
        if not matches:
            return None
        associated = RECORD_MAGIC + data[offset + len(RECORD_MAGIC) : offset + ASSOCIATED_BYTES]
        try:
            plain = sealer.open(data[start : start + raw.payload_length], associated)
        except SealError:
            return None
        kind = KIND_NAMES.get(raw.kind)
        for _, doc_id in _ids_in(plain, raw.type, raw.flags):
            if kind is not None:
                return sealer.id_hash(kind, doc_id), doc_id
        return None
    plain = data[start : start + raw.payload_length] if matches else data[start : start + 4096]
    kinds = [raw.kind] if raw.kind in KIND_NAMES else list(KIND_CODES.values())
    candidates = _ids_in(plain, raw.type, raw.flags)
    for _, doc_id in candidates:
        for code in kinds:
            if sealer.id_hash(KIND_NAMES[code], doc_id) == raw.id_hash:
                return raw.id_hash, doc_id
    if matches and raw.kind in KIND_NAMES and raw.type in (DATA, REMOVAL) and candidates:
        doc_id = candidates[0][1]  # the id hash was what the damage hit
        return sealer.id_hash(KIND_NAMES[raw.kind], doc_id), doc_id
    return None


def rows_for_damaged_header(
    sealer: Sealer, path: str, data: bytes, offset: int, known: KnownHash
) -> list[DamageRow]:
    """What a record whose header failed its checksum held: none for a commit record's
    header, else one row naming the document where anything tells, or saying that nothing
    does."""
    if offset + HEADER_BYTES > len(data) or not any(data[offset : offset + HEADER_BYTES]):
        return [DamageRow(_untold_key(path, offset), 0, path, offset, UNTOLD, None)]
    repaired = repaired_header(data, offset)
    if repaired is not None:
        # exact: the header as written, in a copy of the record's bytes
        data = data[:offset] + repaired + data[offset + HEADER.size :]
    raw = _fields(data[offset : offset + HEADER.size])
    if raw.id_hash == 0 or (raw.type == COMMIT and raw.kind == 0):
        return []  # a commit record's (they name no document): its batch tells the rest
    matches = payload_intact(data, offset, raw)  # then length, check and payload are intact
    named = _named_by_payload(sealer, data, offset, raw, matches)
    if named is not None:
        return [DamageRow(named[0], raw.seq, path, offset, "damaged record header", named[1])]
    doc_id = known(raw.id_hash)
    if doc_id is not None or repaired is not None:
        return [DamageRow(raw.id_hash, raw.seq, path, offset, "damaged record header", doc_id)]
    return [DamageRow(_untold_key(path, offset), raw.seq, path, offset, UNTOLD, None)]


def _untold_key(path: str, offset: int) -> int:
    """A key for a damage row that names no document: negative, where id hashes are not."""
    return -1 - xxh3_64_intdigest(f"{path}:{offset}".encode())


def region_looks_torn(data: bytes, start: int, end: int, *, last: bool) -> bool:
    """Whether the damaged bytes [start, end) hold a sector fragment of zeros that a torn
    write leaves (see the top of this module)."""
    fragment_start = start
    while fragment_start < end:
        fragment_end = min(end, (fragment_start // SECTOR_BYTES + 1) * SECTOR_BYTES)
        if not any(data[fragment_start:fragment_end]):
            size = fragment_end - fragment_start
            if (
                fragment_start == start
                or size >= TORN_ZERO_RUN_BYTES
                or (last and fragment_end == end and size >= TORN_TAIL_ZERO_BYTES)
            ):
                return True
        fragment_start = fragment_end
    return False


def all_regions_look_torn(
    data_of: Callable[[int], bytes], regions: Iterable[tuple[int, int, int, bool]]
) -> bool:
    """regions: (segment, start, end, whether it is the last thing in the log)."""
    return all(
        region_looks_torn(data_of(segment), start, end, last=last)
        for segment, start, end, last in regions
    )
