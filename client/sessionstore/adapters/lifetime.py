# Expiry for a group of documents that lives and dies whole: a LangGraph
# thread (its checkpoints, writes and markers), an Agents session (its items).
# The group is gone `ttl` after its last write (or, with refresh_on_read, its
# last read), all of it at once, and never half.
#
# The daemon expires documents one by one, and renewing every member of a
# group at every write would cost a write per member. Instead each group has
# one lifetime document, its life key, whose value is {"horizon": H} and whose
# own expiry is the group's: last write (or read) + ttl. Every member is
# written to expire at H or later, and the lifetime is only ever set to expire
# at least RENEW_MARGIN before H. So:
#   - while the lifetime lives, every member does: a reader that finds it sees
#     the whole group;
#   - once it has expired, the group is gone for every read through the
#     adapters at that moment, whatever members the daemon still holds (they
#     carry an expiry, so a reader tells them from a group that never had a
#     ttl); the daemon's sweep removes them at H, at most 2 x ttl later.
#     Documents without an expiry are not the expired lifetime's: written
#     since, by a writer without a ttl, they are read at once (reads show
#     what the sweep will leave: untimed());
#   - a write puts its members (expiring at H) and the lifetime (ttl from now)
#     in one txn that requires the lifetime to be the generation {"horizon": H}
#     it expects, so it never renews a lifetime another process changed or
#     that expired meanwhile.
# When H comes within RENEW_BEFORE of now, a renewal moves it to now + HORIZON:
# every member is extended with `expire`, the lifetime is replaced (compare and
# swap), and members that a racing writer committed with the old H meanwhile
# are extended once more. A renewal costs one `expire` per member, once per
# HORIZON - RENEW_BEFORE of activity; a write costs nothing per member.
#
# A write to a group whose lifetime is absent first deletes the members an
# expired lifetime left behind (those that carry an expiry); members with none
# were written without a ttl, and the group adopts them (they are extended to H).
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .. import requests as r
from ..errors import Conflict, SessionStoreError
from ..wire.canonical import canonical_dumps, digest_bytes_of_canonical, digest_text
from ..wire.shared import MAX_TTL_S
from .plans import KIND, SCAN_PAGE, TXN_OPS, Plan, put_op

HORIZON_TTLS = 3  # a renewal sets H to now + 3 x ttl
RENEW_BEFORE_TTLS = 1.5  # ... when H is less than 1.5 x ttl away
EXPIRES_PER_ROUND_TRIP = 1000  # the `expire` calls of a renewal, pipelined
COMMIT_ATTEMPTS = 16  # while other processes keep renewing or expiring the group

Items = list[dict[str, Any]]  # range-read items: {key, seq, digest, expires_at_ms?, ...}
Members = Callable[[], Plan[Items]]  # every member of the group, values left out


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def digest_of(value: dict[str, Any]) -> str:
    """The digest the daemon gives a stored kv value (of its canonical CBOR)."""
    return digest_text(digest_bytes_of_canonical(canonical_dumps(value)))


def timed(items: Items) -> bool:
    return any("expires_at_ms" in item for item in items)


def untimed(items: Items) -> Items:
    """Of a group whose lifetime has expired, the documents that outlive it: those
    without an expiry. The others are its leftovers, gone for every read."""
    return [item for item in items if "expires_at_ms" not in item]


def every_item(prefix: str, after: str | None = None, *, values: bool = True) -> Plan[Items]:
    items: Items = []
    while True:
        (page,) = yield [r.checkpoint_scan(KIND, prefix, after, limit=SCAN_PAGE, values=values)]
        items += page["items"]
        after = page["next"]
        if after is None:
            return items


def in_txns(ops: list[dict[str, Any]], require: list[dict[str, Any]] | None = None) -> Plan[None]:
    """The ops in order, in txns of at most TXN_OPS, each under require; nothing for none."""
    for start in range(0, len(ops), TXN_OPS):
        yield [r.txn(ops[start : start + TXN_OPS], require or [])]


def required(key: str, value: dict[str, Any] | None) -> dict[str, Any]:
    """The requirement that the document at key is as read: this value, or absent."""
    if value is None:
        return {"kind": KIND, "key": key, "exists": False}
    return {"kind": KIND, "key": key, "digest": digest_of(value)}


def group_gone(life_key: str, items: Items) -> Plan[bool]:
    """For a reader without a ttl of its own: whether the group these items (read
    just now) belong to has expired. Only a group with expiring members is asked."""
    if not timed(items):
        return False
    (life,) = yield [r.checkpoint_get(KIND, life_key)]
    return life is None


def lapsed(lifetime: Lifetime | None, life_key: str) -> Plan[bool]:
    """Whether a group with this lifetime (None: it has none) has expired: its timed
    documents that remain are leftovers."""
    if lifetime is None:
        return False
    (life,) = yield [lifetime.guard(life_key)]
    return life is None


class Lifetime:
    def __init__(self, ttl_s: float, refresh_on_read: bool = False) -> None:
        longest = MAX_TTL_S / HORIZON_TTLS  # the members' expiry is at most the daemon's
        if (
            isinstance(ttl_s, bool)
            or not isinstance(ttl_s, int | float)
            or not 0 < ttl_s <= longest
        ):
            raise ValueError(f"a ttl must be above 0 and at most {longest:.0f} s, not {ttl_s!r}")
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self.refresh_on_read = refresh_on_read
        self.horizon_ms = HORIZON_TTLS * self.ttl_ms
        self.renew_before_ms = round(RENEW_BEFORE_TTLS * self.ttl_ms)
        self.horizons: dict[str, int] = {}  # life key: the H last seen, in this process

    # -- reading --------------------------------------------------------------------

    def guard(self, life_key: str) -> r.Call[Any]:
        """The read of the lifetime, to send with the group's reads (the lifetime first:
        a read that finds it finds every member alive). With refresh_on_read it renews
        the lifetime, which after_read makes safe."""
        refresh = self.ttl_ms / 1000 if self.refresh_on_read else r.UNSET
        return r.checkpoint_get(KIND, life_key, refresh)

    def gone(self, life: dict[str, Any] | None, items: Items) -> bool:
        """Whether the group is gone, from its lifetime as guard read it and the members
        read with it: expired when the lifetime is absent and members carry an expiry."""
        return life is None and timed(items)

    def after_read(
        self, life_key: str, life: dict[str, Any] | None, members: Members
    ) -> Plan[None]:
        """After a read that found the lifetime: renew it when H has come near (a refresh
        may have set the lifetime's expiry beyond a horizon another process set)."""
        if life is None:
            return
        self.horizons[life_key] = life["horizon"]
        if self.refresh_on_read and life["horizon"] - now_ms() < self.renew_before_ms:
            yield from self.commit(life_key, [], [], members)

    # -- writing --------------------------------------------------------------------

    def commit(
        self,
        life_key: str,
        ops: list[dict[str, Any]],
        require: list[dict[str, Any]],
        members: Members,
    ) -> Plan[dict[str, Any]]:
        """The txn of ops (at most TXN_OPS - 1) under require, with the group's lifetime
        renewed: its puts and appends expire at H, the lifetime ttl from now. A conflict
        on one of the caller's requirements is raised as it came."""
        for _attempt in range(COMMIT_ATTEMPTS):
            horizon = self.horizons.get(life_key)
            if horizon is None or horizon - now_ms() < self.renew_before_ms:
                horizon, expected = yield from self._settle(life_key, members)
            else:
                expected = {
                    "kind": KIND,
                    "key": life_key,
                    "digest": digest_of({"horizon": horizon}),
                }
            try:
                (result,) = yield [
                    r.txn(
                        [*self._expiring(ops, horizon), self._life_put(life_key, horizon)],
                        [*require, expected],
                    )
                ]
            except Conflict as error:
                if error.details.get("failed") != len(require):
                    raise
                self.horizons.pop(life_key, None)  # changed meanwhile: read it again
                continue
            self.horizons[life_key] = horizon
            return result  # type: ignore[no-any-return]
        raise SessionStoreError(f"the lifetime {life_key!r} kept changing under this write")

    def _expiring(self, ops: list[dict[str, Any]], horizon: int) -> list[dict[str, Any]]:
        ttl_s = (horizon - now_ms()) / 1000
        return [{**op, "ttl_s": ttl_s} if op["op"] in ("put", "append") else op for op in ops]

    def _life_put(self, life_key: str, horizon: int) -> dict[str, Any]:
        return put_op(life_key, {"horizon": horizon}, ttl_s=self.ttl_ms / 1000)

    def _settle(self, life_key: str, members: Members) -> Plan[tuple[int, dict[str, Any]]]:
        """The horizon to write with, and the requirement on the lifetime that keeps it
        true: the lifetime as stored when its H is far enough, else after a renewal."""
        (life,) = yield [r.checkpoint_get(KIND, life_key)]
        if life is not None and life["horizon"] - now_ms() >= self.renew_before_ms:
            return life["horizon"], required(life_key, life)
        absent = required(life_key, None)
        expected = required(life_key, life)
        found = yield from members()
        if life is None and timed(found):  # left by an expired lifetime: gone, the rest stays
            leftovers = [i for i in found if "expires_at_ms" in i]
            yield from in_txns([{"op": "delete", "kind": KIND, "key": i["key"]} for i in leftovers],
                               [absent])  # fmt: skip
            found = untimed(found)
        horizon = now_ms() + self.horizon_ms
        yield from self._extend(found, horizon)
        if life is not None:  # replace it now, so that writers with the old H retry
            try:
                yield [r.txn([self._life_put(life_key, horizon)], [expected])]
            except Conflict:
                return (yield from self._settle(life_key, members))  # renewed by another
            yield from self._extend((yield from members()), horizon)  # raced writers' members
            expected = required(life_key, {"horizon": horizon})
        return horizon, expected

    def _extend(self, items: Items, horizon: int) -> Plan[None]:
        """Every member that expires before the horizon (or never) made to expire at it."""
        short = [i["key"] for i in items if i.get("expires_at_ms", 0) < horizon]
        for start in range(0, len(short), EXPIRES_PER_ROUND_TRIP):
            ttl_s = (horizon - now_ms()) / 1000
            keys = short[start : start + EXPIRES_PER_ROUND_TRIP]
            yield [r.expire(None, ttl_s, KIND, key) for key in keys]
