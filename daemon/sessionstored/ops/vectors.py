# Cosine similarity for checkpoint_rank, with numpy: a query vector against the
# vectors stored in documents' values, a document scoring its best vector (max
# pooling, as LangGraph's InMemoryStore scores an item with several). Vectors
# travel and rest as float32, little-endian, one CBOR byte string each.
#
# numpy is loaded when a ranking first needs it, and only after a child
# process has loaded it cleanly: on a CPU below numpy's baseline (qemu's
# default model) loading it can kill the process, so the daemon never risks
# itself on it, and never pays for it at start. Where it cannot load, only
# checkpoint_rank is missing.
from __future__ import annotations

import heapq
import importlib.util
import math
import struct
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import cbor2

FLOAT32_BYTES = 4
FLOAT32_MAX = 3.4028234663852886e38
MAX_DIMENSIONS = 65_536
PROBE_TIMEOUT_S = 120  # a child loading numpy, under emulation at worst

_checked: dict[str, str | None] = {}  # "numpy": why it cannot be used, or None


def numpy_installed_and_not_refused() -> bool:
    """For hello: numpy is installed, and no probe found it unusable (yet)."""
    return importlib.util.find_spec("numpy") is not None and _checked.get("numpy") is None


def numpy_problem() -> str | None:
    """Why numpy cannot be used here, or None when it can (then it is loaded). Blocking:
    call it in a thread. A child loads it first."""
    if "numpy" not in _checked:
        _checked["numpy"] = _probe()
    return _checked["numpy"]


def _probe() -> str | None:
    try:
        child = subprocess.run(
            [sys.executable, "-c", "import numpy"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"a process loading it failed: {error}"
    if child.returncode != 0:
        lines = child.stderr.strip().splitlines()
        return lines[-1] if lines else f"a process loading it ended with {child.returncode}"
    try:
        import numpy  # noqa: F401
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def query_values(value: Any) -> list[float] | None:
    """The query's numbers, from a byte string of float32 or an array of numbers; None
    when it is neither, or empty, or too long, or holds something that is not a finite
    float32."""
    if isinstance(value, bytes | bytearray):
        if not value or len(value) % FLOAT32_BYTES or len(value) > MAX_DIMENSIONS * FLOAT32_BYTES:
            return None
        numbers = list(struct.unpack(f"<{len(value) // FLOAT32_BYTES}f", value))
    elif isinstance(value, list) and 0 < len(value) <= MAX_DIMENSIONS:
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in value):
            return None
        numbers = [float(x) for x in value]
    else:
        return None
    return numbers if all(math.isfinite(x) and abs(x) <= FLOAT32_MAX for x in numbers) else None


def document_vectors(body: bytes, field: str, dims: int) -> list[bytes]:
    """The vectors a stored value holds at field: those of the query's length."""
    value = cbor2.loads(body)
    held = value.get(field) if isinstance(value, dict) else None
    if not isinstance(held, list):
        return []
    width = dims * FLOAT32_BYTES
    return [v for v in held if isinstance(v, bytes) and len(v) == width]


class Scorer:
    """Scores pages of documents against one query, into one buffer it keeps: a fresh
    multi-megabyte array per page costs more in page faults than the arithmetic."""

    def __init__(self, query: Sequence[float]) -> None:
        import numpy as np

        # as stored (float32), then float64 arithmetic: no underflow
        self.query = np.asarray(query, dtype=np.float32).astype(np.float64)
        self.query_norm = float(np.linalg.norm(self.query))
        self.width = len(query) * FLOAT32_BYTES
        self.buffer = bytearray()

    def scores(
        self, keys: Sequence[str], vectors: Sequence[list[bytes]]
    ) -> list[tuple[float, str]]:
        """(score, key) of each document with a vector: its best cosine similarity to
        the query (0 where a norm is 0; none where a stored vector is not finite)."""
        import numpy as np

        owners = [n for n, held in enumerate(vectors) for _ in held]
        if not owners:
            return []
        size = len(owners) * self.width
        if size > len(self.buffer):
            self.buffer = bytearray(size)
        rows = memoryview(self.buffer)
        for row, vector in enumerate(v for held in vectors for v in held):
            rows[row * self.width : (row + 1) * self.width] = vector
        matrix = np.frombuffer(self.buffer, dtype="<f4", count=size // FLOAT32_BYTES)
        matrix = matrix.reshape(len(owners), len(self.query))
        norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix, dtype=np.float64)) * self.query_norm
        dots = matrix @ self.query
        similarity = np.divide(dots, norms, out=np.zeros_like(dots), where=norms != 0)
        best: dict[int, float] = {}
        for owner, score in zip(owners, similarity.tolist(), strict=True):
            if not math.isfinite(score):
                continue
            if owner not in best or score > best[owner]:
                best[owner] = score
        return [(score, keys[n]) for n, score in best.items()]


def top(
    found: list[tuple[float, str]], more: list[tuple[float, str]], count: int
) -> list[tuple[float, str]]:
    """The count best of both: highest score first, then the smaller key."""
    return heapq.nsmallest(count, found + more, key=lambda pair: (-pair[0], pair[1]))
