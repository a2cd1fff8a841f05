# Each op declared once: its name, its handler, the arguments it reads, and
# whether a read-only peer may use it.
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sessionstore.protocol import Request

from ..steps import Step

if TYPE_CHECKING:
    from . import Ops


@dataclass(frozen=True)
class Op:
    name: str
    handle: Callable[[Ops, Request], Step]
    arguments: set[str] = field(default_factory=set)
    read_only: bool = False
