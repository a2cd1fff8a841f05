# `sessionstore import-a3s` against stores written as a3s-code-core writes
# them (tests/a3s_fixtures.py), plain and sealed, into a real daemon.
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from .a3s_fixtures import (
    PRESENTATION_PROFILE,
    TRANSFORM_POLICY,
    UpstreamStore,
    as_upstream_reads,
    assembled,
    build,
    legacy_session_data,
    run_record,
    snapshot,
    tool_artifact,
    trace_event,
)
from .conftest import DaemonProcess


def run_import(daemon: DaemonProcess, *args: str) -> tuple[int, dict[str, Any], str]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sessionstore.tools.cli",
            "--socket",
            daemon.socket_path,
            "import-a3s",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = json.loads(result.stdout) if result.stdout.strip() else {}
    return result.returncode, summary, result.stderr


def assert_imported(daemon: DaemonProcess, expected: dict[str, Any]) -> None:
    with daemon.client() as client:
        for session_id, value in expected["sessions"].items():
            assert client.load(session_id) == value, session_id
        for key, value in expected["loop"].items():
            assert client.checkpoint_get("loop", key) == value
        for key, value in expected["workflow"].items():
            assert client.checkpoint_get("workflow", key) == value
        assert client.load("breaks-rules") is None and client.load("corrupt") is None


def test_a_plain_store_comes_across_by_upstream_rules(
    running: DaemonProcess, tmp_path: Path
) -> None:
    expected = build(tmp_path / "a3s")
    code, summary, err = run_import(running, str(tmp_path / "a3s"))
    assert code == 1  # two documents were refused, so not everything came across
    assert summary["imported"] == 8 and summary["skipped"] == 0
    refused = {item["what"]: item["why"] for item in summary["refused"]}
    assert any(
        str(expected["corrupt"]) in what and "not JSON" in why for what, why in refused.items()
    )
    assert any(
        "breaks-rules" in what and "invalid_snapshot" in why for what, why in refused.items()
    )
    assert summary["temp_files_ignored"] == [str(expected["temp"])]
    recovery = "\n".join(summary["recovery"])
    assert "'tenant/session': sealed (the durable file matches)" in recovery
    assert "'plain-1': not sealed; the previous generation stands" in recovery
    assert "refused" in err and str(expected["corrupt"]) in err
    assert_imported(running, expected)

    with running.client() as client:
        seq = client.stats()["seq"]
    code, summary, _ = run_import(running, str(tmp_path / "a3s"))
    assert code == 1  # the refused two are still there
    assert summary["imported"] == 0 and summary["skipped"] == 8
    with running.client() as client:
        assert client.stats()["seq"] == seq  # a rerun changes nothing
        client.save(snapshot("tenant_session", "edited here"))
    _, summary, err = run_import(running, str(tmp_path / "a3s"))
    assert len(summary["changed_not_overwritten"]) == 1 and "tenant_session" in err
    with running.client() as client:
        assert client.load("tenant_session") == snapshot("tenant_session", "edited here")
    _, summary, _ = run_import(running, str(tmp_path / "a3s"), "--overwrite")
    assert summary["imported"] == 1
    assert_imported(running, expected)


def test_a_clean_store_exits_0_and_a_dry_run_writes_nothing(
    running: DaemonProcess, tmp_path: Path
) -> None:
    expected = build(tmp_path / "a3s", damaged=False)
    code, summary, _ = run_import(running, str(tmp_path / "a3s"), "--dry-run")
    assert code == 0 and summary["dry_run"] is True and summary["imported"] == 8
    with running.client() as client:
        assert client.stats()["seq"] == 0
    code, summary, _ = run_import(running, str(tmp_path / "a3s"))
    assert code == 0 and summary["complete"] is True
    assert_imported(running, expected)


def test_a_sealed_store_needs_its_key(running: DaemonProcess, tmp_path: Path) -> None:
    key = os.urandom(32)
    expected = build(tmp_path / "a3s", key, damaged=False)
    (tmp_path / "key").write_bytes(key)
    (tmp_path / "other").write_text(os.urandom(32).hex())
    code, summary, _ = run_import(running, str(tmp_path / "a3s"))
    assert code == 1 and summary["imported"] == 0
    assert all("give it with --key-file" in item["why"] for item in summary["refused"])
    code, summary, _ = run_import(
        running, str(tmp_path / "a3s"), "--key-file", str(tmp_path / "other")
    )
    assert code == 1 and all("does not open with this key" in i["why"] for i in summary["refused"])
    code, summary, _ = run_import(
        running, str(tmp_path / "a3s"), "--key-file", str(tmp_path / "key")
    )
    assert code == 0 and summary["imported"] == 8, summary
    assert_imported(running, expected)


def test_not_a_store_is_a_usage_error(running: DaemonProcess, tmp_path: Path) -> None:
    code, _, err = run_import(running, str(tmp_path))
    assert code == 2 and "not an a3s-code-core session store" in err


def test_a_missing_directory_or_key_file_is_one_line_naming_it(
    running: DaemonProcess, tmp_path: Path
) -> None:
    for args, said in (
        ([str(tmp_path / "gone")], f"{tmp_path / 'gone'}: no such directory"),
        ([str(tmp_path), "--key-file", str(tmp_path / "k")], f"{tmp_path / 'k'}: no such key file"),
    ):
        code, _, err = run_import(running, *args)
        assert code == 2 and err.strip() == f"sessionstore: {said}", err
        assert "Errno" not in err


def test_a_progress_bar_shows_on_a_terminal(running: DaemonProcess, tmp_path: Path) -> None:
    from .test_cli import with_stderr_on_a_terminal

    build(tmp_path / "a3s", damaged=False)
    command = [sys.executable, "-m", "sessionstore.tools.cli", "--socket", running.socket_path]
    result, shown = with_stderr_on_a_terminal([*command, "import-a3s", str(tmp_path / "a3s")])
    assert result.returncode == 0
    assert b"importing" in shown and b"8/8" in shown


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def _old_sessions(root: Path) -> dict[str, Any]:
    """Issue 26's cases, as upstream would have left them on disk."""

    store = UpstreamStore(root)
    old = legacy_session_data("old")
    _write_json(root / "old.json", old)
    artifact = tool_artifact("bash", "long output\n", 4)
    manifest = {"artifacts": [artifact], "retained_uris": ["file:///z", "file:///b"]}
    _write_json(root / "artifacts" / "old" / "artifacts.json", manifest)
    # tenant_session's root files, and the v1 session tenant/session that shares the name
    mine = legacy_session_data("tenant_session", "root")
    _write_json(root / "tenant_session.json", mine)
    runs = [run_record("tenant_session", "r1")]
    _write_json(root / "runs" / "tenant_session.json", runs)
    traces = [trace_event("bash", [])]
    _write_json(root / "traces" / "tenant_session.json", traces)
    theirs = legacy_session_data("tenant/session", "v1")
    store.write("sessions", "tenant/session", theirs)
    # a v1 file that rotted, with an older root copy of the same session
    store.path("sessions", "rotted").write_bytes(b'{"schema_version": 1, "sess')
    _write_json(root / "rotted.json", legacy_session_data("rotted"))
    return {"old": old, "manifest": manifest, "mine": mine, "runs": runs, "traces": traces,
            "theirs": theirs, "rotted": store.path("sessions", "rotted")}  # fmt: skip


def test_retained_uris_come_from_the_artifact_manifest(
    running: DaemonProcess, tmp_path: Path
) -> None:
    case = _old_sessions(tmp_path)
    run_import(running, str(tmp_path))
    with running.client() as client:
        stored = client.load("old")
    assert stored["artifacts"] == case["manifest"]["artifacts"]
    assert stored["retained_artifact_uris"] == ["file:///b", "file:///z"]  # sorted, as saved


def test_a_root_fragment_counts_only_for_the_id_that_owns_its_name(
    running: DaemonProcess, tmp_path: Path
) -> None:
    case = _old_sessions(tmp_path)
    run_import(running, str(tmp_path))
    with running.client() as client:
        assert client.load("tenant_session") == assembled(
            case["mine"], run_records=case["runs"], trace_events=case["traces"]
        )
        assert client.load("tenant/session") == assembled(case["theirs"])


def test_an_unreadable_v1_file_is_never_replaced_by_an_older_root_copy(
    running: DaemonProcess, tmp_path: Path
) -> None:
    case = _old_sessions(tmp_path)
    code, _, err = run_import(running, str(tmp_path))
    assert code == 1 and str(case["rotted"]) in err, err
    with running.client() as client:
        assert client.load("rotted") is None


def test_a_session_assembled_from_fragments_has_every_component(
    running: DaemonProcess, tmp_path: Path
) -> None:
    case = _old_sessions(tmp_path)
    run_import(running, str(tmp_path))
    with running.client() as client:
        stored = client.load("tenant/session")
    assert stored["session"] == as_upstream_reads(case["theirs"])
    for component in ("artifacts", "retained_artifact_uris", "trace_events", "run_records",
                      "verification_reports", "subagent_tasks"):  # fmt: skip
        assert stored[component] == [], component


def test_an_old_session_comes_with_the_fields_serde_fills_in(
    running: DaemonProcess, tmp_path: Path
) -> None:
    old = legacy_session_data("aged")
    old["todos"] = [{"id": "t1", "content": "rerun the suite", "status": "pending"}]
    del old["thinking_budget"], old["config"]["system_prompt"]  # Options: missing reads as None
    old["model_name"] = None  # read as None, and never written back
    old["config"]["confirmation_policy"] = None  # the two tool policies: Options,
    old["config"]["permission_policy"] = {"default": "ask"}  # left out when None
    old["config"]["enforce_active_skill_tool_restrictions"] = False  # skipped when false
    _write_json(tmp_path / "aged.json", old)
    code, _, err = run_import(running, str(tmp_path))
    assert code == 0, err
    with running.client() as client:
        session = client.load("aged")["session"]
    assert session["total_cost"] == 0.0 and session["cost_records"] == []
    assert session["tasks"] == old["todos"] and "todos" not in session  # serde's alias
    assert session["thinking_budget"] is None and "model_name" not in session
    config = dict(old["config"])
    del config["confirmation_policy"], config["enforce_active_skill_tool_restrictions"]
    assert session["config"] == {
        **config,
        "system_prompt": None,
        "auto_compact_threshold": 0.8,
        "storage_type": "file",
        "planning_mode": "Auto",
        "goal_tracking": False,
        "tool_result_transform_policy": TRANSFORM_POLICY,
        "tool_presentation_profile": PRESENTATION_PROFILE,
    }


def test_a_session_upstream_cannot_read_is_refused_naming_the_field(
    running: DaemonProcess, tmp_path: Path
) -> None:
    store = UpstreamStore(tmp_path)
    stateless = legacy_session_data("stateless")
    del stateless["state"]
    _write_json(tmp_path / "stateless.json", stateless)
    nameless = snapshot("nameless")
    del nameless["session"]["config"]["workspace"]
    store.save_snapshot(nameless)
    code, _, err = run_import(running, str(tmp_path))
    assert code == 1
    assert f"{tmp_path / 'stateless.json'}: upstream cannot read it: missing field `state`" in err
    assert "missing field `workspace` in SessionConfig" in err
    with running.client() as client:
        assert client.load("stateless") is None and client.load("nameless") is None


def test_an_artifact_manifest_loads_as_upstream_loads_it(
    running: DaemonProcess, tmp_path: Path
) -> None:
    """ArtifactStore::load_from_manifest_bytes: an exact repeat once, the oldest past
    256 artifacts evicted (before the retention roots are set), unknown fields
    dropped, empty and repeated retained URIs dropped; a URI bound to two contents
    makes the manifest unreadable."""
    crowded = legacy_session_data("crowded")
    _write_json(tmp_path / "crowded.json", crowded)
    artifacts = [tool_artifact("grep", f"match {n}\n", 3) for n in range(300)]
    newest = {**artifacts[299], "note": "unknown to ToolArtifact"}
    manifest = {
        "artifacts": [*artifacts[:299], newest, artifacts[299]],
        "retained_uris": [artifacts[0]["artifact_uri"], "", artifacts[0]["artifact_uri"]],
    }
    _write_json(tmp_path / "artifacts" / "crowded" / "artifacts.json", manifest)
    torn = legacy_session_data("torn")
    _write_json(tmp_path / "torn.json", torn)
    other = {**artifacts[1], "content": "something else"}
    _write_json(tmp_path / "artifacts" / "torn" / "artifacts.json",
                {"artifacts": [artifacts[1], other]})  # fmt: skip
    code, _, err = run_import(running, str(tmp_path))
    assert code == 1 and "is already bound to different content" in err
    assert str(tmp_path / "artifacts" / "torn" / "artifacts.json") in err
    with running.client() as client:
        stored = client.load("crowded")
        assert client.load("torn") is None
    assert stored["artifacts"] == artifacts[44:]  # the 256 newest; a retained root too
    assert stored["retained_artifact_uris"] == [artifacts[0]["artifact_uri"]]


def _import_in_c_locale(daemon: DaemonProcess, root: Path) -> tuple[int, dict[str, Any], str]:
    environment = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "sessionstore.tools.cli", "--socket", daemon.socket_path,
         "import-a3s", str(root)],
        capture_output=True, text=True, timeout=120, env=environment, encoding="utf-8",
    )  # fmt: skip
    return result.returncode, json.loads(result.stdout), result.stderr


def test_the_wal_is_raw_utf8_whatever_the_locale(running: DaemonProcess, tmp_path: Path) -> None:
    store = UpstreamStore(tmp_path)
    session_id = "équipe/会话-1"
    store.save_snapshot(snapshot(session_id))
    renamed = snapshot(session_id, "g2")
    store.crash_after_rename(renamed)
    wal = (tmp_path / "v1" / "wal" / "session-store.ndjson").read_bytes()
    assert session_id.encode() in wal  # serde_json writes it unescaped
    code, summary, err = _import_in_c_locale(running, tmp_path)
    assert code == 0, err
    assert summary["recovery"] == [
        f"intent 2 for {session_id!r}: sealed (the durable file matches)"
    ]
    with running.client() as client:
        assert client.load(session_id) == renamed


def test_a_digest_is_over_serde_json_numbers(running: DaemonProcess, tmp_path: Path) -> None:
    """serde_json writes 1.5e-05 as 0.000015 and 1e16 as 1e16: the digest of what the
    file holds must be taken over those bytes, or an intent whose rename happened
    looks unsealed."""
    store = UpstreamStore(tmp_path)
    value = snapshot("cheap")
    value["session"]["total_cost"] = 1.5e-05
    value["session"]["context_usage"]["percent"] = 1e16
    store.crash_after_rename(value)
    assert b'"total_cost": 0.000015' in store.path("sessions", "cheap").read_bytes()
    code, summary, err = run_import(running, str(tmp_path))
    assert code == 0, err
    assert summary["recovery"] == ["intent 1 for 'cheap': sealed (the durable file matches)"]


def test_what_a_crashing_sealed_upstream_store_leaves_comes_across(
    running: DaemonProcess, tmp_path: Path
) -> None:
    """A store sealed after one plaintext document was written, a seed-style
    `.json.crash-N.tmp` temp and a truncated one, a session whose first write never
    landed, the writer lease and the WAL's lock file: what upstream would load, and
    nothing else."""
    key = bytes(range(32))
    plain = UpstreamStore(tmp_path)
    early = snapshot("early")
    plain.save_snapshot(early)  # before the store was sealed
    sealed = UpstreamStore(tmp_path, key)
    sealed.sequence = plain.sequence
    later = snapshot("later")
    sealed.save_snapshot(later)
    final = sealed.path("sessions", "later")
    final.with_name(final.name + ".crash-3.tmp").write_bytes(b'{"schema_version": 1')  # truncated
    sealed.crash_before_rename(snapshot("never-landed"))  # an intent, a temp, no file
    (tmp_path / "v1" / "writer_lease.json").write_bytes(
        sealed._bytes({"epoch": 1, "holder_id": "host", "acquired_at_ms": 1})
    )
    (tmp_path / "v1" / "wal" / "session-store.lock").write_bytes(b"")
    code, summary, err = run_import(running, str(tmp_path), "--key-file", _key_file(tmp_path, key))
    assert code == 0, err
    with running.client() as client:
        assert client.load("early") == early
        assert client.load("later") == later
        assert client.load("never-landed") is None
    assert len(summary["temp_files_ignored"]) == 2


def _key_file(directory: Path, key: bytes) -> str:
    path = directory.parent / "host.key"
    path.write_bytes(key)
    return str(path)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_the_importer_writes_a_number_as_serde_json_does(number: float) -> None:
    from sessionstore.tools.a3s_serde import compact_json

    from .a3s_fixtures import serde_float

    text = compact_json(number)
    assert text == serde_float(number) and float(text) == number


def test_serde_json_number_forms() -> None:
    """Known serde_json outputs (ryu): 1e-7 and 1e16 in exponent form, no '+'."""
    from sessionstore.tools.a3s_serde import compact_json

    forms = {
        0.0: "0.0",
        1.0: "1.0",
        0.1: "0.1",
        1.5e-05: "0.000015",
        1e-07: "1e-7",
        1e16: "1e16",
        1e15: "1000000000000000.0",
        -2.5: "-2.5",
        1.25e300: "1.25e300",
    }
    assert {number: compact_json(number) for number in forms} == forms
