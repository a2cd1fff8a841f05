# checkpoint_rank: documents ranked by the cosine similarity of their stored
# float32 vectors to a query. The scorer against a plain-Python cosine
# (hypothesis), and the op through a real daemon on both engines: across pages
# of documents, a document's best vector, documents without a usable vector
# left out, ties by key, expired documents gone, and hostile arguments refused.
from __future__ import annotations

import math
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.errors import SessionStoreError
from sessionstore.wire.canonical import canonical_dumps
from sessionstored.ops.rank import byte_pages
from sessionstored.ops.vectors import Scorer, document_vectors, query_values, top
from sessionstored.storage.documents import Entry

from .conftest import DaemonProcess
from .racing import race
from .wall_clock import advance_past


def _f32(vector: list[float]) -> bytes:
    return struct.pack(f"<{len(vector)}f", *vector)


def _put(key: str, vectors: list[bytes]) -> dict[str, Any]:
    return {"op": "put", "kind": "kv", "key": key, "value": {"vectors": vectors}}


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norms if norms else 0.0


def _rounded(vector: list[float]) -> list[float]:
    return list(struct.unpack(f"<{len(vector)}f", _f32(vector)))


finite = st.floats(-100, 100, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(
    data=st.integers(1, 6).flatmap(
        lambda dims: st.tuples(
            st.lists(finite, min_size=dims, max_size=dims),
            st.lists(
                st.lists(st.lists(finite, min_size=dims, max_size=dims), max_size=3),
                max_size=8,
            ),
        )
    )
)
def test_the_scorer_gives_each_document_its_best_cosine(data: Any) -> None:
    query, documents = data
    vector = query_values(_f32(query))
    assert vector is not None
    keys = [f"k{n}" for n in range(len(documents))]
    bodies = [canonical_dumps({"vectors": [_f32(v) for v in held]}) for held in documents]
    held = [document_vectors(body, "vectors", len(vector)) for body in bodies]
    got = dict((key, score) for score, key in Scorer(vector).scores(keys, held))
    expected = {
        key: max(_cosine(_rounded(query), _rounded(v)) for v in held)
        for key, held in zip(keys, documents, strict=True)
        if held
    }
    assert got.keys() == expected.keys()
    for key, score in expected.items():
        assert got[key] == pytest.approx(score, abs=1e-4)


VECTOR_DIMENSIONS = (1, 2, 6, 70)  # CBOR heads of one, two and three bytes


@st.composite
def stored_values(draw: st.DrawFn) -> tuple[Any, int]:
    """A value to store and the query's length: mostly a map whose `vectors` holds
    vectors of that length among other items, sometimes anything at all."""
    dims = draw(st.sampled_from(VECTOR_DIMENSIONS))
    leaf = st.one_of(
        st.binary(min_size=4 * dims, max_size=4 * dims),
        st.binary(max_size=4 * dims + 4),
        st.integers(-5, 5),
        st.text(max_size=3),
        st.none(),
    )
    value = st.recursive(
        leaf,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.sampled_from(["v", "vectors", ""]), inner, max_size=3)
        ),
        max_leaves=12,
    )
    others = st.dictionaries(st.sampled_from(["a", "vector", "x" * 30]), value, max_size=3)
    held = st.lists(st.one_of(leaf, value), max_size=6)
    shaped = st.builds(lambda rest, vectors: {**rest, "vectors": vectors}, others, held)
    return draw(st.one_of(shaped, value)), dims


@settings(max_examples=300, deadline=None)
@given(stored=stored_values())
def test_vectors_are_found_in_the_stored_bytes_as_decoding_finds_them(
    stored: tuple[Any, int],
) -> None:
    """The vectors read in place in a stored value's bytes are those a decoder finds."""
    value, dims = stored
    body = canonical_dumps(value)
    decoded = cbor2.loads(body)
    field = decoded.get("vectors") if isinstance(decoded, dict) else None
    width = dims * 4
    held = field if isinstance(field, list) else []
    expected = [v for v in held if isinstance(v, bytes) and len(v) == width]
    data, offsets = document_vectors(body, "vectors", dims)
    assert [bytes(data[at : at + width]) for at in offsets] == expected


def test_vectors_in_a_value_of_indefinite_lengths_are_found_by_decoding_it() -> None:
    vector = _f32([1.5])
    body = b"\xa1\x67vectors\x9f\x44" + vector + b"\x01\xff"  # {"vectors": [_ vector, 1]}
    data, offsets = document_vectors(body, "vectors", 1)
    assert [bytes(data[at : at + 4]) for at in offsets] == [vector]


@settings(max_examples=200, deadline=None)
@given(
    documents=st.lists(
        st.lists(st.lists(finite, min_size=2, max_size=2), max_size=40), max_size=30
    ),
    query=st.lists(finite, min_size=2, max_size=2),
    page_bytes=st.integers(1, 400),
    limit=st.integers(1, 12),
)
def test_ranking_page_by_page_keeps_what_ranking_at_once_finds(
    documents: list[list[list[float]]], query: list[float], page_bytes: int, limit: int
) -> None:
    """Pages bounded in bytes, each scored (in blocks of rows) and cut to the best before
    the next: the same items as scoring every document at once and sorting them all."""
    vector = query_values(query)
    assert vector is not None
    bodies = {
        f"k{n:02d}": canonical_dumps({"vectors": [_f32(v) for v in held]})
        for n, held in enumerate(documents)
    }
    found = [(key, Entry(0, b"", len(body), 0, 0, 0)) for key, body in bodies.items()]
    scorer = Scorer(vector, block_bytes=3 * 2 * 4)  # blocks of 3 rows: several to a page
    best: list[tuple[float, str]] = []
    for page in byte_pages(found, page_bytes):
        assert len(page) == 1 or sum(entry.size for _, entry in page) <= page_bytes
        held = [document_vectors(bodies[key], "vectors", 2) for key, _ in page]
        best = top(best, scorer.scores([key for key, _ in page], held), limit)
    everything = Scorer(vector).scores(
        list(bodies), [document_vectors(body, "vectors", 2) for body in bodies.values()]
    )
    assert best == sorted(everything, key=lambda pair: (-pair[0], pair[1]))[:limit]


def test_ranking_through_the_daemon(running: DaemonProcess) -> None:
    with running.client() as client:
        client.txn(
            [_put(f"r/{n:05d}", [_f32([1.0, n / 25]), _f32([0.0, 1.0])]) for n in range(2500)]
        )
        client.txn(
            [
                {"op": "put", "kind": "kv", "key": "r/none", "value": {"text": "no vectors"}},
                _put("r/short", [_f32([1])]),  # not the query's length
                _put("r/nan", [_f32([math.nan, 1])]),
                _put("r/tie", [_f32([2, 0])]),
                {**_put("r/zzz", [_f32([3, 0])]), "ttl_s": 1.0},
                _put("other", [_f32([1, 0])]),
            ]
        )
        ranking = client.checkpoint_rank("kv", "r/", [1.0, 0.0], limit=3)
        assert [i["key"] for i in ranking["items"]] == ["r/00000", "r/tie", "r/zzz"]
        assert ranking["items"][0]["score"] == pytest.approx(1.0)
        assert ranking["ranked"] == 2502 and ranking["scanned"] == 2505  # not r/nan, r/short
        # each document scores its best vector: here the second of every "r/" one
        upward = client.checkpoint_rank("kv", "r/", _f32([0.0, 1.0]), limit=2500)
        assert len(upward["items"]) == 2500
        assert all(i["score"] == pytest.approx(1.0) for i in upward["items"])
        [expiring] = client.checkpoint_scan("kv", prefix="r/zzz")["items"]
        advance_past(client, expiring["expires_at_ms"])  # r/zzz expired: gone from the ranking
        again = client.checkpoint_rank("kv", "r/", [1.0, 0.0], limit=3)
        assert [i["key"] for i in again["items"]] == ["r/00000", "r/tie", "r/00001"]
        assert client.checkpoint_rank("kv", "absent/", [1.0])["items"] == []
        for bad in ([], [1, math.nan], "x", [True], b"abc", None, [1.0] * 65_537):
            with pytest.raises(SessionStoreError) as refused:
                client.checkpoint_rank("kv", "r/", bad)
            assert refused.value.code == "bad_request"
        for limit in (0, 10_001, "5"):
            with pytest.raises(SessionStoreError) as refused:
                client.checkpoint_rank("kv", "r/", [1.0, 0.0], limit=limit)
            assert refused.value.code == "bad_request"
        client.ping()  # the daemon serves on


def test_a_daemon_where_numpy_cannot_load_serves_without_checkpoint_rank(
    short_tmp: Path,
) -> None:
    """numpy cannot load on a CPU below its baseline (qemu's default model): the daemon
    starts and serves anyway, never loading it itself before a child process has; only
    checkpoint_rank is refused, saying why, and hello then says vector_rank: false. A
    numpy package that raises as that one does stands in for the CPU, first on the
    daemon's path."""
    fake = short_tmp / "fake-numpy" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        'raise RuntimeError("NumPy was built with baseline optimizations this CPU lacks")\n'
    )
    daemon = DaemonProcess(short_tmp / "d")
    daemon.workdir.mkdir()
    path = os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])
    daemon.start(env={"PYTHONPATH": path})
    try:
        with daemon.client() as client:
            assert client.hello()["capabilities"]["vector_rank"] is True  # installed
            with pytest.raises(SessionStoreError) as refused:
                client.checkpoint_rank("kv", "", [1.0])
            assert refused.value.code == "unknown_op"
            assert "numpy" in str(refused.value) and "baseline" in str(refused.value)
            assert client.hello()["capabilities"]["vector_rank"] is False  # and now known
            client.checkpoint_put("kv", "k", {"v": 1})  # everything else serves on
            assert client.checkpoint_get("kv", "k") == {"v": 1}
    finally:
        daemon.stop()


@pytest.mark.parametrize("prefix", [False, 0, [], {}, b""], ids=repr)
def test_a_prefix_that_is_not_text_is_refused(running: DaemonProcess, prefix: Any) -> None:
    with running.client() as client:
        client.checkpoint_put("kv", "p/a", {"vectors": [_f32([1.0, 0.0])]})
        with pytest.raises(SessionStoreError) as refused:
            client.checkpoint_rank("kv", prefix, [1.0, 0.0])
        assert refused.value.code == "bad_request"
        assert [i["key"] for i in client.checkpoint_rank("kv", "p/", [1.0, 0.0])["items"]] == [
            "p/a"
        ]


MEMORY_DOCUMENTS = 16
MEMORY_VECTORS_PER_DOCUMENT = 512
MEMORY_DIMENSIONS = 1024  # 4 KiB a vector, 2 MiB a document, 32 MiB in all
MEMORY_CONCURRENT_RANKS = 8
# well above the pages two rankings hold at once, their copies and the allocator's
# slack; far below one copy of the vectors per ranking (8 x 32 MiB)
MEMORY_GROWTH_LIMIT_BYTES = 96 * 1024 * 1024


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


def test_concurrent_rankings_of_large_vectors_stay_within_a_memory_bound(
    running: DaemonProcess,
) -> None:
    """Several rankings at once over 32 MiB of vectors: the daemon's peak memory grows by
    a bounded amount (pages bounded in bytes, shared by all rankings), not by the
    vectors' size times the rankings."""
    assert running.proc is not None
    base = _f32([math.sin(n) for n in range(MEMORY_DIMENSIONS)])
    width = len(base)
    with running.client() as client:
        for n in range(MEMORY_DOCUMENTS):
            vectors = [
                base[(n + k) * 4 % width :] + base[: (n + k) * 4 % width]
                for k in range(MEMORY_VECTORS_PER_DOCUMENT)
            ]
            client.checkpoint_put("kv", f"big/{n:02d}", {"vectors": vectors})
        client.checkpoint_put("kv", "warm/0", {"vectors": [base]})
        client.checkpoint_rank("kv", "warm/", base)  # numpy is loaded from here on
        before = _peak_rss_bytes(running.proc.pid)
        expected = client.checkpoint_rank("kv", "big/", base, limit=5)
    assert expected["ranked"] == MEMORY_DOCUMENTS
    start = threading.Barrier(MEMORY_CONCURRENT_RANKS)

    def rank(_: int) -> Any:
        with running.client() as client:
            start.wait()
            return client.checkpoint_rank("kv", "big/", base, limit=5)

    with ThreadPoolExecutor(MEMORY_CONCURRENT_RANKS) as pool:
        rankings = list(pool.map(rank, range(MEMORY_CONCURRENT_RANKS)))
    growth = _peak_rss_bytes(running.proc.pid) - before
    assert all(ranking == expected for ranking in rankings)
    assert growth < MEMORY_GROWTH_LIMIT_BYTES, f"peak RSS grew by {growth >> 20} MiB"


def test_ranking_while_the_range_is_rewritten_and_removed_ranks_what_is_there(
    running: DaemonProcess,
) -> None:
    """A document removed between a page's scan and its read is left out of the
    ranking, never an error; one rewritten is ranked as rewritten."""
    keys = [f"q/{n:02d}" for n in range(16)]
    with running.client() as writer, running.client() as ranker:

        def rewrite_and_remove(round_: int) -> None:
            writer.txn([_put(key, [_f32([1.0, round_ % 3])]) for key in keys])
            writer.txn([{"op": "delete", "kind": "kv", "key": keys[round_ % len(keys)]}])

        rankings = race(
            rewrite_and_remove,
            lambda: ranker.checkpoint_rank("kv", "q/", [1.0, 0.0], limit=16),
            reads_wanted=200,
            rounds_wanted=30,
        )
    for ranking in rankings:
        assert {item["key"] for item in ranking["items"]} <= set(keys)
        assert len(ranking["items"]) == ranking["ranked"] <= ranking["scanned"]
