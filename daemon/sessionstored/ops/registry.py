# Each op declared once: its name, its handler, the arguments it reads, which of
# them are documents the rules may read as bytes (byte_path.py), and whether a
# read-only peer may use it.
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sessionstore.wire.protocol import Request

from .context import OpContext
from .prepare import Preparer
from .steps import Step


@dataclass(frozen=True)
class Op:
    name: str
    handle: Callable[[OpContext, Request], Step]
    arguments: set[str] = field(default_factory=set)
    read_only: bool = False
    documents: frozenset[str] = frozenset()  # arriving as CanonicalItem where the helper runs
    prepare: Preparer | None = None  # the heavy part of its arguments (prepare.py)
    writes_with: frozenset[str] = frozenset()  # arguments that make a read op write
