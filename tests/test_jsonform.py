# JSON lines can carry every stored value: the JSON form of a value reads back as
# the same value, so the same canonical bytes and digest, in process and through
# a real daemon.
from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionstore.wire import jsonform
from sessionstore.wire.canonical import canonical_dumps, snapshot_digest
from sessionstore.wire.protocol import Mode

from .cbor_reference import encode as reference_encode
from .conftest import DaemonProcess
from .test_canonical import values
from .wire_helpers import exchange


@given(values)
def test_the_json_form_reads_back_as_the_same_value(value: Any) -> None:
    text = jsonform.dumps(value)
    back = jsonform.from_json_value(jsonform.loads(text))
    assert canonical_dumps(back) == reference_encode(value)


@given(values)
def test_a_json_line_is_one_line_for_splitlines_and_reads_back(value: Any) -> None:
    line = jsonform.json_line(jsonform.to_json_value(value))
    assert len(line.splitlines()) == 1
    back = jsonform.from_json_value(jsonform.loads(line))
    assert canonical_dumps(back) == reference_encode(value)


@given(st.text(alphabet=st.sampled_from("a\u2028\u2029\x85\x0b\x0c\x1c\x1d\x1e\r\n\u00e9")))
def test_every_line_end_is_escaped_and_other_text_stays_raw(text: str) -> None:
    line = jsonform.json_line({text: [text]})
    assert line.splitlines() == [line] and json.loads(line) == {text: [text]}
    assert "\\u00e9" not in line  # UTF-8 text is kept as it is


def test_wrappers_and_look_alikes_stay_apart() -> None:
    assert jsonform.to_json_value(b"\x00") == {"$bytes": "AA=="}
    assert jsonform.to_json_value({"$bytes": "AA=="}) == {"$map": [["$bytes", "AA=="]]}
    assert jsonform.to_json_value(math.inf) == {"$float": "Infinity"}
    assert jsonform.to_json_value({1: "a"}) == {"$map": [[1, "a"]]}
    for value in (b"\x00", {"$bytes": "AA=="}, {"$float": "NaN"}, {"$map": []}, {(1, 2): 3}):
        assert jsonform.from_json_value(jsonform.to_json_value(value)) == value


@pytest.mark.parametrize(
    "line",
    [
        '{"x": NaN}',
        '{"x": Infinity}',
        '{"x": {"$float": "nan"}}',
        '{"x": {"$bytes": 5}}',
        '{"x": {"$map": [[1]]}}',
        '{"x": {"$map": [[1, 2], [1, 3]]}}',
        '{"x": 1e400}',
        '{"x": -1e400}',
        '{"x": 18446744073709551616}',
        '{"x": -18446744073709551617}',
        '{"x": ' + "7" * 5000 + "}",
    ],
)
def test_bad_json_forms_are_refused(line: str) -> None:
    with pytest.raises(ValueError):
        jsonform.from_json_value(jsonform.loads(line))


def test_every_stored_value_loads_over_json_and_saves_back_with_the_same_digest(
    running: DaemonProcess,
) -> None:
    snap = {
        "schema_version": 1,
        "session": {"id": "odd", "weights": [math.nan, math.inf, -math.inf, -0.0, 1.5]},
        "blob": b"\x00\xff",
        "lookalike": {"$bytes": "AA=="},
        "by_number": {1: "one", -2: "minus two", b"k": "bytes key", (1, 2): "array key"},
    }
    with running.client() as client:
        saved = client.save(snap)
    [loaded] = exchange(running.socket_path, [{"op": "load", "session_id": "odd"}], Mode.JSON)
    assert loaded["ok"] and loaded["digest"] == saved["digest"] == snapshot_digest(snap)
    as_json = json.loads(jsonform.dumps(loaded["snapshot"]))
    assert as_json["lookalike"] == {"$map": [["$bytes", "AA=="]]}
    assert as_json["session"]["weights"][0] == {"$float": "NaN"}
    [again] = exchange(
        running.socket_path, [{"op": "save", "snapshot": loaded["snapshot"]}], Mode.JSON
    )
    assert again["ok"] and again["digest"] == saved["digest"]
