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
from __future__ import annotations

import gc

FULL_COLLECTION_EVERY_FREEZES = 64


class Collector:
    def __init__(self) -> None:
        self.freezes = 0

    def settle(self) -> None:
        """After recovery and after each index checkpoint."""
        self.freezes += 1
        if self.freezes % FULL_COLLECTION_EVERY_FREEZES == 0:
            gc.unfreeze()
            gc.collect()
        gc.freeze()
