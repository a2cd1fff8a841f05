# `sessionstore export` and `sessionstore import`, through the CLI against real
# daemons: every document of a store on either backend comes back into an empty
# log store with the same digests, bytes, floats and non-text keys included; an
# import reports each problem by its line number, and hostile input ends in one
# line on stderr and a non-zero exit, never a traceback or half an import.
from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from sessionstore.wire.canonical import snapshot_digest

from .conftest import DaemonProcess


def _cli(
    daemon: DaemonProcess, *args: str, stdin: str | None = None, max_address_space: int = -1
) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (max_address_space, max_address_space))

    return subprocess.run(
        [sys.executable, "-m", "sessionstore.tools.cli", "--socket", daemon.socket_path, *args],
        input=stdin, capture_output=True, text=True, timeout=120, preexec_fn=limit,
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
        assert json.loads(result.stdout) == {
            "imported": 6, "unchanged": 0, "expired": 0, "problems": [], "stopped": None
        }  # fmt: skip
        again = _cli(target, "export")
        assert {
            (d["kind"], d["id"]): d["digest"] for d in map(json.loads, again.stdout.splitlines())
        } == digests
        with target.client() as client:
            errors_before = {op: r["errors"] for op, r in client.stats()["requests"].items()}
        rerun = _cli(target, "--json", "import", str(exported))  # create-only: nothing moves
        assert rerun.returncode == 0
        assert json.loads(rerun.stdout) == {
            "imported": 0, "unchanged": 6, "expired": 0, "problems": [], "stopped": None
        }  # fmt: skip
        with target.client() as client:  # no refused write: the skipped are no errors
            errors_after = {op: r["errors"] for op, r in client.stats()["requests"].items()}
            assert errors_after == {op: errors_before.get(op, 0) for op in errors_after}
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
    collision = _cli(running, "import", stdin=lines[4] + "\n")
    assert collision.returncode == 5 and "left alone" in collision.stderr  # as put --create-only
    not_json = _cli(running, "import", stdin=lines[1] + "\n" + lines[2] + "\n")
    assert not_json.returncode == 2  # the lines' own problems: as input that is not JSON
    forced = _cli(running, "--json", "import", "--overwrite", stdin=lines[4] + "\n")
    assert forced.returncode == 2 and "was written at" in forced.stderr  # digest "x" again
    with running.client() as client:
        assert client.load("there")["session"]["v"] == 2


def _kv(key: str, value: Any, digest: str = "x") -> bytes:
    return json.dumps({"kind": "kv", "id": key, "digest": digest, "value": value}).encode()


def _nested(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


SESSION = {"schema_version": 1, "session": {"id": "s"}}
# (what, the line, what its one stderr line says); each line's id is absent after
HOSTILE_LINES = [
    ("100,000 levels", _kv("deep", {"v": 0}).replace(b"0}", _nested(100_000) + b"}"),
     "nested too deeply"),
    ("deeper than the daemon takes", _kv("d70", {"v": 0}).replace(b"0}", _nested(70) + b"}"),
     "the daemon takes 61"),
    ("not UTF-8", _kv("a\udcffb", {}).replace(b"\\udcff", b"\xff"), "byte 0xff at offset"),
    ("a float beyond range", _kv("f", {"v": 0}).replace(b"0}", b"1e99999}"),
     "beyond a 64-bit float's range"),
    ("an integer beyond 64 bits", _kv("i", {"v": 2**64}), "outside CBOR's range"),
    ("a 5,000-digit integer", _kv("i5", {"v": 0}).replace(b"0}", b"9" * 5000 + b"}"),
     "outside CBOR's range"),
    ("a raw NUL", _kv("nul", {"v": "a"}).replace(b"a", b"\0"), "not JSON"),
    ("NUL in an id", _kv("n\0l", {}), "must not contain NUL"),
    ("a lone surrogate", _kv("sur", {"v": "\ud800"}), "lone surrogate"),
    ("invalid $bytes", _kv("b", {"v": {"$bytes": "not base64!"}}), "bad $bytes value"),
    ("an unknown kind", _kv("u", {}).replace(b'"kv"', b'"blob"'), "kind must be one of"),
    ("another session's snapshot",
     json.dumps({"kind": "session", "id": "t", "digest": "x", "value": SESSION}).encode(),
     "not that session's snapshot"),
    ("a 64 MiB value", _kv("big", {"v": "x" * (64 << 20)}), "too_large"),
]  # fmt: skip


def test_hostile_lines_are_refused_one_line_each_and_the_rest_imports(
    running: DaemonProcess, tmp_path: Path
) -> None:
    good = [_kv(f"good/{n}", {"n": n}) for n in range(len(HOSTILE_LINES) + 1)]
    lines = [good[0]]
    for n, (_, line, _) in enumerate(HOSTILE_LINES):
        lines += [line, good[n + 1]]  # each good line after a hostile one still goes in
    source = tmp_path / "hostile.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    result = _cli(running, "--json", "import", str(source), max_address_space=2 << 30)
    assert result.returncode == 2  # every problem is a line's own
    assert "Traceback" not in result.stderr
    summary = json.loads(result.stdout)
    problems = {p["line"]: p["problem"] for p in summary["problems"]}
    stderr = result.stderr.splitlines()
    assert len(stderr) == len(problems)
    for n, (what, _, says) in enumerate(HOSTILE_LINES):
        number = 2 * n + 2
        assert says in problems.pop(number), what
        [said] = [
            line for line in stderr if line.startswith(f"sessionstore: import: line {number}:")
        ]
        assert says in said, what
    # the good lines' only problem is the placeholder digest "x"; each went in
    assert all("was written at" in what for what in problems.values())
    assert summary["imported"] == len(good) and summary["stopped"] is None
    with running.client() as client:
        keys = {item["key"] for item in client.checkpoint_scan("kv", values=False)["items"]}
        assert keys == {f"good/{n}" for n in range(len(good))}
        assert client.list()["ids"] == []


@pytest.mark.parametrize("source", ["/dev/zero", "long"])
def test_an_endless_or_too_long_line_stops_the_import_in_one_line(
    running: DaemonProcess, tmp_path: Path, source: str
) -> None:
    args = ["import", source]
    if source == "long":
        path = tmp_path / "long.jsonl"
        path.write_bytes(
            _kv("before", {}, snapshot_digest({}))
            + b"\n"
            + _kv("long", {"v": "x" * (2 << 20)})
            + b"\n"
        )
        args = ["import", "--max-line-mib", "1", str(path)]
    result = _cli(running, "--json", *args, max_address_space=2 << 30)
    assert result.returncode == 2 and "Traceback" not in result.stderr  # the input's fault
    [said] = result.stderr.splitlines()
    line = 1 if source == "/dev/zero" else 2
    assert f"line {line} is longer than" in said and "stopped there" in said
    assert json.loads(result.stdout)["stopped"] in said
    with running.client() as client:
        keys = {item["key"] for item in client.checkpoint_scan("kv", values=False)["items"]}
    assert keys == (set() if source == "/dev/zero" else {"before"})


def test_importing_a_directory_is_refused_in_one_line(running: DaemonProcess) -> None:
    result = _cli(running, "import", "/tmp")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["sessionstore: /tmp: Is a directory"]


LINE_ENDS = "\u2028\u2029\u0085\u000b\u000c\u001c\u001d\u001e"


def test_every_json_line_the_cli_writes_stays_one_line_for_splitlines(
    running: DaemonProcess,
) -> None:
    session_id = f"ends{LINE_ENDS}"
    snapshot = {"schema_version": 1, "session": {"id": session_id, LINE_ENDS: [LINE_ENDS]}}
    with running.client() as client:
        digest = client.save(snapshot)["digest"]
        client.checkpoint_put("kv", f"k{LINE_ENDS}", {"v": LINE_ENDS})
    outputs = {
        "export": _cli(running, "export"),
        "get": _cli(running, "--json", "get", session_id),
        "watch": _cli(running, "watch", "--since", "0", "--count", "2"),
        "head": _cli(running, "--json", "head", session_id),
    }
    for name, result in outputs.items():
        assert result.returncode == 0, (name, result.stderr)
        lines = result.stdout.splitlines()
        assert len(lines) == {"export": 2, "watch": 2}.get(name, 1), name
        assert all(json.loads(line) for line in lines), name
    exported = outputs["export"].stdout
    assert not set(LINE_ENDS) & set(exported)  # each one escaped
    target = _target()
    try:
        result = _cli(target, "--json", "import", stdin=exported)
        assert json.loads(result.stdout)["imported"] == 2, result.stderr
        with target.client() as client:
            assert client.load_with_meta(session_id)["digest"] == digest
    finally:
        target.stop()
        target.cleanup()
