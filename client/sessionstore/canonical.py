# Canonical CBOR (RFC 8949 section 4.2.1) and the snapshot digest of the wire contract.
#
# cbor2's canonical mode sorts map keys length-first (RFC 7049). For keys of one
# CBOR major type that order equals RFC 8949's bytewise order of the encoded keys,
# because the header byte grows with the length. Only maps whose keys mix major
# types (an int key beside a text key) need the bytewise sort done here.
from __future__ import annotations

from typing import Any

import cbor2
import xxhash

DIGEST_DOMAIN = b"sessionstore.snapshot.v1\x00"
DIGEST_PREFIX = "xxh3-128:"


def _major_type(key: Any) -> int:
    if isinstance(key, bool) or key is None or isinstance(key, float):
        return 7
    if isinstance(key, int):
        return 0 if key >= 0 else 1
    if isinstance(key, bytes):
        return 2
    if isinstance(key, str):
        return 3
    if isinstance(key, (list, tuple)):
        return 4
    if isinstance(key, dict):
        return 5
    return 6


def _needs_bytewise_sort(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if len({_major_type(k) for k in item}) > 1:
                return True
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def _encode_bytewise(value: Any, out: list[bytes]) -> None:
    if isinstance(value, dict):
        encoded = []
        for key, item in value.items():
            key_parts: list[bytes] = []
            _encode_bytewise(key, key_parts)
            item_parts: list[bytes] = []
            _encode_bytewise(item, item_parts)
            encoded.append((b"".join(key_parts), b"".join(item_parts)))
        encoded.sort(key=lambda pair: pair[0])
        out.append(_header(5, len(encoded)))
        for key_bytes, item_bytes in encoded:
            out.append(key_bytes)
            out.append(item_bytes)
    elif isinstance(value, (list, tuple)):
        out.append(_header(4, len(value)))
        for item in value:
            _encode_bytewise(item, out)
    else:
        out.append(cbor2.dumps(value, canonical=True))


def _header(major: int, length: int) -> bytes:
    if length < 24:
        return bytes([major << 5 | length])
    for info, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if length < 1 << (8 * width):
            return bytes([major << 5 | info]) + length.to_bytes(width, "big")
    raise ValueError("length does not fit in 64 bits")


def canonical_dumps(value: Any) -> bytes:
    if _needs_bytewise_sort(value):
        parts: list[bytes] = []
        _encode_bytewise(value, parts)
        return b"".join(parts)
    return bytes(cbor2.dumps(value, canonical=True))


def digest_of_canonical(encoded: bytes) -> str:
    return DIGEST_PREFIX + xxhash.xxh3_128_hexdigest(DIGEST_DOMAIN + encoded)


def digest_bytes_of_canonical(encoded: bytes) -> bytes:
    return xxhash.xxh3_128_digest(DIGEST_DOMAIN + encoded)


def snapshot_digest(snapshot: Any) -> str:
    return digest_of_canonical(canonical_dumps(snapshot))


def digest_text(raw: bytes) -> str:
    return DIGEST_PREFIX + raw.hex()


def parse_digest(text: str) -> bytes | None:
    if not isinstance(text, str) or not text.startswith(DIGEST_PREFIX):
        return None
    hex_part = text[len(DIGEST_PREFIX) :]
    if len(hex_part) != 32 or hex_part != hex_part.lower():
        return None
    try:
        return bytes.fromhex(hex_part)
    except ValueError:
        return None
