# The log's side of a backup (engine.BackupSnapshot): the index's entries copied
# on the readers' thread, where every batch is published, so they are the state
# at exactly one seq; the segments they point into are pinned, so compaction can
# go on meanwhile without unlinking them; the records are then read back and
# checked in a thread, a chunk at a time. The earlier generations of sessions
# the store keeps go too, each as a document of its own with its lower seq.
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from ..documents import SESSION, Document, Entry
from ..errors import CorruptRecord
from .state import LogState
from .store_reads import pin, read_entry, unpin

CHUNK_DOCUMENTS = 256


class LogBackup:
    def __init__(self, state: LogState) -> None:
        if state.damaged:
            row = next(iter(state.damaged.values()))
            message = (
                f"{len(state.damaged)} documents are damaged (verify lists them): a backup "
                "would leave them out"
            )
            raise CorruptRecord(row.file, row.offset, message)
        self.state = state
        self._seq = state.seq
        rows = state.index.rows()
        rows += [(SESSION, doc_id, entry) for doc_id, entry in state.index.earlier_rows()]
        self._rows = rows
        self._pinned: list[Entry] = list({e.segment: e for _, _, e in rows}.values())
        pin(state, self._pinned)

    @property
    def seq(self) -> int:
        return self._seq

    @property
    def documents(self) -> int:
        return len(self._rows)

    def chunks(self) -> Iterator[list[Document]]:
        self._rows.sort(key=lambda row: (row[2].segment, row[2].offset))  # in file order
        for start in range(0, len(self._rows), CHUNK_DOCUMENTS):
            yield [
                dataclasses.replace(
                    read_entry(self.state, kind, doc_id, entry),
                    committed_at_ms=entry.committed_at_ms,
                )
                for kind, doc_id, entry in self._rows[start : start + CHUNK_DOCUMENTS]
            ]

    def close(self) -> None:
        if self._pinned:
            unpin(self.state, self._pinned)
            self._pinned = []
