# checkpoint_rank: documents ranked by the cosine similarity of their stored
# float32 vectors to a query. The scorer against a plain-Python cosine
# (hypothesis), and the op through a real daemon on both engines: across pages
# of documents, a document's best vector, documents without a usable vector
# left out, ties by key, expired documents gone, and hostile arguments refused.
from __future__ import annotations

import math
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.errors import SessionStoreError
from sessionstored.ops.vectors import Scorer, query_values

from .conftest import DaemonProcess


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
    got = dict((key, score) for score, key in Scorer(vector).scores(
        keys, [[_f32(v) for v in held] for held in documents]
    ))  # fmt: skip
    expected = {
        key: max(_cosine(_rounded(query), _rounded(v)) for v in held)
        for key, held in zip(keys, documents, strict=True)
        if held
    }
    assert got.keys() == expected.keys()
    for key, score in expected.items():
        assert got[key] == pytest.approx(score, abs=1e-4)


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
        time.sleep(1.1)  # r/zzz expired: gone from the ranking
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
