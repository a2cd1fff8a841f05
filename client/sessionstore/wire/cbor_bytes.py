# The CBOR byte helper the process uses: the compiled one (sessionstore.wire._cbor_bytes,
# built from cbor_core.c when a C compiler was present at install) or its twin in
# Python (cbor_bytes_python.py). SESSIONSTORE_CBOR_HELPER=python chooses the twin
# even where the compiled one exists, so that both paths can be measured and
# tested on one machine. IMPLEMENTATION names the one in use ("compiled" or
# "python"); `hello` and `stats` report it.
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from . import cbor_bytes_python as twin
from .cbor_bytes_python import (
    CANONICAL,
    ERROR,
    INCOMPLETE,
    MAX_DEPTH_ACCEPTED,
    OTHER,
    VALID,
    Verdict,
)

ENVIRONMENT_VARIABLE = "SESSIONSTORE_CBOR_HELPER"

__all__ = [
    "CANONICAL",
    "ERROR",
    "IMPLEMENTATION",
    "INCOMPLETE",
    "MAX_DEPTH_ACCEPTED",
    "OTHER",
    "VALID",
    "Verdict",
    "Walker",
    "canonicalise",
    "compiled",
    "entries",
    "snapshot_outline",
    "walk",
]


def _compiled_module() -> Any:
    try:
        from . import _cbor_bytes  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _cbor_bytes


def _choose() -> tuple[str, Any]:
    wanted = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if wanted not in ("", "compiled", "python"):
        raise RuntimeError(f"{ENVIRONMENT_VARIABLE} must be 'compiled' or 'python', not {wanted!r}")
    module = None if wanted == "python" else _compiled_module()
    if module is None and wanted == "compiled":
        raise RuntimeError(f"{ENVIRONMENT_VARIABLE}=compiled, but the compiled helper is not built")
    return ("compiled", module) if module is not None else ("python", twin)


IMPLEMENTATION, _module = _choose()
compiled = IMPLEMENTATION == "compiled"
walk: Callable[[bytes | bytearray, int, int, int, int], Verdict] = _module.walk
canonicalise: Callable[[bytes | bytearray, int, int, int], bytes | None] = _module.canonicalise
entries: Callable[..., tuple[int, ...]] = _module.entries  # (data, start[, end])
Walker: Callable[[int, int, int, int], Any] = _module.Walker
snapshot_outline: Callable[[bytes | bytearray], tuple[int, int] | None] = _module.snapshot_outline
