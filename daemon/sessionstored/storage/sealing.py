# Theory of operation: encryption at rest
#
# With a key, every byte the store keeps about a session is sealed with
# AES-256-GCM (the `cryptography` package; nothing here is a primitive of our
# own):
#
#     SEAL_MAGIC (8 bytes) | key id (8 bytes) | nonce (12 random bytes)
#     | ciphertext + 16-byte tag
#
# - Log records (records.py): the payload of a data or removal record (digest,
#   id, body) is the plaintext, and the record's header is the associated data,
#   so a payload moved under another header fails to open. The header names the
#   document only by a keyed hash of (kind, id) (id_hash), which reveals nothing.
# - Index checkpoints are sealed whole, so neither file names nor the log nor
#   the checkpoints reveal an id, a digest or any content.
# - The key id is a keyed fingerprint of the key (HMAC-SHA256, first 8 bytes).
#   It is in every envelope and in the FORMAT file, so the store can refuse a
#   missing or wrong key in one line before it reads anything else.
#
# A Sealer seals with one key (or none: a plaintext store) and opens with any
# of a set, which is how a key rotation (rekey.py) reads both generations.
# Plaintext found where a sealed envelope is expected is refused, never served.
from __future__ import annotations

import binascii
import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

import xxhash
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import KeyFileError, SealError

KEY_BYTES = 32
KEY_ID_BYTES = 8
NONCE_BYTES = 12
TAG_BYTES = 16
SEAL_MAGIC = b"SSEAL\x00\x01\n"
ENVELOPE_HEAD_BYTES = len(SEAL_MAGIC) + KEY_ID_BYTES + NONCE_BYTES


def _derive(material: bytes, purpose: bytes) -> bytes:
    return hmac.new(material, b"sessionstore/" + purpose, hashlib.sha256).digest()


@dataclass(frozen=True)
class Key:
    material: bytes = field(repr=False)
    key_id: bytes
    name_key: bytes = field(repr=False)

    @classmethod
    def from_material(cls, material: bytes) -> Key:
        if len(material) != KEY_BYTES:
            raise ValueError(f"a key is {KEY_BYTES} bytes, not {len(material)}")
        key_id = _derive(material, b"key-id")[:KEY_ID_BYTES]
        return cls(material, key_id, _derive(material, b"names"))

    @property
    def key_id_hex(self) -> str:
        return self.key_id.hex()


def parse_key(data: bytes, source: str) -> Key:
    """32 raw bytes, or 64 hex digits (surrounding whitespace allowed)."""
    if len(data) == KEY_BYTES:
        return Key.from_material(data)
    text = data.strip()
    if len(text) == 2 * KEY_BYTES:
        try:
            return Key.from_material(binascii.unhexlify(text))
        except binascii.Error:
            pass
    raise KeyFileError(
        f"{source}: a key must be {KEY_BYTES} raw bytes or {2 * KEY_BYTES} hex digits"
    )


class Sealer:
    def __init__(
        self,
        seal_with: Key | None,
        also_open: Iterable[Key] = (),
        *,
        accept_plaintext: bool | None = None,
    ) -> None:
        self.seal_with = seal_with
        self._aeads: dict[bytes, AESGCM] = {}
        self._naming: list[Key | None] = [seal_with]
        for key in ([seal_with] if seal_with else []) + list(also_open):
            self._aeads[key.key_id] = AESGCM(key.material)
            if key not in self._naming:
                self._naming.append(key)
        self.accept_plaintext = seal_with is None if accept_plaintext is None else accept_plaintext
        if self.accept_plaintext and None not in self._naming:
            self._naming.append(None)

    @classmethod
    def for_rotation(cls, old: Key | None, new: Key | None) -> Sealer:
        """Seals with the new key and opens what either key (or none) sealed."""
        also = [old] if old is not None else []
        return cls(new, also, accept_plaintext=old is None or new is None)

    @property
    def encrypted(self) -> bool:
        return self.seal_with is not None

    @property
    def key_id_hex(self) -> str | None:
        return self.seal_with.key_id_hex if self.seal_with else None

    def seal(self, plaintext: bytes, associated: bytes) -> bytes:
        key = self.seal_with
        if key is None:
            return plaintext
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = self._aeads[key.key_id].encrypt(nonce, plaintext, associated)
        return SEAL_MAGIC + key.key_id + nonce + sealed

    def open(self, data: bytes, associated: bytes) -> bytes:
        """The plaintext, or SealError naming the offset and the reason."""
        if not data.startswith(SEAL_MAGIC):
            if self.accept_plaintext:
                return data
            raise SealError(0, "plaintext in an encrypted store (not sealed with its key)")
        if len(data) < ENVELOPE_HEAD_BYTES + TAG_BYTES:
            raise SealError(len(data), "sealed envelope shorter than its header and tag")
        key_id = data[len(SEAL_MAGIC) : len(SEAL_MAGIC) + KEY_ID_BYTES]
        aead = self._aeads.get(key_id)
        if aead is None:
            have = self.key_id_hex or "none: the store is not encrypted"
            reason = f"sealed with another key (key id {key_id.hex()}; this key: {have})"
            raise SealError(len(SEAL_MAGIC), reason)
        nonce = data[len(SEAL_MAGIC) + KEY_ID_BYTES : ENVELOPE_HEAD_BYTES]
        try:
            return aead.decrypt(nonce, data[ENVELOPE_HEAD_BYTES:], associated)
        except InvalidTag:
            raise SealError(
                ENVELOPE_HEAD_BYTES,
                "sealed data does not authenticate (tampered, or moved from another name)",
            ) from None

    def id_hash(self, kind: str, doc_id: str) -> int:
        """Names a document in a log record header without revealing it under a key."""
        return id_hash_under(self.seal_with, kind, doc_id)

    def id_hashes(self, kind: str, doc_id: str) -> set[int]:
        """Every hash a record of this document may carry (more than one during a rotation)."""
        return {id_hash_under(key, kind, doc_id) for key in self._naming}


def id_hash_under(key: Key | None, kind: str, doc_id: str) -> int:
    text = f"{kind}\0{doc_id}".encode()
    if key is None:
        return xxhash.xxh3_64_intdigest(text)
    return int.from_bytes(hmac.new(key.name_key, text, hashlib.sha256).digest()[:8], "little")


PLAINTEXT = Sealer(None)
