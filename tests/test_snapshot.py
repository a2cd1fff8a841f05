# The snapshot document rules, and update and fork keeping them.
from __future__ import annotations

from typing import Any

import pytest

from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import Refusal
from sessionstored.ops.snapshot import forked, validate_snapshot, with_component


def _snap(**extra: Any) -> dict[str, Any]:
    return {"schema_version": 1, "session": {"id": "s"}, **extra}


@pytest.mark.parametrize(
    "snapshot",
    [
        {"schema_version": 2, "session": {"id": "s"}},
        {"schema_version": 1, "session": {"id": ""}},
        {"schema_version": 1, "session": {"id": "a\x00b"}},
        {"schema_version": 1, "session": {"id": "x" * 1025}},
        _snap(artifacts={}),
        _snap(retained_artifact_uris=[1]),
        _snap(run_records=[{"snapshot": {"id": "r", "session_id": "other"}}]),
        _snap(subagent_tasks=[{"parent_session_id": "other"}]),
    ],
)
def test_the_snapshot_rules(snapshot: dict[str, Any]) -> None:
    with pytest.raises(Refusal) as refused:
        validate_snapshot(snapshot)
    assert refused.value.code == ErrorCode.INVALID_SNAPSHOT


def test_update_and_fork_keep_the_rules() -> None:
    assert validate_snapshot(_snap(unknown={"kept": True})) == "s"
    updated = with_component(_snap(), "s", "artifacts", [{"a": 1}])
    assert updated["artifacts"] == [{"a": 1}]
    with pytest.raises(LookupError):
        with_component(None, "s", "artifacts", [])
    with pytest.raises(Refusal) as refused:
        with_component(_snap(), "s", "session", {"id": "other"})
    assert refused.value.code == ErrorCode.INVALID_SNAPSHOT
    copy = forked(_snap(subagent_tasks=[{"parent_session_id": "s"}]), "t", "/w")
    assert copy["session"] == {"id": "t", "config": {"workspace": "/w"}}
    assert copy["subagent_tasks"] == [{"parent_session_id": "t"}]
