# A store's log written whole from a list of documents, as compaction would have left
# it: the documents in compacted segments (each a temp file, fsynced, renamed, its
# directory fsynced), a new one every SEGMENT_TARGET_BYTES, then an index checkpoint
# at the given seq that names them. A store opened on it starts at that seq. Both a
# restore (restore.py) and the move from format 1 (migrate_v1.py) build stores so.
from __future__ import annotations

from collections.abc import Iterable

from ..documents import Document, Entry
from ..sealing import Sealer
from .durable import replace_file
from .fs import FileSystem
from .index import Index
from .index_checkpoint import IndexCheckpoints, IndexCheckpointState
from .records import encode_data
from .segments import COMPACTED, LOG_DIR, SEGMENT_HEADER_BYTES, encode_segment_header, segment_name

SEGMENT_TARGET_BYTES = 64 * 1024 * 1024  # a new segment once one holds this much


def write_compacted_store(
    fs: FileSystem, root: str, sealer: Sealer, documents: Iterable[Document], seq: int
) -> int:
    """Write the documents (each at its own seq; a document named twice keeps the older
    as an earlier generation) and the checkpoint at seq; how many documents it wrote."""
    rows: list[tuple[str, str, Entry]] = []
    segments: dict[int, int] = {}
    number, chunks, offset = 1, [encode_segment_header(1, COMPACTED)], SEGMENT_HEADER_BYTES

    def seal_segment() -> None:
        replace_file(fs, root, f"{root}/{LOG_DIR}/{segment_name(number)}", chunks)
        segments[number] = offset - SEGMENT_HEADER_BYTES

    for doc in documents:
        record = encode_data(sealer, 0, doc)
        entry = Entry(doc.seq, doc.digest, len(doc.body), number, offset, len(record),
                      doc.expires_at_ms, doc.committed_at_ms)  # fmt: skip
        rows.append((doc.kind, doc.id, entry))
        chunks.append(record)
        offset += len(record)
        if offset >= SEGMENT_TARGET_BYTES:
            seal_segment()
            number += 1
            chunks, offset = [encode_segment_header(number, COMPACTED)], SEGMENT_HEADER_BYTES
    if offset > SEGMENT_HEADER_BYTES:
        seal_segment()
        number += 1
    IndexCheckpoints(fs, root, sealer).write(
        IndexCheckpointState(
            generation=1,
            seq=seq,
            batch=0,
            position=(0, 0),
            next_segment=number,
            segments=segments,
            index=Index.from_entries(rows),
        )
    )
    return len(rows)
