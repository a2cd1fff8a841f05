# sd_notify(3) without a dependency: one datagram to $NOTIFY_SOCKET. Never raises.
from __future__ import annotations

import os
import socket


def notify(*fields: str, environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(fields).encode("utf-8", "replace"))
        return True
    except OSError:
        return False


def watchdog_interval_s(environ: dict[str, str] | None = None) -> float | None:
    """Half of WATCHDOG_USEC when the watchdog is meant for this process, else None."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None
