# What compaction, the compaction reserve, `verify` and a backup read and call of
# the log engine's store (store.py), as a protocol: they take the store without
# importing it, and the store calls them without an import cycle.
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..documents import Document, Entry
from ..sealing import Sealer
from .durable import Failpoint
from .fs import FileSystem
from .index import Index
from .index_checkpoint import DamageRow, IndexCheckpoints
from .segments import Log


class StoreParts(Protocol):
    fs: FileSystem
    root: str
    log: Log
    index: Index
    checkpoints: IndexCheckpoints
    sealer: Sealer
    failpoint: Failpoint
    seq: int
    compact_dead_share: float
    damaged: dict[int, DamageRow]
    retiring: list[int]

    def read_entry(self, kind: str, doc_id: str, entry: Entry) -> Document: ...
    def index_checkpoint_due(self) -> bool: ...
    def write_index_checkpoint(self) -> str: ...  # retired segments go after it
    def retire(self, segments: Sequence[int]) -> None: ...
    def pin(self, entries: Sequence[Entry]) -> None: ...  # their segments stay readable
    def unpin(self, entries: Sequence[Entry]) -> None: ...
