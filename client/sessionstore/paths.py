# Where the daemon listens and keeps its state: the wire contract's search
# orders, each answer with the reason it was chosen (`sessionstore where`).
# The daemon binds where its search points; a client looks there, then at the
# socket a systemd unit makes (/run/sessionstored/), so a client finds a
# daemon run by `make run` and one run by systemd alike.
from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import NamedTuple

SOCKET_NAME = "sessionstored.sock"
SYSTEMD_SOCKET = f"/run/sessionstored/{SOCKET_NAME}"


class Choice(NamedTuple):
    path: str
    reason: str


def default_socket(env: Mapping[str, str], uid: int) -> Choice:
    """The contract's steps 3 to 5 (1 and 2, an explicit path and systemd's fd, are the
    caller's)."""
    if env.get("RUNTIME_DIRECTORY"):
        directory = env["RUNTIME_DIRECTORY"].split(":")[0]
        return Choice(os.path.join(directory, SOCKET_NAME), "$RUNTIME_DIRECTORY (systemd)")
    if env.get("XDG_RUNTIME_DIR"):
        return Choice(os.path.join(env["XDG_RUNTIME_DIR"], SOCKET_NAME), "$XDG_RUNTIME_DIR")
    return Choice(f"/tmp/sessionstored-{uid}/{SOCKET_NAME}", "the fallback (no runtime dir set)")


def default_socket_path(env: Mapping[str, str], uid: int) -> str:
    return default_socket(env, uid).path


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def client_socket(
    explicit: str | None, env: Mapping[str, str] | None = None, uid: int | None = None
) -> Choice:
    env = os.environ if env is None else env
    if explicit:
        return Choice(explicit, "given explicitly (--socket / socket_path)")
    if env.get("SESSIONSTORE_SOCKET"):
        return Choice(env["SESSIONSTORE_SOCKET"], "$SESSIONSTORE_SOCKET")
    contract = default_socket(env, os.getuid() if uid is None else uid)
    if not _is_socket(contract.path) and _is_socket(SYSTEMD_SOCKET):
        return Choice(SYSTEMD_SOCKET, f"the systemd socket (nothing at {contract.path})")
    return contract


def client_socket_path(explicit: str | None = None) -> str:
    return client_socket(explicit).path


def state_dir(explicit: str | None, env: Mapping[str, str]) -> Choice:
    if explicit:
        return Choice(explicit, "--state-dir")
    if env.get("SESSIONSTORED_STATE_DIR"):
        return Choice(env["SESSIONSTORED_STATE_DIR"], "$SESSIONSTORED_STATE_DIR")
    if env.get("STATE_DIRECTORY"):
        return Choice(env["STATE_DIRECTORY"].split(":")[0], "$STATE_DIRECTORY (systemd)")
    if env.get("XDG_STATE_HOME"):
        return Choice(os.path.join(env["XDG_STATE_HOME"], "sessionstored"), "$XDG_STATE_HOME")
    home = env.get("HOME") or os.path.expanduser("~")
    return Choice(os.path.join(home, ".local", "state", "sessionstored"), "the default")
