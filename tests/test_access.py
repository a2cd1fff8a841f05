# The peer access policy (SO_PEERCRED): who may write, who may only read.
from __future__ import annotations

from sessionstored.access import Access, AccessPolicy, Peer


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
