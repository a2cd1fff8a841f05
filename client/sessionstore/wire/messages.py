# The message envelope of the wire contract: what makes an item a request, the
# shape of replies, and encoding a message in either dialect.
from __future__ import annotations

from typing import Any

import cbor2

from . import cbor_bytes, jsonform
from .canonical import Hint, canonical_dumps
from .codes import ErrorCode
from .shared import Mode, Refusal
from .value_class import value_class

PROTOCOL_VERSION = 1


@value_class
class RawCBOR:
    """Bytes that already are one encoded CBOR item, spliced into a message as they are."""

    data: bytes


def _encode_raw(encoder: Any, value: Any) -> None:
    if isinstance(value, RawCBOR):
        encoder.write(value.data)
        return
    raise cbor2.CBOREncodeTypeError(f"cannot encode {type(value).__name__}")


def encode(message: Any, mode: Mode) -> bytes:
    if mode is Mode.JSON:
        return jsonform.dumps(message).encode() + b"\n"
    return bytes(cbor2.dumps(message, default=_encode_raw))


def encode_request(message: Any, mode: Mode) -> bytes:
    """A client's request. In CBOR, canonical where the compiled helper runs: the daemon
    then stores its documents as they arrive, checked in one pass over their bytes.
    Elsewhere plain: the daemon's decoder path canonicalises every document anyway."""
    if mode is Mode.CBOR and cbor_bytes.compiled:
        return canonical_dumps(message)
    return encode(message, mode)


SCALAR_TYPES = (str, int, float, bool, bytes, type(None))


@value_class
class Request:
    op: str
    args: dict[str, Any]
    rid: Any = None
    has_rid: bool = False
    canonical_hint: Hint = Hint.NONE  # see Connection.last_hint


def parse_request(message: Any, *, canonical_hint: Hint = Hint.NONE) -> Request:
    """Classify a decoded item as a request; a well-framed but wrong item is a soft error."""
    if not isinstance(message, dict):
        raise Refusal(ErrorCode.BAD_REQUEST, "a request must be a map", fatal=False)
    if not all(isinstance(key, str) for key in message):
        raise Refusal(ErrorCode.BAD_REQUEST, "request keys must be text", fatal=False)
    op = message.get("op")
    if not isinstance(op, str) or not op:
        raise Refusal(ErrorCode.BAD_REQUEST, "missing or non-text 'op'", fatal=False)
    has_rid = "rid" in message
    rid = message.get("rid")
    if has_rid and not isinstance(rid, SCALAR_TYPES):
        raise Refusal(ErrorCode.BAD_REQUEST, "'rid' must be a scalar", fatal=False)
    return Request(op=op, args=message, rid=rid, has_rid=has_rid, canonical_hint=canonical_hint)


def ok_response(request: Request | None, **fields: Any) -> dict[str, Any]:
    response: dict[str, Any] = {"ok": True}
    if request is not None and request.has_rid:
        response["rid"] = request.rid
    response.update(fields)
    return response


def error_response(
    request: Request | None, code: ErrorCode, message: str, **details: Any
) -> dict[str, Any]:
    response: dict[str, Any] = {"ok": False}
    if request is not None and request.has_rid:
        response["rid"] = request.rid
    response["error"] = {"code": code, "message": message, **details}
    return response


def refusal_response(request: Request | None, refusal: Refusal, **extra: Any) -> dict[str, Any]:
    """The error reply a refusal makes: its code, message and details (and extra)."""
    return error_response(request, refusal.code, refusal.message, **refusal.details, **extra)
