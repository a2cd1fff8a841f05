# Test-only failpoints of the wire contract: SESSIONSTORED_FAILPOINTS="name=action[@N],...".
# The storage engine calls hit(name) at each named point of the commit path;
# without the variable, hit() is a no-op.
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

from .storage.errors import InjectedFault

log = logging.getLogger("sessionstored.failpoints")

POINTS = (
    "before-intent",
    "after-intent",
    "before-rename",
    "after-rename",
    "before-commit-record",
    "after-commit-record",
)
ACTIONS = ("crash", "error", "hang", "slow")
SLOW_FAILPOINT_S = 0.020  # `slow`: a disk whose every commit takes this much longer


@dataclass(frozen=True)
class FailpointSpec:
    point: str
    action: str
    nth: int


def parse_failpoints(text: str) -> tuple[FailpointSpec, ...]:
    specs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        point, sep, rest = item.partition("=")
        if not sep:
            raise ValueError(f"{item!r}: expected name=action[@N]")
        action, _, count = rest.partition("@")
        if point not in POINTS:
            raise ValueError(f"unknown failpoint {point!r} (known: {', '.join(POINTS)})")
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r} (known: {', '.join(ACTIONS)})")
        try:
            nth = int(count) if count else 1
        except ValueError as error:
            raise ValueError(f"{item!r}: N must be a whole number") from error
        if nth < 1:
            raise ValueError(f"{item!r}: N must be at least 1")
        specs.append(FailpointSpec(point, action, nth))
    return tuple(specs)


class Failpoints:
    def __init__(self, specs: tuple[FailpointSpec, ...]) -> None:
        self._specs = {spec.point: spec for spec in specs}
        self._passes = dict.fromkeys(self._specs, 0)

    def hit(self, point: str) -> None:
        spec = self._specs.get(point)
        if spec is None:
            return
        self._passes[point] += 1
        if spec.action == "slow":  # every pass from the N-th on
            if self._passes[point] >= spec.nth:
                time.sleep(SLOW_FAILPOINT_S)
            return
        if self._passes[point] != spec.nth:
            return
        if spec.action == "crash":
            os.kill(os.getpid(), signal.SIGKILL)  # as if killed: no cleanup, no buffers flushed
        elif spec.action == "hang":
            log.warning("failpoint %s: hanging here, as a stuck disk would", point)
            threading.Event().wait()  # a stuck disk: the writer never comes back
        else:
            raise InjectedFault(point)
