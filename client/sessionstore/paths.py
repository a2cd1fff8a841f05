# The socket search of the wire contract, steps 3 to 5 (steps 1 and 2 belong to
# the caller: an explicit path or SESSIONSTORE_SOCKET, and systemd's fd).
from __future__ import annotations

import os
from collections.abc import Mapping

SOCKET_NAME = "sessionstored.sock"


def default_socket_path(env: Mapping[str, str], uid: int) -> str:
    if env.get("RUNTIME_DIRECTORY"):
        return os.path.join(env["RUNTIME_DIRECTORY"].split(":")[0], SOCKET_NAME)
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], SOCKET_NAME)
    return f"/tmp/sessionstored-{uid}/{SOCKET_NAME}"


def client_socket_path(explicit: str | None = None) -> str:
    return (
        explicit
        or os.environ.get("SESSIONSTORE_SOCKET")
        or default_socket_path(os.environ, os.getuid())
    )
