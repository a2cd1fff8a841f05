# The batch's arrays, encoded by the daemon in PostgreSQL's binary format, read by a
# real PostgreSQL as the same arrays that psycopg's own list adaptation sends.
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionstored.storage.postgres.binary_arrays import (
    PgArray,
    bools,
    byteas,
    int4s,
    int8s,
    texts,
)

from .postgres_server import PostgresServer

INT8 = st.integers(-(2**63), 2**63 - 1)
INT4 = st.integers(-(2**31), 2**31 - 1)
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
CASES: list[tuple[str, Callable[[Any], PgArray], st.SearchStrategy[Any]]] = [
    ("bigint", int8s, INT8),
    ("int", int4s, INT4),
    ("boolean", bools, st.booleans()),
    ("bytea", byteas, st.binary(max_size=300) | st.none()),
    ("text", texts, TEXT),
]


@pytest.fixture(scope="module")
def conn(postgres: PostgresServer) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(postgres.url(postgres.create_database()), autocommit=True) as opened:
        yield opened


@pytest.mark.parametrize(("sql_type", "encode", "elements"), CASES, ids=[c[0] for c in CASES])
def test_an_encoded_array_is_the_list_psycopg_would_send(
    conn: psycopg.Connection[Any],
    sql_type: str,
    encode: Callable[[Any], PgArray],
    elements: st.SearchStrategy[Any],
) -> None:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(elements, max_size=12))
    def check(values: list[Any]) -> None:
        row = conn.execute(
            f"SELECT %b::{sql_type}[], %b::{sql_type}[] IS NOT DISTINCT FROM %b::{sql_type}[],"
            f" cardinality(%b::{sql_type}[])",
            (encode(values), encode(values), values, encode(values)),
        ).fetchone()
        assert row is not None
        read_back, same, count = row
        assert [bytes(v) if isinstance(v, memoryview) else v for v in read_back] == values
        assert same is True
        assert count == len(values)

    check()


def test_unnest_pairs_the_encoded_arrays_element_by_element(
    conn: psycopg.Connection[Any],
) -> None:
    rows = conn.execute(
        "SELECT * FROM unnest(%b::text[], %b::bytea[], %b::bigint[], %b::int[], %b::boolean[])",
        (
            texts(["s", "k"]),
            byteas([b"\x00key", None]),
            int8s([2**40, -1]),
            int4s([4096, 0]),
            bools([True, False]),
        ),
    ).fetchall()
    assert [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in rows] == [
        ("s", b"\x00key", 2**40, 4096, True),
        ("k", None, -1, 0, False),
    ]
