# The configuration in process: flags, environment and defaults, systemd socket
# activation, the PostgreSQL settings, and one clear error for bad ones (in one line
# from the command itself too).
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sessionstored.config import SYSTEMD_FIRST_FD, ConfigError, build_config


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
    assert _config("--database", url).batches_in_flight == 1
    assert _config("--database", url, "--batches-in-flight", "4").batches_in_flight == 4


@pytest.mark.parametrize(
    "argv",
    [
        ["--socket-mode", "999"],
        ["--max-request-bytes", "10"],
        ["--compact-dead-share", "1"],
        ["--segment-mib", "0"],
        ["--keep-generations", "-1"],
        ["--keep-generations", "1025"],
        ["--metrics-listen", "127.0.0.1:99999"],
        ["--metrics-listen", "localhost:http"],
        ["--watch-max-lag", "0"],
        ["--batches-in-flight", "2"],  # the log commits one at a time
        ["--batches-in-flight", "0", "--database", "postgresql://db/s"],
        ["--batches-in-flight", "17", "--database", "postgresql://db/s"],
    ],
)
def test_bad_configuration_is_one_clear_error(argv: list[str]) -> None:
    with pytest.raises(ConfigError) as error:
        _config(*argv)
    assert argv[0] in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "argv",
    [
        *(["--keep-generations", value] for value in ("1.5", "abc", "", "0x10", "1e3")),
        *(
            [flag, value]
            for flag in (
                "--request-timeout-seconds",
                "--watch-send-timeout-seconds",
                "--shutdown-grace-seconds",
            )
            for value in ("nan", "inf", "-1", "1e300")
        ),
        ["--request-timeout-seconds", "0"],
        ["--watch-send-timeout-seconds", "0"],
        ["restore", "backup.file", "--state-dir", "/nonexistent/s", "--key-file"],
        ["rekey", "--rows-per-transaction", "many"],
    ],
)
def test_the_daemons_command_line_refuses_a_bad_value_in_one_line(argv: list[str]) -> None:
    """Every command of the daemon's: the reason in one line and exit 2, not the usage."""
    result = subprocess.run(
        [sys.executable, "-m", "sessionstored", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SESSIONSTORED_STATE_DIR": "/nonexistent/s"},
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    flag = [word for word in argv if word.startswith("--")][-1]
    assert line.startswith("sessionstored") and flag in line, line
