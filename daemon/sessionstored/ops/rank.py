# checkpoint_rank: the keyed documents under a prefix, ranked by the cosine
# similarity of the vectors their values hold to a query vector (semantic
# search, for LangGraph's store). Only keys and scores travel back, so a search
# does not move a namespace's vectors to the client.
#
# The keys are read a page at a time (from the index on the event loop; in a
# thread on PostgreSQL), and each page's values are read, decoded and scored in
# a worker thread, so ranking a large prefix holds the event loop for no more
# than one page of index reads at a time. A ranking reads at most
# RANK_MAX_DOCUMENTS documents; past that it is `too_large`.
from __future__ import annotations

import trio

from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import Request, ok_response
from sessionstore.wire.shared import Refusal

from ..storage.documents import Entry, KeyRange
from .args import checkpoint_kind
from .context import OpContext
from .registry import Op
from .snapshot import is_int
from .steps import Read, Response, Step
from .vectors import (
    FLOAT32_BYTES,
    MAX_DIMENSIONS,
    Scorer,
    document_vectors,
    numpy_problem,
    query_values,
    top,
)

RANK_DEFAULT_LIMIT = 10
RANK_MAX_LIMIT = 10_000
RANK_MAX_DOCUMENTS = 1_000_000
RANK_PAGE = 1000  # documents read and scored per worker-thread hop
DEFAULT_FIELD = "vectors"


def checkpoint_rank(ops: OpContext, request: Request) -> Step:
    args = request.args
    kind, _ = checkpoint_kind(args)
    prefix = args.get("prefix")
    if prefix is None:
        prefix = ""
    field = args.get("field", DEFAULT_FIELD)
    if not isinstance(prefix, str) or not isinstance(field, str):
        raise Refusal(ErrorCode.BAD_REQUEST, "prefix and field must be text")
    query = query_values(args.get("query"))
    if query is None:
        message = (
            f"query must be 1 to {MAX_DIMENSIONS} finite numbers: an array, or a byte string "
            f"of little-endian float32 ({FLOAT32_BYTES} bytes each)"
        )
        raise Refusal(ErrorCode.BAD_REQUEST, message)
    limit = args.get("limit", RANK_DEFAULT_LIMIT)
    if not is_int(limit) or not 1 <= limit <= RANK_MAX_LIMIT:
        message = f"limit must be an integer from 1 to {RANK_MAX_LIMIT}"
        raise Refusal(ErrorCode.BAD_REQUEST, message)

    scorers: list[Scorer] = []  # one, made once numpy is known to load

    def score_page(found: list[tuple[str, Entry]]) -> list[tuple[float, str]]:
        docs = ops.store.read_entries(kind, found)
        held = [document_vectors(doc.body, field, len(query)) for doc in docs]
        return scorers[0].scores([key for key, _ in found], held)

    async def read() -> Response:
        problem = await trio.to_thread.run_sync(numpy_problem)
        if problem is not None:
            message = f"checkpoint_rank needs numpy, which cannot be loaded here ({problem})"
            raise Refusal(ErrorCode.UNKNOWN_OP, message)
        scorers.append(Scorer(query))  # one page at a time, in one worker thread at a time
        best: list[tuple[float, str]] = []
        ranked = scanned = 0
        after: str | None = None
        while True:
            wanted = KeyRange(kind, prefix, after, None, RANK_PAGE, False)
            found, more = await ops.query(ops.store.scan, wanted)
            scanned += len(found)
            if scanned > RANK_MAX_DOCUMENTS:
                message = f"the prefix holds over {RANK_MAX_DOCUMENTS} documents to rank"
                raise Refusal(ErrorCode.TOO_LARGE, message)
            if found:
                entries = [entry for _, entry in found]
                page = await ops.read_off_loop(entries, score_page, found)
                ranked += len(page)
                best = top(best, page, limit)
            if not more or not found:
                break
            after = found[-1][0]
        items = [{"key": key, "score": score} for score, key in best]
        return ok_response(request, items=items, ranked=ranked, scanned=scanned)

    return Read(request, lambda: ops.guarded_read(request, read))


OPS = (
    Op(
        "checkpoint_rank",
        checkpoint_rank,
        {"kind", "prefix", "field", "query", "limit"},
        read_only=True,
    ),
)
