# The op table (every module's OPS) and dispatch(), which looks an op up, checks
# access, and runs its handler on the handlers' shared context (OpContext), a refusal
# turned into its reply.
from __future__ import annotations

from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import Request, error_response

from ..access import Access
from . import admin, backup, checkpoints, leases, rank, sessions
from .context import OpContext
from .registry import Op
from .steps import Reply, Step

REGISTRY: dict[str, Op] = {
    op.name: op
    for module in (sessions, checkpoints, rank, leases, admin, backup)
    for op in module.OPS
}
ARGUMENTS = {name: frozenset(op.arguments) for name, op in REGISTRY.items()}
DOCUMENTS = {name: op.documents for name, op in REGISTRY.items() if op.documents}
PREPARERS = {name: op.prepare for name, op in REGISTRY.items() if op.prepare is not None}


def dispatch(ops: OpContext, request: Request, access: Access = Access.FULL) -> Step:
    op = REGISTRY.get(request.op)
    if op is None:
        message = f"unknown op {request.op!r}"
        return Reply(request, error_response(request, ErrorCode.UNKNOWN_OP, message))
    if access is Access.READ_ONLY and (
        not op.read_only or any(name in request.args for name in op.writes_with)
    ):
        message = f"op {request.op!r} needs write access; this peer may only read"
        return Reply(request, error_response(request, ErrorCode.UNAUTHORIZED, message))
    return ops.handled(request, lambda: op.handle(ops, request))
