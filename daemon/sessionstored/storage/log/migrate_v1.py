# Migration of a format-1 store (one file per generation under docs/, a WAL of
# identities under wal/) to the log, on its first open by this version:
#
#   1. Anything an interrupted migration left in log/ and ckpt/ is removed.
#   2. Every document file under docs/ is read and checked (its own checksum,
#      digest and name; sealed ones open with the store's key). A file there is
#      a durable generation: format 1 renamed a synced temp file into docs/
#      before it wrote the commit record, and its own recovery sealed exactly
#      those intents whose file was in place. Unreadable files are reported by
#      name and left out.
#   3. The documents go into one compacted segment (temp, fsync, rename), and
#      an index checkpoint names it. seq continues from the highest seq seen in
#      any document, old WAL record or old checkpoint name, so it never goes back.
#   4. FORMAT says format 2; only then are docs/, wal/ and the old checkpoints
#      removed (a crash before that repeats the migration from step 1; after
#      it, the next open finishes the removal).
# The watch history before the migration is not carried over: a watcher that
# resumes from before it gets `compacted`.
from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import logging
import struct
from typing import Any

import cbor2
import xxhash

from sessionstore.wire.canonical import digest_bytes_of_canonical

from ..documents import Document
from ..errors import SealError, StoreFormatError
from ..sealing import Key, Sealer
from .compacted_build import write_compacted_store
from .fs import FileSystem
from .index_checkpoint import CKPT_DIR, generation_of
from .metadata import FORMAT_FILE, StoreMetadata, format_text, write_durably
from .store import Store

log = logging.getLogger("sessionstored.storage")

LEGACY_DOCS_DIR = "docs"
LEGACY_WAL_DIR = "wal"
LEGACY_FILE_MAGIC = b"SSDOC\x00\x01\n"
LEGACY_FILE_HEAD = struct.Struct("<8sIQ")
LEGACY_SEGMENT_HEADER = b"SSWAL\x00\x01\n"
LEGACY_RECORD_MAGIC = b"\xa5WR1"
LEGACY_RECORD_HEAD = struct.Struct("<4sQI")
LEGACY_RECORD_ASSOCIATED_DATA = b"sessionstore/wal-record"
LEGACY_MAX_NAME_STEM_CHARS = 200
LEGACY_MAX_FILE_BYTES = 1 << 40
LEGACY_NAME_HASH_HEX_CHARS = 40


def _keyed_name_stem(key: Key, kind: str, doc_id: str) -> str:
    """Format 1's sealed file names: an HMAC of (kind, id) under the name key."""
    mac = hmac.new(key.name_key, f"{kind}\0{doc_id}".encode(), hashlib.sha256)
    return "k" + mac.hexdigest()[:LEGACY_NAME_HASH_HEX_CHARS]


def _legacy_name(sealer: Sealer, kind: str, doc_id: str) -> str:
    key = sealer.seal_with
    if key is not None:
        return f"{kind}.{_keyed_name_stem(key, kind, doc_id)}"
    raw = doc_id.encode("utf-8")
    stem = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    if len(stem) <= LEGACY_MAX_NAME_STEM_CHARS:
        return f"{kind}.i{stem}"
    return f"{kind}.h{hashlib.sha256(raw).hexdigest()}"


def _legacy_document(sealer: Sealer, name: str, data: bytes) -> Document:
    """A format-1 document file, checked; ValueError names what is wrong."""
    try:
        plain = sealer.open(data, name.encode())
    except SealError as error:
        raise ValueError(f"offset {error.offset}: {error.reason}") from None
    if len(plain) < LEGACY_FILE_HEAD.size:
        raise ValueError("offset 0: shorter than its header")
    magic, header_len, header_sum = LEGACY_FILE_HEAD.unpack_from(plain, 0)
    header_bytes = plain[LEGACY_FILE_HEAD.size : LEGACY_FILE_HEAD.size + header_len]
    if magic != LEGACY_FILE_MAGIC or xxhash.xxh3_64_intdigest(header_bytes) != header_sum:
        raise ValueError("offset 0: bad magic or header checksum")
    header: dict[str, Any] = cbor2.loads(header_bytes)
    body = plain[LEGACY_FILE_HEAD.size + header_len :]
    kind, doc_id, seq, digest = header["kind"], header["id"], header["seq"], header["digest"]
    if digest_bytes_of_canonical(body) != digest or len(body) != header["size"]:
        raise ValueError(f"offset {LEGACY_FILE_HEAD.size + header_len}: body digest mismatch")
    if _legacy_name(sealer, kind, doc_id) != name:
        raise ValueError("offset 0: file name does not match its id")
    return Document(kind, doc_id, seq, digest, body)


def _legacy_wal_seq(fs: FileSystem, directory: str, sealer: Sealer) -> int:
    """The highest seq any intact format-1 WAL record names."""
    highest = 0
    for name in sorted(fs.listdir(directory)):
        data = fs.read_file(f"{directory}/{name}", LEGACY_MAX_FILE_BYTES)
        offset = len(LEGACY_SEGMENT_HEADER) if data.startswith(LEGACY_SEGMENT_HEADER) else 0
        while offset + LEGACY_RECORD_HEAD.size <= len(data):
            magic, checksum, length = LEGACY_RECORD_HEAD.unpack_from(data, offset)
            start = offset + LEGACY_RECORD_HEAD.size
            if magic != LEGACY_RECORD_MAGIC or start + length > len(data):
                break
            if xxhash.xxh3_64_intdigest(data[offset + 12 : start + length]) != checksum:
                break
            try:
                payload = cbor2.loads(
                    sealer.open(data[start : start + length], LEGACY_RECORD_ASSOCIATED_DATA)
                )
                seqs = payload[1] if payload[0] == "C" else [payload[1]]
                highest = max([highest, *(s for s in seqs if isinstance(s, int))])
            except (SealError, ValueError, IndexError, TypeError, cbor2.CBORDecodeError):
                break
            offset = start + length
    return highest


def migrate_v1(store: Store, metadata: StoreMetadata) -> str:
    fs, root, sealer = store.state.fs, store.state.root, store.sealer
    if metadata.bridge is not None:
        raise StoreFormatError(
            f"{root}: a format-1 store with an unfinished key rotation; finish the rotation "
            "with the sessionstored version that started it, then start this one"
        )
    log.warning("%s: migrating the store from format 1 (a file per generation) to the log", root)
    for name in fs.listdir(store.state.log.directory):
        fs.unlink(f"{store.state.log.directory}/{name}")
    for name in fs.listdir(f"{root}/{CKPT_DIR}"):
        if generation_of(name) is not None:
            fs.unlink(f"{root}/{CKPT_DIR}/{name}")

    docs_dir = f"{root}/{LEGACY_DOCS_DIR}"
    documents: list[Document] = []
    unreadable: list[str] = []
    for name in sorted(fs.listdir(docs_dir)) if fs.is_dir(docs_dir) else []:
        try:
            data = fs.read_file(f"{docs_dir}/{name}", LEGACY_MAX_FILE_BYTES)
            documents.append(_legacy_document(sealer, name, data))
        except (ValueError, KeyError, TypeError, OSError, cbor2.CBORDecodeError) as error:
            unreadable.append(f"{docs_dir}/{name}: {error}")
    wal_dir = f"{root}/{LEGACY_WAL_DIR}"
    highest = _legacy_wal_seq(fs, wal_dir, sealer) if fs.is_dir(wal_dir) else 0
    for name in fs.listdir(f"{root}/{CKPT_DIR}"):
        if name.endswith(".ckpt") and len(name) == 21:
            with contextlib.suppress(ValueError):
                highest = max(highest, int(name[:16], 16))
    highest = max([highest, *(d.seq for d in documents)])

    ordered = sorted(documents, key=lambda d: d.seq)
    write_compacted_store(fs, root, sealer, ordered, highest)
    key_id = sealer.key_id_hex
    write_durably(fs, root, FORMAT_FILE, format_text(key_id))
    remove_legacy(fs, root)
    summary = f"format 1 -> 2: {len(documents)} documents up to seq {highest}"
    if unreadable:
        summary += f"; {len(unreadable)} unreadable files left out: " + "; ".join(unreadable)
        log.error("%s: migration left out unreadable files: %s", root, "; ".join(unreadable))
    return summary


def remove_legacy(fs: FileSystem, root: str) -> bool:
    """Remove what format 1 left behind once FORMAT says 2; True if there was any."""
    found = False
    for directory in (LEGACY_DOCS_DIR, LEGACY_WAL_DIR):
        path = f"{root}/{directory}"
        if not fs.is_dir(path):
            continue
        found = True
        for name in fs.listdir(path):
            fs.unlink(f"{path}/{name}")
        fs.rmdir(path)
    ckpt = f"{root}/{CKPT_DIR}"
    for name in fs.listdir(ckpt):
        if name.endswith(".ckpt") and generation_of(name) is None:
            fs.unlink(f"{ckpt}/{name}")
            found = True
    if found:
        fs.fsync_dir(root)
        fs.fsync_dir(ckpt)
    return found
