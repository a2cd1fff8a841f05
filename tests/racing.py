# Two clients raced against each other until both have made progress: one writes
# round after round while the other reads, with no clock involved.
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def race(
    write_round: Callable[[int], None],
    read_once: Callable[[], T],
    *,
    reads_wanted: int,
    rounds_wanted: int,
) -> list[T]:
    """write_round(1), write_round(2), ... in one thread while read_once() runs in
    another, until there are reads_wanted reads over at least rounds_wanted rounds;
    a failure on either side ends both and is raised. The reads, in order."""
    reads: list[T] = []
    rounds_done = [0]
    over = threading.Event()

    def write() -> None:
        try:
            while not over.is_set():
                write_round(rounds_done[0] + 1)
                rounds_done[0] += 1
        finally:
            over.set()

    def read() -> None:
        try:
            while not over.is_set() and (
                len(reads) < reads_wanted or rounds_done[0] < rounds_wanted
            ):
                reads.append(read_once())
        finally:
            over.set()

    with ThreadPoolExecutor(2) as sides:
        writing = sides.submit(write)
        sides.submit(read).result()
        writing.result()
    assert rounds_done[0] >= rounds_wanted and len(reads) >= reads_wanted
    return reads
