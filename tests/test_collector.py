# The collector policy: what exists at a checkpoint is frozen, and cyclic garbage
# among frozen objects is still collected at every 64th freeze.
from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from sessionstored.writer.collector import (
    FULL_COLLECTION_EVERY_FREEZES,
    YOUNG_COLLECTION_ALLOCATIONS,
    Collector,
)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture(autouse=True)
def _unfrozen_after() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_cyclic_garbage_between_freezes_goes_by_allocations_alone() -> None:
    Collector()
    gc.collect()  # start from an empty youngest generation
    node = _Node()
    alive = weakref.ref(node)
    del node
    kept = [[] for _ in range(YOUNG_COLLECTION_ALLOCATIONS // 2)]
    assert alive() is not None  # not yet: fewer allocations than the threshold
    kept += [[] for _ in range(YOUNG_COLLECTION_ALLOCATIONS)]
    assert alive() is None


def test_frozen_cyclic_garbage_waits_for_the_periodic_full_collection() -> None:
    collector = Collector()
    node = _Node()
    alive = weakref.ref(node)
    collector.settle()
    assert gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert alive() is not None, "frozen: the collector no longer looks at it"
    for _ in range(FULL_COLLECTION_EVERY_FREEZES - 2):
        collector.settle()
        assert alive() is not None
    collector.settle()  # the 64th
    assert alive() is None
