# Index checkpoints: the whole index as of one seq, so boot reads one file plus
# the WAL after it instead of all history, and old WAL segments can go.
#
#     CKPT_MAGIC (8 bytes) | xxh3_64(payload) (u64 LE) | payload
#     payload: CBOR {"seq": S, "entries": [[kind, id, seq, digest, size], ...]},
#              sealed with the checkpoint's name as associated data when there is a key
#
# Written like a document: tmp/ -> fsync -> rename into ckpt/ -> fsync(ckpt/).
# The newest checkpoint that reads back intact wins; the one before it is kept
# as a fallback.
from __future__ import annotations

import struct
from dataclasses import dataclass

import cbor2
import xxhash

from .fs import FileSystem
from .index import Entry, Index
from .sealing import Sealer, SealError

CKPT_MAGIC = b"SSCKPT1\n"
CKPT_HEAD = struct.Struct("<8sQ")
CKPT_DIR = "ckpt"
CKPT_SUFFIX = ".ckpt"
CHECKPOINTS_KEPT = 2
MAX_CHECKPOINT_BYTES = 4 * 1024 * 1024 * 1024


@dataclass
class Checkpoint:
    seq: int
    index: Index
    path: str


class CheckpointError(Exception):
    pass


def checkpoint_name(seq: int) -> str:
    return f"{seq:016x}{CKPT_SUFFIX}"


def encode_checkpoint(seq: int, index: Index, sealer: Sealer) -> bytes:
    entries = [
        [kind, doc_id, entry.seq, entry.digest, entry.size]
        for kind in index.kinds()
        for doc_id, entry in index.items(kind)
    ]
    payload = sealer.seal(
        cbor2.dumps({"seq": seq, "entries": entries}), checkpoint_name(seq).encode()
    )
    return CKPT_HEAD.pack(CKPT_MAGIC, xxhash.xxh3_64_intdigest(payload)) + payload


def decode_checkpoint(path: str, data: bytes, sealer: Sealer) -> Checkpoint:
    if len(data) < CKPT_HEAD.size:
        raise CheckpointError(f"{path}: offset 0: shorter than its header")
    magic, checksum = CKPT_HEAD.unpack_from(data, 0)
    payload = data[CKPT_HEAD.size :]
    if magic != CKPT_MAGIC:
        raise CheckpointError(f"{path}: offset 0: bad magic")
    if xxhash.xxh3_64_intdigest(payload) != checksum:
        raise CheckpointError(f"{path}: offset {CKPT_HEAD.size}: checksum mismatch")
    try:
        payload = sealer.open(payload, path.rsplit("/", 1)[1].encode())
    except SealError as error:
        raise CheckpointError(f"{path}: offset {CKPT_HEAD.size + error.offset}: {error}") from None
    decoded = cbor2.loads(payload)
    index = Index.from_entries(
        [(row[0], row[1], Entry._make(row[2:])) for row in decoded["entries"]]
    )
    return Checkpoint(decoded["seq"], index, path)


class Checkpoints:
    def __init__(self, fs: FileSystem, root: str, sealer: Sealer) -> None:
        self.fs = fs
        self.sealer = sealer
        self.directory = f"{root}/{CKPT_DIR}"
        self.tmp_dir = f"{root}/tmp"

    def names(self) -> list[str]:
        return sorted(n for n in self.fs.listdir(self.directory) if n.endswith(CKPT_SUFFIX))

    def load_latest(self) -> tuple[Checkpoint | None, list[str]]:
        """The newest intact checkpoint, and a problem line for each newer one that was not."""
        problems: list[str] = []
        for name in reversed(self.names()):
            path = f"{self.directory}/{name}"
            try:
                return decode_checkpoint(
                    path, self.fs.read_file(path, MAX_CHECKPOINT_BYTES), self.sealer
                ), problems
            except (CheckpointError, OSError, ValueError, KeyError, TypeError) as error:
                problems.append(str(error))
        return None, problems

    def write(self, seq: int, index: Index) -> str:
        name = checkpoint_name(seq)
        temp = f"{self.tmp_dir}/{name}.tmp"
        if self.fs.exists(temp):
            self.fs.unlink(temp)
        fd = self.fs.create_exclusive(temp)
        try:
            self.fs.write(fd, encode_checkpoint(seq, index, self.sealer))
            self.fs.fsync(fd)  # the checkpoint is whole on disk before it is named
        finally:
            self.fs.close(fd)
        path = f"{self.directory}/{name}"
        self.fs.rename(temp, path)
        self.fs.fsync_dir(self.directory)  # the name survives power loss
        self.prune(CHECKPOINTS_KEPT)
        return path

    def prune(self, keep: int) -> None:
        for old in self.names()[:-keep]:
            self.fs.unlink(f"{self.directory}/{old}")
