# The store's own metadata at the top of the state directory:
#
#   FORMAT  "sessionstore-format 2\n", then "key-id <16 hex>\n" when the store is
#           sealed: which key the store needs, checked before anything is read.
#           Format 1 was the file-per-generation layout (wal/ and docs/); a store
#           in it is migrated on first open (migrate_v1.py).
#   REKEY   present only while a key rotation runs (rekey.py): the old and new key
#           ids, and each key sealed under the other, so the store opens with
#           either one and the rotation finishes from whichever is given.
#
# Both are written temp -> fsync -> rename -> fsync(root) (durable.py).
from __future__ import annotations

import struct
from dataclasses import dataclass

import cbor2
import xxhash

from ..errors import SealError, StoreFormatError
from ..sealing import Key, Sealer
from .durable import Failpoint, no_failpoint, replace_file
from .fs import FileSystem

FORMAT_FILE = "FORMAT"
FORMAT_PREFIX = b"sessionstore-format "
FORMAT_VERSION = 2
LEGACY_FORMAT_VERSION = 1
KEY_ID_PREFIX = b"key-id "
REKEY_FILE = "REKEY"
REKEY_MAGIC = b"SSREKEY1"
REKEY_HEAD = struct.Struct("<8sQ")
REKEY_ASSOCIATED_DATA = b"sessionstore/rekey"
MAX_METADATA_BYTES = 64 * 1024
KEY_SOURCES = "--key-file, SESSIONSTORED_KEY_FILE or the sessionstored.key credential"


def format_text(key_id_hex: str | None, version: int = FORMAT_VERSION) -> bytes:
    text = FORMAT_PREFIX + str(version).encode() + b"\n"
    if key_id_hex is not None:
        text += KEY_ID_PREFIX + key_id_hex.encode("ascii") + b"\n"
    return text


def parse_format(path: str, data: bytes) -> tuple[int, str | None]:
    """(format version, the key id the store is sealed with or None for plaintext)."""
    lines = data.split(b"\n")
    versions = {FORMAT_PREFIX + str(v).encode(): v for v in (LEGACY_FORMAT_VERSION, FORMAT_VERSION)}
    version = versions.get(lines[0])
    if version is None or lines[-1] != b"":
        raise StoreFormatError(f"{path}: unknown store format {data[:40]!r}")
    body = lines[1:-1]
    if not body:
        return version, None
    if len(body) == 1 and body[0].startswith(KEY_ID_PREFIX):
        key_id = body[0][len(KEY_ID_PREFIX) :].decode("ascii", "replace")
        if len(key_id) == 16 and all(c in "0123456789abcdef" for c in key_id):
            return version, key_id
    raise StoreFormatError(f"{path}: offset {len(lines[0]) + 1}: bad key-id line")


def write_durably(
    fs: FileSystem, root: str, name: str, data: bytes, failpoint: Failpoint = no_failpoint
) -> None:
    replace_file(fs, root, f"{root}/{name}", data, failpoint)


@dataclass(frozen=True)
class RekeyBridge:
    from_id: str | None
    to_id: str | None
    to_key_sealed: bytes | None  # the new key, sealed with the old one
    from_key_sealed: bytes | None  # the old key, sealed with the new one

    @classmethod
    def between(cls, old: Key | None, new: Key | None) -> RekeyBridge:
        if old is None or new is None:  # nothing to wrap: one side is plaintext
            return cls(old.key_id_hex if old else None, new.key_id_hex if new else None, None, None)
        return cls(
            old.key_id_hex,
            new.key_id_hex,
            Sealer(old).seal(new.material, REKEY_ASSOCIATED_DATA),
            Sealer(new).seal(old.material, REKEY_ASSOCIATED_DATA),
        )

    def encode(self) -> bytes:
        payload = cbor2.dumps(
            {
                "from": self.from_id,
                "to": self.to_id,
                "to_key_sealed": self.to_key_sealed,
                "from_key_sealed": self.from_key_sealed,
            }
        )
        return REKEY_HEAD.pack(REKEY_MAGIC, xxhash.xxh3_64_intdigest(payload)) + payload

    @classmethod
    def decode(cls, path: str, data: bytes) -> RekeyBridge:
        if len(data) < REKEY_HEAD.size:
            raise StoreFormatError(f"{path}: offset 0: shorter than its header")
        magic, checksum = REKEY_HEAD.unpack_from(data, 0)
        payload = data[REKEY_HEAD.size :]
        if magic != REKEY_MAGIC or xxhash.xxh3_64_intdigest(payload) != checksum:
            raise StoreFormatError(f"{path}: offset 0: damaged key-rotation record")
        fields = cbor2.loads(payload)
        return cls(fields["from"], fields["to"], fields["to_key_sealed"], fields["from_key_sealed"])

    def describe(self) -> str:
        return f"from key id {self.from_id or '(none)'} to key id {self.to_id or '(none)'}"

    def keys(self, given: Key | None, root: str) -> tuple[Key | None, Key | None]:
        """(old, new) recovered from whichever of the two keys was given."""
        given_id = given.key_id_hex if given else None

        def unwrap(sealed: bytes | None) -> Key | None:
            if given is None or sealed is None:
                return None
            try:
                return Key.from_material(Sealer(given).open(sealed, REKEY_ASSOCIATED_DATA))
            except (SealError, ValueError) as error:
                raise StoreFormatError(f"{root}/{REKEY_FILE}: {error}") from None

        if given is not None and given_id == self.from_id:
            return given, unwrap(self.to_key_sealed)
        if given is not None and given_id == self.to_id:
            return unwrap(self.from_key_sealed), given
        have = f"the given key has id {given_id}" if given else "no key was given"
        raise StoreFormatError(
            f"{root}: a key rotation {self.describe()} is unfinished and {have}; "
            f"start with one of those keys ({KEY_SOURCES}) to finish it"
        )


@dataclass(frozen=True)
class StoreMetadata:
    exists: bool  # FORMAT is there: the store was created
    version: int
    sealed_with: str | None  # the key id FORMAT names
    bridge: RekeyBridge | None  # an unfinished key rotation


def read_metadata(fs: FileSystem, root: str) -> StoreMetadata:
    format_path = f"{root}/{FORMAT_FILE}"
    if not fs.exists(format_path):
        return StoreMetadata(False, FORMAT_VERSION, None, None)
    version, sealed_with = parse_format(format_path, fs.read_file(format_path, MAX_METADATA_BYTES))
    rekey_path = f"{root}/{REKEY_FILE}"
    bridge = None
    if fs.exists(rekey_path):
        bridge = RekeyBridge.decode(rekey_path, fs.read_file(rekey_path, MAX_METADATA_BYTES))
    return StoreMetadata(True, version, sealed_with, bridge)


def resolve_sealer(
    fs: FileSystem, root: str, given: Key | None, metadata: StoreMetadata
) -> tuple[Sealer, RekeyBridge | None]:
    """The sealer the store must be opened with, or a one-line StoreFormatError."""
    if not metadata.exists:
        write_durably(fs, root, FORMAT_FILE, format_text(given.key_id_hex if given else None))
        return Sealer(given), None
    sealed_with, bridge = metadata.sealed_with, metadata.bridge
    if bridge is not None:
        return Sealer.for_rotation(*bridge.keys(given, root)), bridge
    if sealed_with is None and given is not None:
        raise StoreFormatError(
            f"{root}: the store is not encrypted but a key was given; seal it with "
            "`sessionstored rekey --new-key-file FILE` (daemon stopped), or start without a key"
        )
    if sealed_with is not None and given is None:
        raise StoreFormatError(
            f"{root}: the store is encrypted (key id {sealed_with}) and no key was given; "
            f"pass its key ({KEY_SOURCES})"
        )
    if given is not None and sealed_with != given.key_id_hex:
        raise StoreFormatError(
            f"{root}: wrong key: the store is encrypted with key id {sealed_with}, "
            f"the given key has id {given.key_id_hex}"
        )
    return Sealer(given), None
