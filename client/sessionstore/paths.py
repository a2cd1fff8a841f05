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

from .errors import UnsafeSocketDirectory

SOCKET_NAME = "sessionstored.sock"
SYSTEMD_SOCKET = f"/run/sessionstored/{SOCKET_NAME}"
FALLBACK = "the fallback: no runtime dir is set"


class Choice(NamedTuple):
    path: str
    reason: str


def default_socket(env: Mapping[str, str], uid: int) -> Choice:
    """The contract's steps 3 to 5 (1 and 2, an explicit path and systemd's fd, are the
    caller's)."""
    if env.get("RUNTIME_DIRECTORY"):
        directory = env["RUNTIME_DIRECTORY"].split(":")[0]
        return Choice(os.path.join(directory, SOCKET_NAME), "$RUNTIME_DIRECTORY, from systemd")
    if env.get("XDG_RUNTIME_DIR"):
        return Choice(os.path.join(env["XDG_RUNTIME_DIR"], SOCKET_NAME), "$XDG_RUNTIME_DIR")
    return Choice(f"/tmp/sessionstored-{uid}/{SOCKET_NAME}", FALLBACK)


def private_dir_problem(directory: str, uid: int) -> str | None:
    """Why a socket directory in a shared place is not safe to use, or None: it must be a
    real directory (not a symlink), ours, and closed to everyone else (mode 0700), as
    ssh-agent and tmux require. Another user who owns it could swap the socket and
    receive every client's snapshots. None also when it does not exist yet."""
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return f"{directory} is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a directory"
    if info.st_uid != uid:
        return f"{directory} belongs to uid {info.st_uid}, not to uid {uid}"
    if info.st_mode & 0o077:
        return f"{directory} has mode {stat.S_IMODE(info.st_mode):04o}, not 0700"
    return None


def refuse_unsafe(choice: Choice, uid: int) -> None:
    """UnsafeSocketDirectory if choice is the /tmp fallback and its directory is unsafe."""
    if choice.reason != FALLBACK:
        return
    problem = private_dir_problem(os.path.dirname(choice.path), uid)
    if problem is not None:
        raise UnsafeSocketDirectory(
            f"{problem}: refusing a socket directory in /tmp that is not ours and 0700 "
            "(remove it, or set XDG_RUNTIME_DIR)"
        )


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
        return Choice(explicit, "given explicitly: --socket or socket_path")
    if env.get("SESSIONSTORE_SOCKET"):
        return Choice(env["SESSIONSTORE_SOCKET"], "$SESSIONSTORE_SOCKET")
    uid = os.getuid() if uid is None else uid
    contract = default_socket(env, uid)
    if not _is_socket(contract.path) and _is_socket(SYSTEMD_SOCKET):
        return Choice(SYSTEMD_SOCKET, f"the systemd socket: nothing is at {contract.path}")
    return contract


def checked_socket(choice: Choice) -> str:
    """The path to connect to, once the /tmp fallback's directory is found safe."""
    refuse_unsafe(choice, os.getuid())
    return choice.path


def state_dir(explicit: str | None, env: Mapping[str, str]) -> Choice:
    if explicit:
        return Choice(explicit, "--state-dir")
    if env.get("SESSIONSTORED_STATE_DIR"):
        return Choice(env["SESSIONSTORED_STATE_DIR"], "$SESSIONSTORED_STATE_DIR")
    if env.get("STATE_DIRECTORY"):
        return Choice(env["STATE_DIRECTORY"].split(":")[0], "$STATE_DIRECTORY, from systemd")
    if env.get("XDG_STATE_HOME"):
        return Choice(os.path.join(env["XDG_STATE_HOME"], "sessionstored"), "$XDG_STATE_HOME")
    home = env.get("HOME") or os.path.expanduser("~")
    return Choice(os.path.join(home, ".local", "state", "sessionstored"), "the default")
