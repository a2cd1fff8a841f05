# The collector policy: what exists at a checkpoint is frozen, and cyclic garbage
# among frozen objects is still collected at every 64th freeze.
from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from sessionstored.writer.collector import FULL_COLLECTION_EVERY_FREEZES, Collector


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture(autouse=True)
def _unfrozen_after() -> Iterator[None]:
    yield
    gc.unfreeze()


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
