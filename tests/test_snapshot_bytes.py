# The rules read on bytes (a CanonicalItem: only the parts the rules read are
# decoded) against the same rules on the decoded value: the same verdict, the
# same message, for snapshots and checkpoint documents valid and not; the compiled
# fast path for the usual snapshot never takes one the rules refuse.
from __future__ import annotations

from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionstore.wire import cbor_bytes, cbor_bytes_python
from sessionstore.wire.canonical import canonical_dumps
from sessionstore.wire.shared import CanonicalItem, Refusal
from sessionstored.ops.document_arguments import document_body, prepared_txn
from sessionstored.ops.snapshot import (
    UPDATABLE,
    forked,
    forked_bytes,
    validate_snapshot,
    validate_snapshot_bytes,
    with_component,
    with_component_bytes,
)

anything = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(), st.text(max_size=4)),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)
ids = st.one_of(st.sampled_from(["s", "", "a\x00b", "x" * 1025, "other"]), anything)


def _maybe(strategy: Any) -> Any:
    return st.one_of(st.just(None), strategy)  # None: the key is left out


events = st.lists(
    st.one_of(st.fixed_dictionaries({"sequence": st.integers(-2, 6)}), anything), max_size=4
)
run_record = st.one_of(
    anything,
    st.fixed_dictionaries(
        {"snapshot": st.one_of(anything, st.fixed_dictionaries({}, optional={
            "id": ids, "session_id": ids, "event_count": st.one_of(st.integers(-1, 8), anything),
        }))},
        optional={"events": st.one_of(events, anything)},
    ),
)  # fmt: skip
components = {
    "artifacts": st.one_of(st.lists(anything, max_size=3), anything),
    "retained_artifact_uris": st.one_of(st.lists(st.text(max_size=3), max_size=3), anything),
    "trace_events": st.one_of(st.lists(anything, max_size=3), anything),
    "run_records": st.one_of(st.lists(run_record, max_size=3), anything),
    "verification_reports": st.one_of(st.lists(anything, max_size=2), anything),
    "subagent_tasks": st.one_of(
        st.lists(
            st.one_of(anything, st.fixed_dictionaries({"parent_session_id": ids})), max_size=3
        ),
        anything,
    ),
}
snapshots = st.fixed_dictionaries(
    {},
    optional={
        "schema_version": st.one_of(st.just(1), st.just(True), st.just(1.0), anything),
        "session": st.one_of(
            st.fixed_dictionaries({"id": ids}, optional={"messages": anything}), anything
        ),
        **components,
        "other": anything,
    },
)


def _verdict(check: Any, value: Any) -> tuple[str, Any]:
    try:
        return ("ok", check(value))
    except Refusal as error:
        return (str(error.code), str(error))


@settings(max_examples=2000)
@given(snapshots)
def test_the_snapshot_rules_say_the_same_on_bytes(snapshot: dict[str, Any]) -> None:
    data = canonical_dumps(snapshot)
    decoded = cbor2.loads(data)  # in canonical order, as the decoder path hands it out
    assert _verdict(validate_snapshot_bytes, data) == _verdict(validate_snapshot, decoded)


@settings(max_examples=500)
@given(
    st.one_of(
        st.dictionaries(st.sampled_from(["run_id", "x", "id"]), ids, max_size=3),
        st.lists(anything, max_size=2),
    ),
    st.sampled_from([None, "run_id"]),
)
def test_a_checkpoint_document_is_the_same_on_bytes(value: Any, id_field: str | None) -> None:
    def body(document: Any) -> tuple[bytes, bytes]:
        return document_body(document, id_field, "s", 1 << 20)

    data = canonical_dumps(value)
    assert _verdict(body, CanonicalItem(data)) == _verdict(body, cbor2.loads(data))


txn_ops = st.lists(
    st.one_of(
        anything,
        st.fixed_dictionaries(
            {"op": st.sampled_from(["put", "append", "delete", "other"])},
            optional={
                "kind": st.sampled_from(["loop", "kv", "workflow", "nope"]),
                "key": ids,
                "prefix": ids,
                "value": st.one_of(
                    st.dictionaries(st.sampled_from(["run_id", "v"]), ids), anything
                ),
                "if_absent": st.one_of(st.booleans(), anything),
            },
        ),
    ),
    max_size=4,
)


@settings(max_examples=1000)
@given(txn_ops)
def test_a_txn_is_read_the_same_on_bytes(ops: list[Any]) -> None:
    data = canonical_dumps(ops)
    decoded = cbor2.loads(data)

    def read(value: Any) -> Any:
        return prepared_txn({"ops": value}, 1 << 20)

    assert _verdict(read, CanonicalItem(data)) == _verdict(read, decoded)


stored = st.fixed_dictionaries(
    {"schema_version": st.just(1), "session": st.fixed_dictionaries({"id": st.just("s")}, optional={
        "config": st.one_of(anything, st.fixed_dictionaries({"workspace": anything})),
        "messages": anything,
    })},
    optional={name: strategy for name, strategy in components.items()},
).filter(lambda snapshot: _verdict(validate_snapshot, snapshot)[0] == "ok")  # fmt: skip


@settings(max_examples=1000)
@given(
    st.one_of(st.none(), stored),
    st.sampled_from([*UPDATABLE, "unknown"]),
    st.one_of(anything, components["run_records"], st.fixed_dictionaries({"id": ids})),
)
def test_update_is_the_same_on_bytes(current: Any, component: str, value: Any) -> None:
    body = canonical_dumps(current) if current is not None else None
    decoded = cbor2.loads(body) if body is not None else None
    value_bytes = canonical_dumps(value)

    def spliced(_: Any) -> bytes:
        return with_component_bytes(body, "s", component, value_bytes)

    def through_objects(_: Any) -> bytes:
        return canonical_dumps(with_component(decoded, "s", component, cbor2.loads(value_bytes)))

    assert _outcome(spliced) == _outcome(through_objects)


@settings(max_examples=500)
@given(stored, ids, anything)
def test_fork_is_the_same_on_bytes(source: Any, new_id: Any, workspace: Any) -> None:
    body = canonical_dumps(source)

    def spliced(_: Any) -> bytes:
        return forked_bytes(body, new_id, workspace)

    def through_objects(_: Any) -> bytes:
        return canonical_dumps(forked(cbor2.loads(body), new_id, workspace))

    assert _outcome(spliced) == _outcome(through_objects)


def _outcome(make: Any) -> tuple[str, Any]:
    try:
        return ("ok", make(None))
    except Refusal as error:
        return (str(error.code), str(error))
    except LookupError as error:
        return (type(error).__name__, str(error))


@settings(max_examples=2000)
@given(snapshots)
def test_the_compiled_outline_accepts_only_what_the_rules_accept(snapshot: dict[str, Any]) -> None:
    """The fast path (cbor_bytes.snapshot_outline) says where the session id is only
    for a snapshot the rules take, and then for that id; both helpers say the same."""
    data = canonical_dumps(snapshot)
    outline = cbor_bytes_python.snapshot_outline(data)
    assert cbor_bytes.snapshot_outline(data) == outline
    if outline is not None:
        assert _verdict(validate_snapshot, cbor2.loads(data)) == (
            "ok",
            data[outline[0] : outline[1]].decode(),
        )


USUAL_SNAPSHOTS = [
    {
        "schema_version": 1,
        "session": {"id": "agent/1", "config": {"model": "m", "workspace": "/w"}},
        "artifacts": [],
        "trace_events": [{"seq": n, "kind": "tool_call", "detail": "x" * 48} for n in range(60)],
        "run_records": [],
    },
    {
        "schema_version": 1,
        "session": {"id": "s", "messages": [{"role": "user", "content": "hi"}]},
        "artifacts": [{"uri": "file:///a"}],
        "retained_artifact_uris": ["file:///a"],
        "trace_events": [],
        "run_records": [
            {
                "snapshot": {"id": "r1", "session_id": "s", "event_count": 3},
                "events": [{"sequence": 0}, {"sequence": 2, "kind": "tool"}],
            },
            {"snapshot": {"id": None, "event_count": None}, "events": []},
            {"snapshot": {"id": "r2"}},
        ],
        "verification_reports": [{"ok": True}],
        "subagent_tasks": [{"parent_session_id": "s"}, {"parent_session_id": None}, {}],
        "extra": {"anything": 1},
    },
]


@pytest.mark.parametrize("snapshot", USUAL_SNAPSHOTS, ids=["bench", "every component"])
def test_the_usual_snapshot_takes_the_fast_path(snapshot: dict[str, Any]) -> None:
    data = canonical_dumps(snapshot)
    for helper in (cbor_bytes_python, cbor_bytes):
        outline = helper.snapshot_outline(data)
        assert outline is not None
        assert data[outline[0] : outline[1]].decode() == snapshot["session"]["id"]
    assert validate_snapshot_bytes(data) == snapshot["session"]["id"]


@pytest.mark.parametrize(
    "change",
    [
        {"schema_version": 2},
        {"schema_version": True},
        {"session": {"id": ""}},
        {"session": {"id": "a\x00b"}},
        {"session": {"id": "x" * 1025}},
        {"session": {"name": "no id"}},
        {"artifacts": {}},
        {"retained_artifact_uris": ["a", 1]},
        {"run_records": [{"snapshot": {"id": 7}}]},  # valid, but a run id not text: Python
        {"run_records": [{"snapshot": {"id": "r"}}, {"snapshot": {"id": "r"}}]},
        {"run_records": [{"snapshot": {"session_id": "other"}}]},
        {"run_records": [{"snapshot": {}, "events": [{"sequence": 1}, {"sequence": 1}]}]},
        {"run_records": [{"snapshot": {"event_count": 2}, "events": [{"sequence": 2}]}]},
        {"run_records": [{"snapshot": {}, "events": [{"sequence": -1}]}]},
        {"run_records": [{"snapshot": {}} for _ in range(257)]},  # valid, but many: Python
        {"subagent_tasks": [{"parent_session_id": "someone else"}]},
        {"subagent_tasks": [[]]},
    ],
)
def test_anything_else_is_left_to_the_rules(change: dict[str, Any]) -> None:
    snapshot = {**USUAL_SNAPSHOTS[1], **change}
    data = canonical_dumps(snapshot)
    assert cbor_bytes.snapshot_outline(data) is None
    assert cbor_bytes_python.snapshot_outline(data) is None
    assert _verdict(validate_snapshot_bytes, data) == _verdict(validate_snapshot, snapshot)


# Snapshots near the fast path's edge: well formed, with run records and tasks whose
# ids, owners, sequences and counts are drawn so that some rules hold and some break.
near_ids = st.sampled_from(["s", "t", "", 1, None, b"s"])
near_events = st.lists(
    st.one_of(
        st.fixed_dictionaries({"sequence": st.integers(-1, 4)}),
        st.fixed_dictionaries({"sequence": st.sampled_from([True, 1.0, None])}),
        st.just({}),
    ),
    max_size=4,
)
near_records = st.lists(
    st.fixed_dictionaries(
        {
            "snapshot": st.fixed_dictionaries(
                {},
                optional={
                    "id": st.sampled_from(["r1", "r2", 7, None, b"r1", True]),
                    "session_id": near_ids,
                    "event_count": st.one_of(st.integers(-1, 6), st.none(), st.just("3")),
                },
            )
        },
        optional={"events": st.one_of(near_events, st.none())},
    ),
    max_size=4,
)
near_snapshots = st.fixed_dictionaries(
    {"schema_version": st.just(1), "session": st.just({"id": "s"})},
    optional={
        "run_records": near_records,
        "subagent_tasks": st.lists(
            st.fixed_dictionaries({}, optional={"parent_session_id": near_ids}), max_size=3
        ),
        "retained_artifact_uris": st.lists(st.one_of(st.text(max_size=2), st.just(0)), max_size=2),
        "trace_events": st.lists(st.integers(), max_size=2),
    },
)


@settings(max_examples=3000)
@given(near_snapshots)
def test_near_the_edge_the_outline_agrees_with_the_rules(snapshot: dict[str, Any]) -> None:
    data = canonical_dumps(snapshot)
    outline = cbor_bytes.snapshot_outline(data)
    assert outline == cbor_bytes_python.snapshot_outline(data)
    verdict = _verdict(validate_snapshot, cbor2.loads(data))
    assert _verdict(validate_snapshot_bytes, data) == verdict
    if outline is not None:
        assert verdict == ("ok", "s")
