# `sessionstore export` and `sessionstore import` (issue 28, item 4), through the
# CLI against real daemons: every document of a store on either backend comes
# back into an empty log store with the same digests, bytes, floats and
# non-text keys included; an import reports each problem by its line number.
from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .conftest import DaemonProcess


def _cli(
    daemon: DaemonProcess, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessionstore.tools.cli", "--socket", daemon.socket_path, *args],
        input=stdin, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _fill(daemon: DaemonProcess) -> dict[tuple[str, str], str]:
    """Documents of every kind with values JSON cannot hold plainly; their digests."""
    digests: dict[tuple[str, str], str] = {}
    with daemon.client() as client:
        for n in range(3):
            snapshot = {
                "schema_version": 1,
                "session": {"id": f"s/{n}", "blob": bytes(range(n, n + 40)), "ratio": 0.1 * n},
                "artifacts": [{"sizes": {1: "one", (2, 3): "pair"}, "inf": math.inf}],
                "trace_events": [{"$bytes": "a map that looks like a wrapper"}],
            }
            digests[("session", f"s/{n}")] = client.save(snapshot)["digest"]
        client.checkpoint_put("loop", "run-1", {"run_id": "run-1", "step": 2.5})
        client.checkpoint_put("workflow", "wf/1", {"workflow_id": "wf/1", "nan": math.nan})
        client.checkpoint_put("kv", "k\u00e9y", {"raw": b"\x00\xff", "n": -(2**63)})
        for kind in ("loop", "workflow", "kv"):
            for item in client.checkpoint_scan(kind, values=False)["items"]:
                digests[(kind, item["key"])] = item["digest"]
    return digests


def _target() -> DaemonProcess:
    target = DaemonProcess(Path(tempfile.mkdtemp(prefix="ss-", dir="/tmp")))
    target.start()
    return target


def test_export_then_import_into_an_empty_store_keeps_every_digest(
    running: DaemonProcess, tmp_path: Path
) -> None:
    digests = _fill(running)
    exported = tmp_path / "store.jsonl"
    result = _cli(running, "export", str(exported))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert {(d["kind"], d["id"]): d["digest"] for d in lines} == digests
    assert all(isinstance(d["seq"], int) and d["seq"] > 0 for d in lines)
    target = _target()
    try:
        result = _cli(target, "--json", "import", str(exported))
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == {"imported": 6, "unchanged": 0, "problems": []}
        again = _cli(target, "export")
        assert {
            (d["kind"], d["id"]): d["digest"] for d in map(json.loads, again.stdout.splitlines())
        } == digests
        rerun = _cli(target, "--json", "import", str(exported))  # create-only: nothing moves
        assert json.loads(rerun.stdout) == {"imported": 0, "unchanged": 6, "problems": []}
        with target.client() as client:
            stored = client.load("s/2")
            assert stored["session"]["blob"] == bytes(range(2, 42))
            assert stored["artifacts"][0]["sizes"][(2, 3)] == "pair"
            assert math.isnan(client.checkpoint_get("workflow", "wf/1")["nan"])
            assert client.verify()["problems"] == []
    finally:
        target.stop()
        target.cleanup()


def test_an_import_reports_each_problem_by_its_line(running: DaemonProcess) -> None:
    with running.client() as client:
        there = client.save({"schema_version": 1, "session": {"id": "there", "v": 1}})
    other: dict[str, Any] = {"schema_version": 1, "session": {"id": "there", "v": 2}}
    good: dict[str, Any] = {"schema_version": 1, "session": {"id": "new"}}
    lines = [
        json.dumps({"kind": "session", "id": "new", "seq": 1, "digest": "x", "value": good}),
        "{not json",
        json.dumps({"kind": "lease", "id": "l", "digest": "x", "value": {}}),
        json.dumps({"kind": "session", "id": "elsewhere", "digest": "x", "value": good}),
        json.dumps({"kind": "session", "id": "there", "digest": "x", "value": other}),
        "",
        json.dumps({"kind": "kv", "id": "k", "digest": "x", "value": {"$map": "not pairs"}}),
    ]
    result = _cli(running, "--json", "import", stdin="\n".join(lines) + "\n")
    assert result.returncode == 1
    summary = json.loads(result.stdout)
    assert summary["imported"] == 1
    problems = {p["line"]: p["problem"] for p in summary["problems"]}
    assert set(problems) == {1, 2, 3, 4, 5, 7}
    assert "was written at" in problems[1]  # the line's digest was not the value's
    assert problems[2].startswith("not JSON") and "kind must be one of" in problems[3]
    assert "not that session's snapshot" in problems[4]
    assert there["digest"] in problems[5] and "left alone" in problems[5]
    assert problems[7].startswith("value:")
    for line in problems:
        assert f"line {line}:" in result.stderr
    with running.client() as client:
        assert client.load("there")["session"]["v"] == 1  # create-only left it alone
    forced = _cli(running, "--json", "import", "--overwrite", stdin=lines[4] + "\n")
    assert forced.returncode == 1 and "was written at" in forced.stderr  # digest "x" again
    with running.client() as client:
        assert client.load("there")["session"]["v"] == 2
