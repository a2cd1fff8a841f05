# When Python's cyclic garbage collector may look at the index.
#
# Index entries and watch history rows are named tuples, and unlike plain tuples
# the collector keeps tracking them: with 500,000 keys a full collection walked
# 640,000 objects for 330 ms, holding the GIL, and a txn that allocates enough
# to set one off stalled every client for that long (bench/loop_stall.py). So
# what recovery built, and what each index checkpoint consolidated, is frozen
# (gc.freeze: the collector skips it from then on; reference counting still
# frees it). Cyclic garbage among frozen objects would never be collected, so
# every FULL_COLLECTION_EVERY_FREEZES-th time everything is unfrozen and
# collected once first: one such pause per 6.4 million changes at the default
# checkpoint interval.
#
# Between freezes the collector runs by allocations: the youngest generation every
# YOUNG_COLLECTION_ALLOCATIONS container objects, the oldest after a hundred of those.
# Python's default (700) made a pass over every unfrozen object, the index entries
# and history rows of the changes since the last checkpoint among them, every
# 70,000 allocations: a few hundred saves. At 10,000, 4 KiB saves at 64 clients took
# 3-6% less of the daemon's CPU in alternating runs (bench/cpu.py); a young pass looks
# at no more than those 10,000 objects.
from __future__ import annotations

import gc

FULL_COLLECTION_EVERY_FREEZES = 64
YOUNG_COLLECTION_ALLOCATIONS = 10_000
OLDER_COLLECTION_EVERY_YOUNGER = 10  # Python's own: generation 1 and 2 each after ten


class Collector:
    def __init__(self) -> None:
        self.freezes = 0
        gc.set_threshold(
            YOUNG_COLLECTION_ALLOCATIONS,
            OLDER_COLLECTION_EVERY_YOUNGER,
            OLDER_COLLECTION_EVERY_YOUNGER,
        )

    def settle(self) -> None:
        """After recovery and after each index checkpoint."""
        self.freezes += 1
        if self.freezes % FULL_COLLECTION_EVERY_FREEZES == 0:
            gc.unfreeze()
            gc.collect()
        gc.freeze()
