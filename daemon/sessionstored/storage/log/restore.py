# A log store built from a backup's documents (`sessionstored restore`), the way
# migrate_v1.py builds one: the documents go into compacted segments (each temp,
# fsync, rename, fsync the directory), and an index checkpoint at the backup's
# seq names them, so the store opens at that seq and a resuming watcher's seq
# never goes back. Each document keeps its own seq; a session's earlier
# generations (a session named more than once) are kept as earlier generations.
#
# The store is built beside the target, in DIR.restoring, and renamed to DIR
# only once it is whole and opens clean: a restore that crashes leaves no state
# directory under DIR's name that a daemon could take for an (empty) store.
from __future__ import annotations

from collections.abc import Iterable

from ..documents import Document, Entry
from ..errors import RestoreRefused
from ..sealing import Key, Sealer
from .check import check
from .durable import replace_file
from .fs import FileSystem
from .index import Index
from .index_checkpoint import Checkpoints, CheckpointState
from .records import encode_data
from .recovery import open_store
from .segments import COMPACTED, LOG_DIR, SEGMENT_HEADER_BYTES, encode_segment_header, segment_name

SEGMENT_TARGET_BYTES = 64 * 1024 * 1024  # a new segment once one holds this much


def restore_log(
    fs: FileSystem, target: str, key: Key | None, documents: Iterable[Document], seq: int
) -> int:
    """Build the store in target (absent, or an empty directory); returns how many
    documents it holds."""
    if fs.exists(target) and (not fs.is_dir(target) or fs.listdir(target)):
        raise RestoreRefused(f"{target}: not empty; restore builds a new store only")
    building = f"{target}.restoring"
    if fs.exists(building):
        raise RestoreRefused(f"{building}: left by an earlier restore; remove it first")
    fs.mkdir(building)
    store, _ = open_store(fs, building, key=key)  # the layout and FORMAT of a new store
    store.close()
    sealer = Sealer(key)
    rows: list[tuple[str, str, Entry]] = []
    segments: dict[int, int] = {}
    number, chunks, offset = 1, [encode_segment_header(1, COMPACTED)], SEGMENT_HEADER_BYTES

    def seal_segment() -> None:
        replace_file(fs, building, f"{building}/{LOG_DIR}/{segment_name(number)}", chunks)
        segments[number] = offset - SEGMENT_HEADER_BYTES

    for doc in documents:
        record = encode_data(sealer, 0, doc)
        rows.append((doc.kind, doc.id, Entry(doc.seq, doc.digest, len(doc.body), number, offset,
                                             len(record), doc.expires_at_ms,
                                             doc.committed_at_ms)))  # fmt: skip
        chunks.append(record)
        offset += len(record)
        if offset >= SEGMENT_TARGET_BYTES:
            seal_segment()
            number += 1
            chunks, offset = [encode_segment_header(number, COMPACTED)], SEGMENT_HEADER_BYTES
    if offset > SEGMENT_HEADER_BYTES:
        seal_segment()
        number += 1
    Checkpoints(fs, building, sealer).write(
        CheckpointState(
            generation=1,
            seq=seq,
            batch=0,
            position=(0, 0),
            next_segment=number,
            segments=segments,
            index=Index.from_entries(rows),
        )
    )
    store, _ = open_store(fs, building, key=key)
    try:
        _, problems = check(store)
        if problems or store.seq != seq:
            raise RestoreRefused(f"{building}: the restored store does not check: {problems}")
    finally:
        store.close()
    if fs.exists(target):
        fs.rmdir(target)
    fs.rename(building, target)
    fs.fsync_dir(target.rsplit("/", 1)[0] or "/")  # the new name survives power loss
    return len(rows)
