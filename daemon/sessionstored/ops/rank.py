# checkpoint_rank: the keyed documents under a prefix, ranked by the cosine
# similarity of the vectors their values hold to a query vector (semantic
# search, for LangGraph's store). Only keys and scores travel back, so a search
# does not move a namespace's vectors to the client.
#
# The keys are read RANK_SCAN_KEYS at a time (from the index on the event loop;
# in a thread on PostgreSQL), so ranking a large prefix holds the event loop for
# no more than one scan at a time. Their values are read and scored in worker
# threads a page at a time, a page being at most RANK_PAGE_BYTES of stored
# documents (or one larger document, no larger than the largest snapshot the
# daemon stores), and only the `limit` best are kept from one page to the next.
# Memory is bounded across all rankings at once, not per ranking: at most
# RANK_CONCURRENT_PAGES pages are held in the process, the others waiting their
# turn in order. A ranking reads at most RANK_MAX_DOCUMENTS documents; past that
# it is `too_large`.
from __future__ import annotations

from collections.abc import Iterator, Sequence

import trio

from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import Request, ok_response
from sessionstore.wire.shared import Refusal

from ..storage.documents import Entry, KeyRange
from .args import checkpoint_kind, prefix_arg
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
RANK_SCAN_KEYS = 1000  # keys read from the index at a time
RANK_PAGE_BYTES = 4 * 1024 * 1024  # stored documents read and scored per worker-thread hop
# pages held at once in the process, by all rankings: scoring is CPU work, so more at
# once would hold more memory without ranking faster
RANK_CONCURRENT_PAGES = 2
DEFAULT_FIELD = "vectors"

_pages_in_memory: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("rank_pages")


def pages_in_memory() -> trio.CapacityLimiter:
    """The process's turns to hold a page: the one limiter every ranking shares."""
    try:
        return _pages_in_memory.get()
    except LookupError:
        limiter = trio.CapacityLimiter(RANK_CONCURRENT_PAGES)
        _pages_in_memory.set(limiter)
        return limiter


def byte_pages(
    found: Sequence[tuple[str, Entry]], page_bytes: int
) -> Iterator[list[tuple[str, Entry]]]:
    """The documents in order, in pages of at most page_bytes of stored bodies (a larger
    document alone in its own)."""
    page: list[tuple[str, Entry]] = []
    size = 0
    for key, entry in found:
        if page and size + entry.size > page_bytes:
            yield page
            page, size = [], 0
        page.append((key, entry))
        size += entry.size
    if page:
        yield page


def checkpoint_rank(ops: OpContext, request: Request) -> Step:
    args = request.args
    kind, _ = checkpoint_kind(args)
    prefix = prefix_arg(args)
    field = args.get("field", DEFAULT_FIELD)
    if not isinstance(field, str):
        raise Refusal(ErrorCode.BAD_REQUEST, "field must be text")
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

    def score_page(page: list[tuple[str, Entry]]) -> list[tuple[float, str]]:
        docs = [doc for doc in ops.store.reads.read_entries(kind, page) if doc is not None]
        held = [document_vectors(doc.body, field, len(query)) for doc in docs]
        return scorers[0].scores([doc.id for doc in docs], held)

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
            wanted = KeyRange(kind, prefix, after, None, RANK_SCAN_KEYS, False)
            found, more = await ops.query(ops.store.reads.scan, wanted)
            scanned += len(found)
            if scanned > RANK_MAX_DOCUMENTS:
                message = f"the prefix holds over {RANK_MAX_DOCUMENTS} documents to rank"
                raise Refusal(ErrorCode.TOO_LARGE, message)
            for page in byte_pages(found, RANK_PAGE_BYTES):
                entries = [entry for _, entry in page]
                async with pages_in_memory():
                    scored = await ops.read_off_loop(entries, score_page, page)
                ranked += len(scored)
                best = top(best, scored, limit)
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
