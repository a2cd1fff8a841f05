# Index checkpoints: the store's state as of one point in the log, so that boot
# reads one file plus the log after it, and so that segments can go.
#
#     CKPT_MAGIC (8 bytes) | xxh3_64(payload) (u64 LE) | payload
#     payload: CBOR {generation, seq, batch, position: [segment, offset],
#              next_segment, segments: [[number, record bytes], ...],
#              entries: {kind: [ids, seqs, digests, sizes, segments, offsets, lengths]},
#              (an eighth column, expires_at_ms, 0 for none, and a ninth,
#              committed_at_ms, 0 where unknown),
#              earlier: [ids, counts, then the entry columns of the earlier
#                        generations kept, each session's oldest first],
#              history: [seqs, kinds (one text, a character each), ids, digests|null,
#                        committed_at_ms, sizes, expired (booleans)],
#              damaged: [[id hash, seq, file, offset, reason, id or null], ...]}
#     sealed as a whole when the store has a key. Columns, not rows: decoding
#     100,000 entries then makes no row objects to throw away, which is what
#     kept a large store's memory high after boot.
#
# A checkpoint is the root of everything before its position: the compacted
# segments are reached only through it, and the retained watch history
# survives compaction in it. So each generation is written twice, as two
# files (like bbolt's two meta pages), each temp -> fsync -> rename -> fsync
# of ckpt/. Older generations are removed only once both copies of the new one
# are durable, and a segment is removed only when no checkpoint on disk names it.
from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import cbor2
import xxhash

from sessionstore.wire.cbor_bytes_python import head  # shortest form, as cbor2 writes it
from sessionstore.wire.messages import RawCBOR

from ..documents import Entry
from ..errors import IndexCheckpointError, SealError
from ..sealing import Sealer
from .durable import Failpoint, no_failpoint, replace_file
from .fs import FileSystem
from .index import Index

CKPT_MAGIC = b"SSCKPT2\n"
CKPT_HEAD = struct.Struct("<8sQ")
CKPT_DIR = "ckpt"
CKPT_SUFFIX = ".ckpt"
COPIES = (1, 2)
ASSOCIATED_DATA = b"sessionstore/index-checkpoint"
MAX_CHECKPOINT_BYTES = 4 * 1024 * 1024 * 1024

HistoryRow = tuple[int, str, str, bytes | None, int, int, bool]
HISTORY_COLUMNS = 7


class DamageRow(NamedTuple):
    """A committed record found damaged: its document is io_error until rewritten."""

    id_hash: int  # negative when no id hash survived (damage.py)
    seq: int
    file: str
    offset: int
    reason: str
    id: str | None  # None when nothing tells which document it held


@dataclass
class IndexCheckpointState:
    generation: int
    seq: int
    batch: int
    position: tuple[int, int]
    next_segment: int
    segments: dict[int, int]
    index: Index
    # the store's own history rows (watch's Committed tuples), not copied
    history: Sequence[HistoryRow] = field(default_factory=list)
    damaged: list[DamageRow] = field(default_factory=list)
    path: str = ""


# The writer's thread encodes a checkpoint while the event loop serves, and both need
# the GIL, which one C call keeps for as long as it runs: cbor2.dumps of 500,000
# entries' columns held it for most of a second (every client's ping waited that long,
# bench/loop_stall.py). So the columns are built by Python loops, which let the loop in
# every few ms, and encoded PIECE_ITEMS items per dumps call.
PIECE_ITEMS = 4096


def _entry_columns(table: dict[str, Entry]) -> list[list[Any]]:
    columns: list[list[Any]] = [list(table)]
    for field_number in range(len(Entry._fields)):
        columns.append([entry[field_number] for entry in table.values()])
    return columns


def _earlier_columns(earlier: dict[str, list[Entry]]) -> list[list[Any]]:
    entries = [entry for kept in earlier.values() for entry in kept]
    columns: list[list[Any]] = [list(earlier), [len(kept) for kept in earlier.values()]]
    for field_number in range(len(Entry._fields)):
        columns.append([entry[field_number] for entry in entries])
    return columns


def _earlier(columns: list[Any]) -> dict[str, list[Entry]]:
    ids, counts, *fields = columns
    entries = list(map(Entry, *fields)) if fields else []
    earlier: dict[str, list[Entry]] = {}
    start = 0
    for doc_id, count in zip(ids, counts, strict=True):
        earlier[doc_id] = entries[start : start + count]
        start += count
    return earlier


def _history_columns(rows: Sequence[HistoryRow]) -> list[Any]:
    columns: list[Any] = [[row[n] for row in rows] for n in range(HISTORY_COLUMNS)]
    columns[1] = "".join(columns[1])
    return columns


HISTORY_CHUNK_ROWS = 4096  # rows of consecutive seqs, aligned on a multiple of it


def _seq_of(row: HistoryRow) -> int:
    return row[0]


class HistoryColumns:
    """The history part of checkpoints, encoded as _history_columns then cbor2 would, with
    every whole chunk of HISTORY_CHUNK_ROWS rows (seqs k * HISTORY_CHUNK_ROWS onwards) encoded
    once and kept for the next checkpoint: committed rows never change, and the retained
    history (100,000 changes by default) took 60 ms of the GIL to encode at every
    checkpoint, one after each compaction, which came every few hundred 64 KiB saves."""

    def __init__(self, chunk_rows: int = HISTORY_CHUNK_ROWS) -> None:
        self.chunk_rows = chunk_rows
        # chunk number -> (its first row, its last row, its columns' pieces)
        self._chunks: dict[int, tuple[HistoryRow, HistoryRow, list[bytes]]] = {}
        self.encoded_chunks = 0  # chunks encoded afresh (the tests watch it)

    def encode(self, rows: Sequence[HistoryRow]) -> RawCBOR:
        columns: list[list[bytes]] = [[] for _ in range(HISTORY_COLUMNS)]
        kept: dict[int, tuple[HistoryRow, HistoryRow, list[bytes]]] = {}
        start = 0
        while start < len(rows):
            chunk = rows[start][0] // self.chunk_rows
            end = bisect.bisect_left(rows, (chunk + 1) * self.chunk_rows, start, key=_seq_of)
            run = rows[start:end]
            for column, piece in zip(columns, self._pieces(chunk, run, kept), strict=True):
                column.append(piece)
            start = end
        self._chunks = kept
        out = [head(4, HISTORY_COLUMNS)]
        for number, pieces in enumerate(columns):
            major = 3 if number == 1 else 4  # the kinds are one text, a character each
            out.append(head(major, len(rows) if major == 4 else sum(map(len, pieces))))
            out.extend(pieces)
        return RawCBOR(b"".join(out))

    def _pieces(
        self,
        chunk: int,
        run: Sequence[HistoryRow],
        kept: dict[int, tuple[HistoryRow, HistoryRow, list[bytes]]],
    ) -> list[bytes]:
        whole = (
            len(run) == self.chunk_rows
            and run[0][0] == chunk * self.chunk_rows
            and run[-1][0] == run[0][0] + self.chunk_rows - 1
        )
        cached = self._chunks.get(chunk) if whole else None
        if cached is not None and cached[0] is run[0] and cached[1] is run[-1]:
            kept[chunk] = cached
            return cached[2]
        pieces = []
        for number, values in enumerate(_history_columns(run)):
            if number == 1:
                pieces.append(values.encode())
            else:
                pieces.append(cbor2.dumps(values)[len(head(4, len(values))) :])
        self.encoded_chunks += 1
        if whole:
            kept[chunk] = (run[0], run[-1], pieces)
        return pieces


def encode_in_pieces(value: Any, out: list[bytes]) -> None:
    """Append value's CBOR to out, no dumps call taking more than PIECE_ITEMS items."""
    if isinstance(value, RawCBOR):  # encoded already: spliced as it is
        out.append(value.data)
    elif isinstance(value, dict):
        out.append(head(5, len(value)))
        for key, item in value.items():
            out.append(cbor2.dumps(key))
            encode_in_pieces(item, out)
    elif isinstance(value, list) and len(value) > PIECE_ITEMS:
        out.append(head(4, len(value)))
        for start in range(0, len(value), PIECE_ITEMS):
            piece = value[start : start + PIECE_ITEMS]
            out.append(cbor2.dumps(piece)[len(head(4, len(piece))) :])
    elif isinstance(value, list) and any(isinstance(item, (list, dict)) for item in value):
        out.append(head(4, len(value)))
        for item in value:
            encode_in_pieces(item, out)
    else:
        out.append(cbor2.dumps(value))


def _history_rows(columns: list[Any]) -> list[HistoryRow]:
    if len(columns) == HISTORY_COLUMNS - 1:  # written before expiry existed
        columns = [*columns, [False] * len(columns[0])]
    seqs, kinds, ids, digests, at_ms, sizes, expired = columns
    return list(zip(seqs, kinds, ids, digests, at_ms, sizes, expired, strict=True))


def checkpoint_name(generation: int, copy: int) -> str:
    return f"{generation:016x}-{copy}{CKPT_SUFFIX}"


def generation_of(name: str) -> int | None:
    stem, dash, rest = name.partition("-")
    if not dash or rest not in {f"{c}{CKPT_SUFFIX}" for c in COPIES} or len(stem) != 16:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


def encode_checkpoint(
    state: IndexCheckpointState, sealer: Sealer, history: HistoryColumns | None = None
) -> bytes:
    """history: the encoder that keeps the chunks of the last checkpoint's history."""
    payload = {
        "generation": state.generation,
        "seq": state.seq,
        "batch": state.batch,
        "position": list(state.position),
        "next_segment": state.next_segment,
        "segments": sorted(state.segments.items()),
        "entries": {
            kind: _entry_columns(state.index.table(kind))
            for kind in state.index.kinds()
            if state.index.count(kind)
        },
        "earlier": _earlier_columns(state.index.earlier),
        "history": (history or HistoryColumns()).encode(state.history),
        "damaged": state.damaged,
    }
    pieces: list[bytes] = []
    encode_in_pieces(payload, pieces)
    sealed = sealer.seal(b"".join(pieces), ASSOCIATED_DATA)
    return CKPT_HEAD.pack(CKPT_MAGIC, xxhash.xxh3_64_intdigest(sealed)) + sealed


def decode_checkpoint(path: str, data: bytes, sealer: Sealer) -> IndexCheckpointState:
    if len(data) < CKPT_HEAD.size:
        raise IndexCheckpointError(f"{path}: offset 0: shorter than its header")
    magic, checksum = CKPT_HEAD.unpack_from(data, 0)
    payload = data[CKPT_HEAD.size :]
    if magic != CKPT_MAGIC:
        raise IndexCheckpointError(f"{path}: offset 0: bad magic")
    if xxhash.xxh3_64_intdigest(payload) != checksum:
        raise IndexCheckpointError(f"{path}: offset {CKPT_HEAD.size}: checksum mismatch")
    try:
        plain = sealer.open(payload, ASSOCIATED_DATA)
    except SealError as error:
        raise IndexCheckpointError(
            f"{path}: offset {CKPT_HEAD.size + error.offset}: {error}"
        ) from None
    try:
        fields: dict[str, Any] = cbor2.loads(plain)
        index = Index.from_columns(
            {
                kind: (ids, list(map(Entry, *columns)))
                for kind, (ids, *columns) in fields["entries"].items()
            }
        )
        index.load_earlier(_earlier(fields.get("earlier", [[], []])))
        return IndexCheckpointState(
            generation=fields["generation"],
            seq=fields["seq"],
            batch=fields["batch"],
            position=(fields["position"][0], fields["position"][1]),
            next_segment=fields["next_segment"],
            segments=dict(fields["segments"]),
            index=index,
            history=_history_rows(fields["history"]),
            damaged=[DamageRow(*row) for row in fields["damaged"]],
            path=path,
        )
    except (KeyError, TypeError, ValueError, IndexError, cbor2.CBORDecodeError) as error:
        raise IndexCheckpointError(
            f"{path}: offset {CKPT_HEAD.size}: bad payload ({error})"
        ) from None


class IndexCheckpoints:
    def __init__(self, fs: FileSystem, root: str, sealer: Sealer) -> None:
        self.fs = fs
        self.root = root
        self.sealer = sealer
        self.directory = f"{root}/{CKPT_DIR}"
        self.history = HistoryColumns()

    def names(self) -> list[str]:
        """Checkpoint files, oldest generation first."""
        found = [(generation_of(n), n) for n in self.fs.listdir(self.directory)]
        return [n for g, n in sorted((g, n) for g, n in found if g is not None)]

    def newest_bytes(self) -> int:
        names = self.names()
        return self.fs.file_size(f"{self.directory}/{names[-1]}") if names else 0

    def load_all(self) -> tuple[list[IndexCheckpointState], list[str]]:
        """Every intact checkpoint, newest first, and a problem line for each that was not."""
        intact: list[IndexCheckpointState] = []
        problems: list[str] = []
        for name in reversed(self.names()):
            path = f"{self.directory}/{name}"
            try:
                data = self.fs.read_file(path, MAX_CHECKPOINT_BYTES)
                intact.append(decode_checkpoint(path, data, self.sealer))
            except (IndexCheckpointError, OSError) as error:
                problems.append(str(error))
        return intact, problems

    def write(self, state: IndexCheckpointState, failpoint: Failpoint = no_failpoint) -> str:
        """Both copies of a new generation, then the older generations go."""
        data = encode_checkpoint(state, self.sealer, self.history)
        paths = [f"{self.directory}/{checkpoint_name(state.generation, c)}" for c in COPIES]
        for path in paths:
            replace_file(self.fs, self.root, path, data, failpoint)
        self.prune(keep_generation=state.generation)
        return paths[0]

    def prune(self, keep_generation: int) -> None:
        stale = [n for n in self.names() if (generation_of(n) or 0) < keep_generation]
        for name in stale:
            self.fs.unlink(f"{self.directory}/{name}")
        if stale:
            self.fs.fsync_dir(self.directory)
