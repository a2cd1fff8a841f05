# Cosine similarity for checkpoint_rank, with numpy: a query vector against the
# vectors stored in documents' values, a document scoring its best vector (max
# pooling, as LangGraph's InMemoryStore scores an item with several). Vectors
# travel and rest as float32, little-endian, one CBOR byte string each.
#
# numpy is imported when a ranking first needs it, not when the daemon starts:
# a machine where it cannot load (a CPU below its baseline, as under qemu's
# default model) still runs the daemon, and only checkpoint_rank is missing.
from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import cbor2

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Vector = npt.NDArray[np.float32]

FLOAT32_BYTES = 4
MAX_DIMENSIONS = 65_536


@functools.cache
def numpy_problem() -> str | None:
    """Why numpy cannot be used here, or None when it can."""
    try:
        import numpy  # noqa: F401
    except Exception as error:  # ImportError, or RuntimeError for a CPU below its baseline
        return f"{type(error).__name__}: {error}"
    return None


def query_vector(value: Any) -> Vector | None:
    """The query as float32, from a byte string or an array of numbers; None when it is
    neither, or empty, or too long, or holds something that is not a finite number."""
    import numpy as np

    if isinstance(value, bytes | bytearray):
        if not value or len(value) % FLOAT32_BYTES or len(value) > MAX_DIMENSIONS * FLOAT32_BYTES:
            return None
        vector = np.frombuffer(value, dtype="<f4").astype(np.float32)
    elif isinstance(value, list) and 0 < len(value) <= MAX_DIMENSIONS:
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in value):
            return None
        vector = np.asarray(value, dtype=np.float32)
    else:
        return None
    return vector if bool(np.isfinite(vector).all()) else None


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

    def __init__(self, query: Vector) -> None:
        import numpy as np

        self.query = query.astype(np.float64)  # float64 arithmetic: no underflow
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
