# The log's upkeep between batches, as the writer sees it (engine.LogMaintenance):
# a spare segment prepared ahead of the next rotation (zero-filled or preallocated,
# segments.py says when), compaction planned on the writer's thread, copied in a
# background one and switched in between batches, and index checkpoints. The work
# itself is in segments.py, compaction.py and store.py.
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import compaction
from .store_parts import StoreParts


@dataclass
class Compaction:
    store: StoreParts
    plan: compaction.Plan

    @property
    def victims(self) -> Sequence[int]:
        return self.plan.victims

    @property
    def number(self) -> int:
        return self.plan.number

    def copy(self) -> None:
        compaction.copy(self.store, self.plan)

    def switch(self) -> int:
        return compaction.switch(self.store, self.plan)


class Upkeep:
    def __init__(self, store: StoreParts) -> None:
        self.store = store

    def close_retired(self) -> None:
        self.store.log.close_retired()

    def want_spare(self) -> bool:
        return self.store.log.want_spare()

    def prepare_spare(self) -> None:
        self.store.log.prepare_spare()

    def compaction_due(self) -> bool:
        return compaction.compaction_due(self.store)

    def plan_compaction(self, *, dead_only: bool = False) -> Compaction | None:
        work = compaction.plan(self.store, dead_only=dead_only)
        return None if work is None else Compaction(self.store, work)

    def index_checkpoint_due(self) -> bool:
        return self.store.index_checkpoint_due()

    def write_index_checkpoint(self) -> str:
        return self.store.write_index_checkpoint()
