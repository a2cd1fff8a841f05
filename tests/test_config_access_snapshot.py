# Three front-end modules in process: the configuration (flags, environment,
# systemd socket activation), the peer access policy and the snapshot rules.
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sessionstored.access import Access, AccessPolicy, Peer
from sessionstored.config import SYSTEMD_FIRST_FD, ConfigError, build_config
from sessionstored.snapshot import InvalidSnapshot, forked, validate_snapshot, with_component


def _config(*argv: str, **env: str) -> Any:
    return build_config(list(argv), {"HOME": "/home/u", **env}, pid=42, uid=1000, gid=1000)


def test_state_and_socket_come_from_flags_then_environment_then_defaults() -> None:
    assert _config().state_dir == "/home/u/.local/state/sessionstored"
    assert _config(XDG_STATE_HOME="/x").state_dir == "/x/sessionstored"
    assert _config(STATE_DIRECTORY="/var/lib/s:/other").state_dir == "/var/lib/s"
    assert _config("--state-dir", "/flag", SESSIONSTORED_STATE_DIR="/env").state_dir == "/flag"
    assert _config(SESSIONSTORE_SOCKET="/run/s.sock").socket_path == "/run/s.sock"


def test_a_socket_passed_by_systemd_is_used_only_when_it_is_ours() -> None:
    ours = _config(LISTEN_PID="42", LISTEN_FDS="2", LISTEN_FDNAMES="other:sessionstored")
    assert ours.inherited_fd == SYSTEMD_FIRST_FD + 1 and ours.socket_path is None
    assert _config(LISTEN_PID="7", LISTEN_FDS="1").inherited_fd is None
    with pytest.raises(ConfigError, match="LISTEN_FDS"):
        _config(LISTEN_PID="42", LISTEN_FDS="x")


def test_the_database_comes_from_the_flag_or_the_environment_and_its_password_from_a_credential(
    tmp_path: Path,
) -> None:
    url = "postgresql://sessions@db/sessions"
    assert _config().database_url is None
    assert _config("--database", url).database_url == url
    assert _config(SESSIONSTORED_DATABASE_URL=url).database_url == url
    (tmp_path / "sessionstored.dbpassword").write_text("s3cret\n")
    configured = _config("--database", url, CREDENTIALS_DIRECTORY=str(tmp_path))
    assert configured.database_password == "s3cret"
    assert (
        _config("--database", url, CREDENTIALS_DIRECTORY="/nonexistent").database_password is None
    )
    with pytest.raises(ConfigError, match="postgresql://"):
        _config("--database", "sqlite:///x")


@pytest.mark.parametrize(
    "argv",
    [
        ["--socket-mode", "999"],
        ["--max-request-bytes", "10"],
        ["--compact-dead-share", "1"],
        ["--segment-mib", "0"],
        ["--watch-max-lag", "0"],
        ["--request-timeout-seconds", "0"],
    ],
)
def test_bad_configuration_is_one_clear_error(argv: list[str]) -> None:
    with pytest.raises(ConfigError) as error:
        _config(*argv)
    assert argv[0] in str(error.value) and "\n" not in str(error.value)


def test_access_policy() -> None:
    policy = AccessPolicy(
        daemon_uid=1000,
        daemon_gid=1000,
        allow_uids=frozenset({2000}),
        read_only_gids=frozenset({3000}),
    )
    assert policy.decide(Peer(1, 1000, 5)) is Access.FULL
    assert policy.decide(Peer(1, 0, 5)) is Access.FULL
    assert policy.decide(Peer(1, 5, 1000)) is Access.FULL  # the daemon's group
    assert policy.decide(Peer(1, 2000, 5)) is Access.FULL
    assert policy.decide(Peer(1, 1000, 3000)) is Access.READ_ONLY  # read-only wins
    assert policy.decide(Peer(1, 5, 5)) is Access.NONE


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
    with pytest.raises(InvalidSnapshot):
        validate_snapshot(snapshot)


def test_update_and_fork_keep_the_rules() -> None:
    assert validate_snapshot(_snap(unknown={"kept": True})) == "s"
    updated = with_component(_snap(), "s", "artifacts", [{"a": 1}])
    assert updated["artifacts"] == [{"a": 1}]
    with pytest.raises(LookupError):
        with_component(None, "s", "artifacts", [])
    with pytest.raises(InvalidSnapshot):
        with_component(_snap(), "s", "session", {"id": "other"})
    copy = forked(_snap(subagent_tasks=[{"parent_session_id": "s"}]), "t", "/w")
    assert copy["session"] == {"id": "t", "config": {"workspace": "/w"}}
    assert copy["subagent_tasks"] == [{"parent_session_id": "t"}]
