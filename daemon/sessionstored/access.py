# Who may talk to the daemon (the contract's "Access control"): every
# connection's peer credentials come from SO_PEERCRED. Allowed by default: the
# daemon's own uid, uid 0, and peers whose gid is the daemon's gid; more with
# --allow-uid/--allow-gid. A peer named by --read-only-uid/--read-only-gid may
# only read. Anyone else gets one `unauthorized` reply and is disconnected.
from __future__ import annotations

import enum
import socket
import struct
from dataclasses import dataclass

UCRED = struct.Struct("3i")  # pid, uid, gid


class Access(enum.Enum):
    FULL = "full"
    READ_ONLY = "read_only"
    NONE = "none"


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


@dataclass(frozen=True)
class AccessPolicy:
    daemon_uid: int
    daemon_gid: int
    allow_uids: frozenset[int] = frozenset()
    allow_gids: frozenset[int] = frozenset()
    read_only_uids: frozenset[int] = frozenset()
    read_only_gids: frozenset[int] = frozenset()

    def decide(self, peer: Peer) -> Access:
        if peer.uid in self.read_only_uids or peer.gid in self.read_only_gids:
            return Access.READ_ONLY
        if (
            peer.uid in (self.daemon_uid, 0)
            or peer.gid == self.daemon_gid
            or peer.uid in self.allow_uids
            or peer.gid in self.allow_gids
        ):
            return Access.FULL
        return Access.NONE


def peer_of(sock: socket.socket) -> Peer | None:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
    except OSError:
        return None
    pid, uid, gid = UCRED.unpack(raw)
    return Peer(pid, uid, gid)
