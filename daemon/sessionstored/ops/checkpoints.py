# Loop and workflow checkpoints: a document per (kind, key), overwritten whole.
from __future__ import annotations

from typing import TYPE_CHECKING

from sessionstore.protocol import RawCBOR, Request, ok_response

from ..prepare import checkpoint_document
from ..steps import Read, Response, Step
from ..storage.mutations import Put, Remove
from .args import checkpoint_kind, id_arg, lease_arg
from .registry import Op

if TYPE_CHECKING:
    from . import Ops


def checkpoint_put(ops: Ops, request: Request) -> Step:
    args = request.args
    kind, id_field = checkpoint_kind(args)
    key = id_arg(args, "key")
    document = checkpoint_document(args, id_field, key, ops.max_snapshot_bytes)
    put = Put(kind, key, document.body, document.digest, fence=lease_arg(args))
    return ops.mutation(request, put, lambda o: ok_response(request, seq=o.seq))


def checkpoint_get(ops: Ops, request: Request) -> Step:
    kind, _ = checkpoint_kind(request.args)
    read = ops.read_document(kind, id_arg(request.args, "key"))

    async def produce() -> Response:
        doc = await read()
        return ok_response(request, value=RawCBOR(doc.body) if doc is not None else None)

    return Read(request, lambda: ops.guarded_read(request, produce))


def checkpoint_delete(ops: Ops, request: Request) -> Step:
    kind, _ = checkpoint_kind(request.args)
    remove = Remove(kind, id_arg(request.args, "key"), fence=lease_arg(request.args))
    return ops.mutation(request, remove, lambda o: ok_response(request, deleted=o.existed))


OPS = (
    Op("checkpoint_put", checkpoint_put, {"kind", "key", "value", "lease"}),
    Op("checkpoint_get", checkpoint_get, {"kind", "key"}, read_only=True),
    Op("checkpoint_delete", checkpoint_delete, {"kind", "key", "lease"}),
)
