# `sessionstore import-a3s` against stores written as a3s-code-core writes
# them (tests/a3s_fixtures.py), plain and sealed, into a real daemon.
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .a3s_fixtures import build, snapshot
from .conftest import DaemonProcess


def run_import(daemon: DaemonProcess, *args: str) -> tuple[int, dict[str, Any], str]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sessionstore.cli",
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
    command = [sys.executable, "-m", "sessionstore.cli", "--socket", running.socket_path]
    result, shown = with_stderr_on_a_terminal([*command, "import-a3s", str(tmp_path / "a3s")])
    assert result.returncode == 0
    assert b"importing" in shown and b"8/8" in shown
