# The writer lease: acquiring bumps the epoch (a takeover), every mutation while
# it exists must carry it (the fence is checked in storage), releasing removes it.
from __future__ import annotations

from typing import Any

import cbor2

from sessionstore.wire.canonical import canonical_dumps
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import Request, ok_response
from sessionstore.wire.shared import Refusal

from ..storage.clock import epoch_ms
from ..storage.mutations import LEASE, LEASE_ID, Rewrite
from .context import OpContext
from .registry import Op
from .snapshot import is_int
from .steps import Read, Response, Step


def lease_acquire(ops: OpContext, request: Request) -> Step:
    holder = request.args.get("holder")
    if not isinstance(holder, str) or not holder:
        raise Refusal(ErrorCode.BAD_REQUEST, "holder must be non-empty text")
    granted: dict[str, Any] = {}

    def apply(current: bytes | None, _source: bytes | None) -> bytes:
        epoch = cbor2.loads(current).get("epoch", 0) if current is not None else 0
        granted.update(holder=holder, epoch=epoch + 1, acquired_at_ms=epoch_ms())
        return canonical_dumps(granted)

    rewrite = Rewrite(LEASE, LEASE_ID, apply, decides_lease=True, exclusive=True)
    return ops.mutation(request, rewrite, lambda o: ok_response(request, **granted))


def lease_get(ops: OpContext, request: Request) -> Step:
    async def read() -> Response:
        lease = await ops.current_lease()
        if not lease or lease.get("holder") is None:
            return ok_response(request, lease=None)
        fields = ("holder", "epoch", "acquired_at_ms")
        return ok_response(request, lease={k: lease.get(k) for k in fields})

    return Read(request, lambda: ops.guarded_read(request, read))


def lease_release(ops: OpContext, request: Request) -> Step:
    holder, epoch = request.args.get("holder"), request.args.get("epoch")
    if not isinstance(holder, str) or not holder or not is_int(epoch):
        raise Refusal(
            ErrorCode.BAD_REQUEST, "lease_release needs holder (text) and epoch (integer)"
        )

    def apply(current: bytes | None, _source: bytes | None) -> bytes | None:
        lease = cbor2.loads(current) if current is not None else {}
        if lease.get("holder") != holder or lease.get("epoch") != epoch:
            return None
        return canonical_dumps({"holder": None, "epoch": epoch, "released_at_ms": epoch_ms()})

    rewrite = Rewrite(LEASE, LEASE_ID, apply, decides_lease=True, exclusive=True)
    return ops.mutation(request, rewrite, lambda o: ok_response(request, released=o.changed))


OPS = (
    Op("lease_acquire", lease_acquire, {"holder"}),
    Op("lease_get", lease_get, set(), read_only=True),
    Op("lease_release", lease_release, {"holder", "epoch"}),
)
