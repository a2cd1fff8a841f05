# Cosine similarity for checkpoint_rank, with numpy: a query vector against the
# vectors stored in documents' values, a document scoring its best vector (max
# pooling, as LangGraph's InMemoryStore scores an item with several). Vectors
# travel and rest as float32, little-endian, one CBOR byte string each, and are
# found where they lie in a document's stored bytes (canonical CBOR: its map and
# arrays walked by the compiled CBOR byte helper, nothing decoded).
#
# numpy is loaded when a ranking first needs it, and only after a child
# process has loaded it cleanly: on a CPU below numpy's baseline (qemu's
# default model) loading it can kill the process, so the daemon never risks
# itself on it, and never pays for it at start. Where it cannot load, only
# checkpoint_rank is missing.
from __future__ import annotations

import functools
import heapq
import importlib.util
import itertools
import math
import struct
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import cbor2

from sessionstore.wire import cbor_bytes

FLOAT32_BYTES = 4
SCORE_BLOCK_BYTES = 1024 * 1024  # float32 rows scored at once (twice that as float64)
FLOAT32_MAX = 3.4028234663852886e38
MAX_DIMENSIONS = 65_536
PROBE_TIMEOUT_S = 120  # a child loading numpy, under emulation at worst

_MAP, _ARRAY, _BYTES = 5, 4, 2  # CBOR major types

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


Vectors = tuple[bytes, list[int]]  # the bytes a document's vectors lie in, where each starts


def document_vectors(body: bytes, field: str, dims: int) -> Vectors:
    """The vectors a stored value holds at field, those of the query's length: found in
    the stored bytes, from which the scorer copies each once, rather than decoded out.
    Without the compiled CBOR byte helper, decoded: its Python twin walks a value
    slower than cbor2 decodes it."""
    width = dims * FLOAT32_BYTES
    if not cbor_bytes.compiled:
        return _decoded_vectors(body, field, width)
    try:
        return body, _vector_offsets(body, _encoded_text(field), width)
    except ValueError:  # indefinite lengths, which canonical CBOR never holds: decode it
        return _decoded_vectors(body, field, width)


@functools.lru_cache(maxsize=64)
def _encoded_text(text: str) -> bytes:
    return cbor2.dumps(text)


def _vector_offsets(body: bytes, field: bytes, width: int) -> list[int]:
    if not body or body[0] >> 5 != _MAP:
        return []
    fields = cbor_bytes.entries(body, 0, len(body))
    held = None
    for key in range(0, len(fields) - 1, 2):
        if fields[key + 1] - fields[key] == len(field) and body.startswith(field, fields[key]):
            held = key + 1  # the last of equal keys, as a decoder keeps
    if held is None or body[fields[held]] >> 5 != _ARRAY:
        return []
    items = cbor_bytes.entries(body, fields[held], fields[held + 1])
    offsets = []
    for start, end in itertools.pairwise(items):
        major, info = body[start] >> 5, body[start] & 0x1F
        if major == _BYTES and info < 28:
            data = start + 1 + (0 if info < 24 else 1 << (info - 24))  # past the head
            if end - data == width:
                offsets.append(data)
    return offsets


def _decoded_vectors(body: bytes, field: str, width: int) -> Vectors:
    value = cbor2.loads(body)
    held = value.get(field) if isinstance(value, dict) else None
    if not isinstance(held, list):
        return b"", []
    vectors = [v for v in held if isinstance(v, bytes) and len(v) == width]
    return b"".join(vectors), list(range(0, len(vectors) * width, width))


class Scorer:
    """Scores pages of documents against one query. Each vector is copied from where it
    lies in its document's bytes into a block of float32 rows, and the block is scored
    whenever it fills: the arithmetic in float64 (no overflow or underflow of a float32
    square), converted a block at a time, never a whole page. The block lives while a
    page is scored, no longer: a ranking waiting for its next page holds none."""

    def __init__(self, query: Sequence[float], block_bytes: int = SCORE_BLOCK_BYTES) -> None:
        import numpy as np

        self.query = np.asarray(query, dtype=np.float32).astype(np.float64)  # as stored
        self.query_norm = float(np.linalg.norm(self.query))
        self.width = len(query) * FLOAT32_BYTES
        self.block_rows = max(1, block_bytes // self.width)

    def scores(self, keys: Sequence[str], documents: Sequence[Vectors]) -> list[tuple[float, str]]:
        """(score, key) of each document with a vector: its best cosine similarity to
        the query (0 where a norm is 0; none where a stored vector is not finite)."""
        import numpy as np

        width = self.width
        count = min(self.block_rows, sum(len(offsets) for _, offsets in documents))
        block = bytearray(count * width)
        rows = memoryview(block)
        matrix = np.frombuffer(block, dtype="<f4").reshape(count, len(self.query))
        best: dict[int, float] = {}
        owners: list[int] = []  # the document of each row of the block

        def score_block() -> None:
            filled = matrix[: len(owners)]
            norms = np.sqrt(np.einsum("ij,ij->i", filled, filled, dtype=np.float64))
            norms *= self.query_norm
            dots = filled @ self.query
            similarity = np.divide(dots, norms, out=np.zeros_like(dots), where=norms != 0)
            for owner, score in zip(owners, similarity.tolist(), strict=True):
                if math.isfinite(score) and (owner not in best or score > best[owner]):
                    best[owner] = score
            owners.clear()

        for owner, (data, offsets) in enumerate(documents):
            stored = memoryview(data)
            for at in offsets:
                row = len(owners) * width
                rows[row : row + width] = stored[at : at + width]
                owners.append(owner)
                if len(owners) == count:
                    score_block()
        if owners:
            score_block()
        return [(score, keys[n]) for n, score in best.items()]


def top(
    found: list[tuple[float, str]], more: list[tuple[float, str]], count: int
) -> list[tuple[float, str]]:
    """The count best of both: highest score first, then the smaller key."""
    return heapq.nsmallest(count, found + more, key=lambda pair: (-pair[0], pair[1]))
