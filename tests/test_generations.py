# Earlier generations through real daemons, on both engines: `history` lists the
# generations kept (--keep-generations N: the current one and N before it),
# `load at` and `fork at` read the one current at a seq, `revert` writes one back
# as a new generation under `expect` and the lease fence; all of it through
# compaction, kill -9 (also in the middle of a revert), restarts and a backup
# restored elsewhere, and the CLI's commands with the exit codes of its table.
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sessionstore import snapshot_digest
from sessionstore.client import Client
from sessionstore.errors import Compacted, Conflict, ConnectionLost, Fenced, NotFound

from .conftest import DaemonProcess, restored_client, snapshot, take_backup
from .wall_clock import now_ms

COMMIT_POINTS = ("before-intent", "after-intent", "before-commit-record", "after-commit-record")
DURABLE_FROM = COMMIT_POINTS.index("after-commit-record")


def _generation(session_id: str, n: int, pad: int = 0) -> dict[str, Any]:
    return snapshot(session_id, config={"name": f"gen {n}", "pad": "x" * pad})


def _name(loaded: dict[str, Any] | None) -> str | None:
    return None if loaded is None else str(loaded["session"]["config"]["name"])


def _save_generations(
    client: Client, session_id: str, count: int, pad: int = 0
) -> list[dict[str, Any]]:
    """count generations; each reply with the snapshot saved and the time around it."""
    saved = []
    for n in range(count):
        before = now_ms()
        reply = client.save(_generation(session_id, n, pad))
        saved.append({**reply, "n": n, "after_ms": now_ms(), "before_ms": before})
    return saved


def _cli(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sessionstore.tools.cli", "--socket", daemon.socket_path]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)


def test_history_lists_the_generations_kept_and_load_at_reads_each(
    daemon: DaemonProcess,
) -> None:
    daemon.start("--keep-generations", "3")
    with daemon.client() as client:
        assert client.hello()["limits"]["keep_generations"] == 3
        saved = _save_generations(client, "s", 6)
        client.save(_generation("other", 0))  # a seq between: no generation of s
        history = client.history("s")
        kept = saved[-4:]  # the current one and 3 before it
        assert [g["seq"] for g in history] == [s["seq"] for s in reversed(kept)]
        assert [g["digest"] for g in history] == [s["digest"] for s in reversed(kept)]
        for generation, save in zip(history, reversed(kept), strict=True):
            assert save["before_ms"] <= generation["committed_at_ms"] <= save["after_ms"]
            assert generation["size"] > 0
        assert client.history("s", limit=2) == history[:2]
        for save in kept:
            loaded = client.load_with_meta("s", at=save["seq"])
            assert _name(loaded["snapshot"]) == f"gen {save['n']}"
            assert loaded["digest"] == save["digest"] and loaded["seq"] == save["seq"]
        own = kept[1]["seq"]  # at a generation's own seq it is that one
        assert _name(client.load("s", at=own)) == f"gen {kept[1]['n']}"
        assert _name(client.load("s", at=10**12)) == "gen 5"  # beyond: the current one
        with pytest.raises(Compacted) as refused:
            client.load("s", at=kept[0]["seq"] - 1)
        assert refused.value.details["oldest_seq"] == kept[0]["seq"]
        assert client.load("absent", at=1) is None
        assert client.history("absent") == []
        assert client.load("s") == _generation("s", 5)  # the plain load is unchanged


def test_revert_writes_an_earlier_generation_back_and_watchers_see_a_commit(
    daemon: DaemonProcess,
) -> None:
    daemon.start("--keep-generations", "4")
    with daemon.client() as client:
        saved = _save_generations(client, "s", 3)
        with pytest.raises(Conflict):
            client.revert("s", saved[0]["seq"], expect=saved[1]["digest"])
        assert client.history("s")[0]["seq"] == saved[2]["seq"]  # nothing written
        start = client.stats()["seq"]
        reverted = client.revert("s", saved[0]["seq"], expect=saved[2]["digest"])
        assert reverted["digest"] == saved[0]["digest"]  # the old digest, a new seq
        assert reverted["seq"] > saved[2]["seq"]
        assert client.load("s") == _generation("s", 0)
        history = client.history("s")
        assert [g["seq"] for g in history] == [reverted["seq"]] + [
            s["seq"] for s in reversed(saved)
        ]
        event = next(iter(client.watch(since=start)))
        assert (event["event"], event["session_id"], event["seq"], event["digest"]) == (
            "commit",
            "s",
            reverted["seq"],
            saved[0]["digest"],
        )
        # a revert to where it stands is one more generation, the same digest
        again = client.revert("s", reverted["seq"])
        assert again["digest"] == reverted["digest"] and again["seq"] > reverted["seq"]
        with pytest.raises(NotFound):
            client.revert("absent", 1)
        with pytest.raises(Compacted):
            client.revert("s", saved[0]["seq"] - 1)
        lease = client.lease_acquire("holder")
        with pytest.raises(Fenced):
            client.revert("s", saved[1]["seq"])
        fenced = {"holder": "holder", "epoch": lease["epoch"]}
        assert client.revert("s", saved[1]["seq"], lease=fenced)["digest"] == saved[1]["digest"]
        client.lease_release("holder", lease["epoch"])


def test_fork_at_copies_the_generation_current_then(daemon: DaemonProcess) -> None:
    daemon.start("--keep-generations", "2")
    with daemon.client() as client:
        saved = _save_generations(client, "src", 3)
        client.fork("src", "copy", "/w2", at=saved[1]["seq"])
        forked = client.load("copy")
        assert _name(forked) == "gen 1" and forked["session"]["config"]["workspace"] == "/w2"
        assert forked["session"]["id"] == "copy"
        with pytest.raises(Compacted):
            client.fork("src", "too-old", "/w", at=saved[0]["seq"] - 1)
        with pytest.raises(NotFound):
            client.fork("absent", "x", "/w", at=5)
        assert not client.exists("too-old")


def test_a_delete_takes_the_history_with_it(daemon: DaemonProcess) -> None:
    daemon.start("--keep-generations", "4")
    with daemon.client() as client:
        saved = _save_generations(client, "s", 3)
        client.delete("s")
        assert client.history("s") == []
        assert client.load("s", at=saved[2]["seq"]) is None
        again = client.save(_generation("s", 9))
        assert [g["seq"] for g in client.history("s")] == [again["seq"]]
        with pytest.raises(Compacted):
            client.load("s", at=saved[2]["seq"])


def test_no_earlier_generation_is_kept_with_zero(daemon: DaemonProcess) -> None:
    daemon.start("--keep-generations", "0")
    with daemon.client() as client:
        saved = _save_generations(client, "s", 3)
        assert [g["seq"] for g in client.history("s")] == [saved[2]["seq"]]
        with pytest.raises(Compacted):
            client.revert("s", saved[1]["seq"])


def _histories(client: Client, ids: list[str]) -> dict[str, Any]:
    return {
        i: [(g, client.load_with_meta(i, at=g["seq"])["snapshot"]) for g in client.history(i)]
        for i in ids
    }


def test_generations_survive_compaction_kill9_restart_and_a_backup(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    daemon.start("--keep-generations", "3", "--segment-mib", "1")
    ids = [f"s{n}" for n in range(6)]
    with daemon.client() as client:
        for round_ in range(8):  # several MiB: segments fill, and die, as they go
            for session_id in ids:
                client.save(_generation(session_id, round_, pad=40_000))
        client.delete("s5")
        before = _histories(client, ids)
        assert all(len(before[i]) == 4 for i in ids[:5]) and before["s5"] == []
        client.compact()
        assert _histories(client, ids) == before
        oldest, oldest_snapshot = before["s0"][-1]
        reverted = client.revert("s0", oldest["seq"])
        before = _histories(client, ids)
    daemon.kill9()
    daemon.start("--keep-generations", "3", "--segment-mib", "1")
    with daemon.client() as client:
        assert _histories(client, ids) == before
        assert client.load("s0") == oldest_snapshot
        assert client.head("s0")["seq"] == reverted["seq"]
    backup = take_backup(daemon, tmp_path / "gens.bak")
    with restored_client(backup) as restored:
        assert _histories(restored, ids) == before
    daemon.stop()
    daemon.start("--keep-generations", "1", "--segment-mib", "1")  # fewer: the oldest go
    with daemon.client() as client:
        assert _histories(client, ids) == {i: h[:2] for i, h in before.items()}


@pytest.mark.parametrize("point", COMMIT_POINTS)
def test_kill9_in_the_middle_of_a_revert(daemon: DaemonProcess, point: str) -> None:
    daemon.start("--keep-generations", "4", env={"SESSIONSTORED_FAILPOINTS": f"{point}=crash@4"})
    with daemon.client() as client:
        saved = _save_generations(client, "s", 3)
        with pytest.raises(ConnectionLost):
            client.revert("s", saved[0]["seq"])
    assert daemon.wait_exit() == -9
    daemon.start("--keep-generations", "4")
    with daemon.client() as client:
        history = client.history("s")
        loaded = client.load_with_meta("s")
        if COMMIT_POINTS.index(point) >= DURABLE_FROM:  # durable, unanswered: whole
            assert loaded["snapshot"] == _generation("s", 0)
            assert loaded["digest"] == saved[0]["digest"]
            assert len(history) == 4 and history[0]["seq"] == saved[2]["seq"] + 1
        else:  # never committed: absent, and the seq is reused
            assert loaded["snapshot"] == _generation("s", 2)
            assert [g["seq"] for g in history] == [s["seq"] for s in reversed(saved)]
        assert client.revert("s", saved[1]["seq"])["digest"] == saved[1]["digest"]
        assert client.verify()["problems"] == []


def test_the_cli_history_get_at_revert_and_fork_at(daemon: DaemonProcess) -> None:
    daemon.start("--keep-generations", "2")
    with daemon.client() as client:
        saved = _save_generations(client, "s", 4)
    listed = _cli(daemon, "history", "s")
    assert listed.returncode == 0, listed.stderr
    lines = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [g["seq"] for g in lines] == [s["seq"] for s in reversed(saved[-3:])]
    assert set(lines[0]) == {"seq", "digest", "size", "committed_at_ms"}
    got = _cli(daemon, "get", "s", "--at", str(saved[2]["seq"]))
    assert got.returncode == 0 and json.loads(got.stdout) == _generation("s", 2)
    assert _cli(daemon, "get", "s", "--at", str(saved[0]["seq"])).returncode == 3
    assert _cli(daemon, "history", "absent").returncode == 3
    stale = _cli(daemon, "revert", "s", str(saved[2]["seq"]), "--expect", saved[0]["digest"])
    assert stale.returncode == 5, stale.stderr
    assert _cli(daemon, "revert", "s", str(saved[0]["seq"])).returncode == 3
    reverted = _cli(daemon, "revert", "s", str(saved[2]["seq"]), "--expect", saved[3]["digest"])
    assert reverted.returncode == 0, reverted.stderr
    assert json.loads(reverted.stdout)["digest"] == snapshot_digest(_generation("s", 2))
    forked = _cli(daemon, "fork", "s", "t", "/elsewhere", "--at", str(saved[3]["seq"]))
    assert forked.returncode == 0, forked.stderr
    with daemon.client() as client:
        assert _name(client.load("t")) == "gen 3"
        assert client.load("s") == _generation("s", 2)
