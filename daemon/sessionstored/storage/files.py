# Document files: one per stored document (a session snapshot; later kinds share
# the format). Each file is self-describing and self-checking:
#
#     FILE_MAGIC (8 bytes) | header length (u32 LE) | xxh3_64(header) (u64 LE)
#     | header: CBOR map {kind, id, seq, digest (16 bytes), size}
#     | body: the canonical CBOR of the document
#
# so bit rot in the header or the body is caught on every read, and a file moved
# under another name is caught by the id inside it. Names come from the id:
# "<kind>.i<base64url(id)>" when that fits a file name, else "<kind>.h<sha256>"
# (the id inside the file still decides), so any id, "../../etc/passwd" or 1024
# bytes long, stays distinct and inside docs/. With a key (sealing.py) the name
# is "<kind>.k<keyed hash>" and the whole file is sealed with the name as
# associated data. New generations are written under
# tmp/, synced, then renamed over the old file; the caller syncs docs/ once per
# batch.
from __future__ import annotations

import base64
import hashlib
import itertools
import struct
from dataclasses import dataclass

import cbor2
import xxhash

from sessionstore.canonical import digest_bytes_of_canonical

from .fs import FileSystem
from .sealing import ENVELOPE_HEAD_BYTES, TAG_BYTES, Key, Sealer, SealError, keyed_name_stem

FILE_MAGIC = b"SSDOC\x00\x01\n"
FILE_HEAD = struct.Struct("<8sIQ")
MAX_HEADER_BYTES = 8 * 1024
MAX_NAME_STEM_CHARS = 200
DOCS_DIR = "docs"
TMP_DIR = "tmp"


class CorruptDocument(Exception):
    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


@dataclass(frozen=True)
class Document:
    kind: str
    id: str
    seq: int
    digest: bytes
    body: bytes


def file_name(kind: str, doc_id: str) -> str:
    raw = doc_id.encode("utf-8")
    stem = base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    if len(stem) <= MAX_NAME_STEM_CHARS:
        return f"{kind}.i{stem}"
    return f"{kind}.h{hashlib.sha256(raw).hexdigest()}"


def _name_under(key: Key | None, kind: str, doc_id: str) -> str:
    return (
        file_name(kind, doc_id) if key is None else f"{kind}.{keyed_name_stem(key, kind, doc_id)}"
    )


def encode_document(doc: Document) -> bytes:
    header = cbor2.dumps(
        {
            "kind": doc.kind,
            "id": doc.id,
            "seq": doc.seq,
            "digest": doc.digest,
            "size": len(doc.body),
        }
    )
    return (
        FILE_HEAD.pack(FILE_MAGIC, len(header), xxhash.xxh3_64_intdigest(header))
        + header
        + doc.body
    )


def decode_header(path: str, data: bytes) -> tuple[dict[str, object], int]:
    if len(data) < FILE_HEAD.size:
        raise CorruptDocument(path, len(data), "file shorter than its fixed header")
    magic, header_len, header_sum = FILE_HEAD.unpack_from(data, 0)
    if magic != FILE_MAGIC:
        raise CorruptDocument(path, 0, "not a sessionstore document (bad magic)")
    if header_len > MAX_HEADER_BYTES or FILE_HEAD.size + header_len > len(data):
        raise CorruptDocument(path, 8, f"bad header length {header_len}")
    header_bytes = data[FILE_HEAD.size : FILE_HEAD.size + header_len]
    if xxhash.xxh3_64_intdigest(header_bytes) != header_sum:
        raise CorruptDocument(path, FILE_HEAD.size, "header checksum mismatch")
    header = cbor2.loads(header_bytes)
    if not isinstance(header, dict):
        raise CorruptDocument(path, FILE_HEAD.size, "header is not a map")
    return header, FILE_HEAD.size + header_len


def decode_document(path: str, data: bytes) -> Document:
    header, body_offset = decode_header(path, data)
    kind, doc_id, seq, digest, size = (
        header.get("kind"),
        header.get("id"),
        header.get("seq"),
        header.get("digest"),
        header.get("size"),
    )
    if not (
        isinstance(kind, str)
        and isinstance(doc_id, str)
        and isinstance(seq, int)
        and isinstance(digest, bytes)
        and len(digest) == 16
        and isinstance(size, int)
    ):
        raise CorruptDocument(path, FILE_HEAD.size, "header fields missing or of the wrong type")
    body = data[body_offset:]
    if len(body) != size:
        raise CorruptDocument(path, body_offset, f"body is {len(body)} bytes, header says {size}")
    if digest_bytes_of_canonical(body) != digest:
        raise CorruptDocument(path, body_offset, "body digest mismatch (bit rot or a torn write)")
    return Document(kind, doc_id, seq, digest, body)


class DocumentFiles:
    def __init__(self, fs: FileSystem, root: str, max_document_bytes: int, sealer: Sealer) -> None:
        self.fs = fs
        self.docs_dir = f"{root}/{DOCS_DIR}"
        self.tmp_dir = f"{root}/{TMP_DIR}"
        self.max_file_bytes = (
            max_document_bytes + FILE_HEAD.size + MAX_HEADER_BYTES + ENVELOPE_HEAD_BYTES + TAG_BYTES
        )
        self.sealer = sealer
        self._temp_counter = itertools.count()

    def name(self, kind: str, doc_id: str) -> str:
        return _name_under(self.sealer.seal_with, kind, doc_id)

    def names(self, kind: str, doc_id: str) -> list[str]:
        """Every name the document may have: more than one only during a key rotation."""
        return [_name_under(key, kind, doc_id) for key in self.sealer.naming_keys()]

    def path(self, kind: str, doc_id: str) -> str:
        return f"{self.docs_dir}/{self.name(kind, doc_id)}"

    def temp_path(self, kind: str, doc_id: str, seq: int) -> str:
        unique = next(self._temp_counter)
        return f"{self.tmp_dir}/{seq:016x}-{unique}.{self.name(kind, doc_id)[:120]}.tmp"

    def seal(self, doc: Document) -> bytes:
        return self.sealer.seal(encode_document(doc), self.name(doc.kind, doc.id).encode())

    def unseal(self, path: str, data: bytes) -> Document:
        name = path.rsplit("/", 1)[1]
        try:
            plain = self.sealer.open(data, name.encode())
        except SealError as error:
            raise CorruptDocument(path, error.offset, error.reason) from None
        return decode_document(path, plain)

    def write_temp(self, doc: Document) -> str:
        path = self.temp_path(doc.kind, doc.id, doc.seq)
        fd = self.fs.create_exclusive(path)
        try:
            self.fs.write(fd, self.seal(doc))
            self.fs.fsync(fd)  # the new generation is on disk before it can be renamed in
        except OSError:
            self.fs.close(fd)
            self.fs.unlink(path)  # a full disk must not keep half a document around
            raise
        self.fs.close(fd)
        return path

    def install(self, temp_path: str, kind: str, doc_id: str) -> None:
        self.fs.rename(temp_path, self.path(kind, doc_id))  # atomic: old or new, never a mix

    def remove(self, kind: str, doc_id: str) -> bool:
        removed = False
        for name in self.names(kind, doc_id):
            try:
                self.fs.unlink(f"{self.docs_dir}/{name}")
            except FileNotFoundError:
                continue
            removed = True
        return removed

    def sync(self) -> None:
        self.fs.fsync_dir(self.docs_dir)  # renames and unlinks of the batch survive power loss

    def read(self, kind: str, doc_id: str) -> Document | None:
        for name in self.names(kind, doc_id):
            path = f"{self.docs_dir}/{name}"
            try:
                data = self.fs.read_file(path, self.max_file_bytes)
            except FileNotFoundError:
                continue
            doc = self.unseal(path, data)
            if doc.kind != kind or doc.id != doc_id:
                raise CorruptDocument(
                    path, FILE_HEAD.size, "file holds another document (moved or swapped)"
                )
            return doc
        return None

    def read_path(self, name: str) -> Document:
        """The document in docs/<name>, which must be a name of its own kind and id."""
        path = f"{self.docs_dir}/{name}"
        doc = self.unseal(path, self.fs.read_file(path, self.max_file_bytes))
        if name not in self.names(doc.kind, doc.id):
            raise CorruptDocument(path, FILE_HEAD.size, "file name does not match its id")
        return doc

    def list_names(self) -> list[str]:
        return self.fs.listdir(self.docs_dir)

    def sweep_temps(self) -> list[str]:
        removed = []
        for name in self.fs.listdir(self.tmp_dir):
            self.fs.unlink(f"{self.tmp_dir}/{name}")
            removed.append(name)
        if removed:
            self.fs.fsync_dir(self.tmp_dir)
        return removed
