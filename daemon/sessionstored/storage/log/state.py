# What the log engine's parts share (store.py makes one and hands it to each): the
# state directory and its segments, and the committed state published from them.
#
# Who writes what. The writer's thread appends to the segments (log) and counts
# the batches (batch). publish(), on the readers' thread, writes the rest: the
# index, the expiry schedule, the read cache, the watch history, seq, the lease
# and which damaged records a newer generation has replaced. The reads
# (store_reads.py) and the sweep (expiries.py) run on that same thread, so
# none of it takes a lock. Recovery fills it all in before the daemon serves.
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import FatalStorageError
from ..history import History
from ..sealing import Sealer
from .cache import ReadCache
from .durable import Failpoint
from .expiries import Expiries
from .fs import FileSystem
from .index import Index
from .index_checkpoint import DamageRow
from .segments import Log


@dataclass
class LogState:
    fs: FileSystem
    root: str
    sealer: Sealer
    log: Log
    history: History
    cache: ReadCache  # a DocumentCache (a test puts a watcher around one)
    keep_generations: int  # earlier generations of each session kept (generations.py)
    failpoint: Failpoint
    index: Index = field(default_factory=Index)
    expiries: Expiries = field(default_factory=Expiries)
    seq: int = 0
    batch: int = 0  # number of the last batch written
    lease: dict[str, Any] | None = None
    damaged: dict[int, DamageRow] = field(default_factory=dict)  # id hash -> its damaged record
    failed: bool = False  # a fatal error: nothing more is written until the store reopens

    def refuse_if_failed(self) -> None:
        if self.failed:
            raise FatalStorageError("the store failed earlier and must be reopened")

    def damage_of(self, kind: str, doc_id: str) -> DamageRow | None:
        """A damaged committed record that holds this document's newest generation."""
        if not self.damaged:
            return None
        for id_hash in self.sealer.id_hashes(kind, doc_id):
            row = self.damaged.get(id_hash)
            if row is not None:
                return row
        return None
