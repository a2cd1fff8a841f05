# The arguments of `txn` and `checkpoint_scan` read into storage terms: kinds by
# their wire names, requirements, and ops whose values are already canonical
# and hashed. Plain functions of values, so that a large txn is read in a
# worker process (prepare.py) like a large save.
from __future__ import annotations

from typing import Any

from sessionstore.wire.byte_path import MAP, array_keeping, decode_span, major_type, map_fields
from sessionstore.wire.canonical import (
    Hint,
    canonical_dumps,
    digest_bytes_of_canonical,
    parse_digest,
)
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.shared import MAX_TTL_S, CanonicalItem, Refusal
from sessionstore.wire.value_class import value_class

from ..storage.clock import epoch_ms
from ..storage.documents import NEVER
from ..storage.mutations import KV_DOCUMENT, LOOP_CHECKPOINT, SESSION, WORKFLOW_CHECKPOINT
from ..storage.txn import (
    MAX_KEPT_FIELDS,
    Require,
    TxnAppend,
    TxnDelete,
    TxnDeletePrefix,
    TxnOp,
    TxnPut,
)
from .snapshot import id_problem

MAX_TXN_OPS = 10_000
OP_DOCUMENTS = frozenset({"value"})  # what an op of a txn may carry as CanonicalItem
MAX_TXN_REQUIRES = 1_000

# wire name -> (storage kind, the field of a value that must equal its key, if any)
DOCUMENT_KINDS: dict[str, tuple[str, str | None]] = {
    "loop": (LOOP_CHECKPOINT, "run_id"),
    "workflow": (WORKFLOW_CHECKPOINT, "workflow_id"),
    "kv": (KV_DOCUMENT, None),
}
REQUIRE_KINDS: dict[str, str] = {
    "session": SESSION,
    **{name: kind for name, (kind, _) in DOCUMENT_KINDS.items()},
}
KIND_NAMES: dict[str, str] = {kind: name for name, kind in REQUIRE_KINDS.items()}


@value_class
class PreparedTxn:
    """A txn's requirements and ops, read (in a worker, for a large one)."""

    requires: tuple[Require, ...]
    ops: tuple[TxnOp, ...]


def key_text(value: Any, name: str) -> str:
    problem = id_problem(value)
    if problem:
        raise Refusal(ErrorCode.BAD_REQUEST, f"{name} {problem}")
    assert isinstance(value, str)
    return value


def document_kind(value: Any, where: str = "kind") -> tuple[str, str | None]:
    if not isinstance(value, str) or value not in DOCUMENT_KINDS:
        raise Refusal(ErrorCode.BAD_REQUEST, f"{where} must be 'loop', 'workflow' or 'kv'")
    return DOCUMENT_KINDS[value]


def document_body(
    value: Any,
    id_field: str | None,
    key: str | None,
    limit: int,
    hint: Hint = Hint.NONE,
) -> tuple[bytes, bytes]:
    """A document value's canonical bytes and digest (key None: an appended one); hint:
    the request's (Connection.last_hint)."""
    if isinstance(value, CanonicalItem):
        if major_type(value.data) != MAP:
            raise Refusal(ErrorCode.BAD_REQUEST, "value must be a map")
        span = map_fields(value.data).get(id_field) if id_field is not None else None
        _check_id_field(id_field, decode_span(value.data, span) if span else _ABSENT, key)
        body = value.data
    else:
        if not isinstance(value, dict):
            raise Refusal(ErrorCode.BAD_REQUEST, "value must be a map")
        _check_id_field(id_field, value.get(id_field, _ABSENT) if id_field else _ABSENT, key)
        try:
            body = canonical_dumps(value, hint=hint)
        except (ValueError, TypeError, OverflowError) as error:
            raise Refusal(ErrorCode.BAD_REQUEST, f"cannot encode value: {error}") from None
    if len(body) > limit:
        raise Refusal(ErrorCode.TOO_LARGE, f"value is {len(body)} bytes, over {limit}")
    return body, digest_bytes_of_canonical(body)


_ABSENT: Any = object()


def _check_id_field(id_field: str | None, found: Any, key: str | None) -> None:
    if found is not _ABSENT and found != key:
        raise Refusal(ErrorCode.BAD_REQUEST, f"value.{id_field} {found!r} is not key {key!r}")


def _require(number: int, item: Any) -> Require:
    where = f"require[{number}]"
    if not isinstance(item, dict):
        raise Refusal(ErrorCode.BAD_REQUEST, f"{where} must be a map")
    kind = item.get("kind")
    if not isinstance(kind, str) or kind not in REQUIRE_KINDS:
        names = ", ".join(repr(name) for name in REQUIRE_KINDS)
        raise Refusal(ErrorCode.BAD_REQUEST, f"{where}.kind must be one of {names}")
    key = key_text(item.get("key"), f"{where}.key")
    exists = item.get("exists")
    has_digest = "digest" in item
    if (exists is None) == (not has_digest) or (exists is not None and has_digest):
        message = f"{where} needs exactly one of exists (true/false) or digest"
        raise Refusal(ErrorCode.BAD_REQUEST, message)
    if exists is not None:
        if not isinstance(exists, bool):
            raise Refusal(ErrorCode.BAD_REQUEST, f"{where}.exists must be true or false")
        return Require(REQUIRE_KINDS[kind], key, exists=exists)
    digest = parse_digest(item["digest"])
    if digest is None:
        raise Refusal(
            ErrorCode.BAD_REQUEST, f"{where}.digest must be an 'xxh3-128:<32 hex>' digest"
        )
    return Require(REQUIRE_KINDS[kind], key, digest=digest)


def _op(number: int, item: Any, limit: int, hint: Hint) -> TxnOp:
    where = f"ops[{number}]"
    if not isinstance(item, dict):
        raise Refusal(ErrorCode.BAD_REQUEST, f"{where} must be a map")
    name = item.get("op")
    kind, id_field = document_kind(item.get("kind"), f"{where}.kind")
    if name == "put":
        key = key_text(item.get("key"), f"{where}.key")
        if "value" not in item:
            raise Refusal(ErrorCode.BAD_REQUEST, f"{where}.value is missing")
        if_absent = item.get("if_absent", False)
        if not isinstance(if_absent, bool):
            raise Refusal(ErrorCode.BAD_REQUEST, f"{where}.if_absent must be true or false")
        body, digest = document_body(item["value"], id_field, key, limit, hint)
        keep = _kept_fields(item.get("keep", []), f"{where}.keep")
        return TxnPut(kind, key, body, digest, if_absent, _expiry(item, where), keep)
    if name == "delete":
        return TxnDelete(kind, key_text(item.get("key"), f"{where}.key"))
    if name == "delete_prefix":
        return TxnDeletePrefix(kind, key_text(item.get("prefix"), f"{where}.prefix"))
    if name == "append":
        if id_field is not None:
            raise Refusal(ErrorCode.BAD_REQUEST, f"{where}: append is for kind 'kv'")
        prefix = key_text(item.get("prefix"), f"{where}.prefix")
        if len(prefix.encode("utf-8")) > 1000:
            raise Refusal(ErrorCode.BAD_REQUEST, f"{where}.prefix must be at most 1000 UTF-8 bytes")
        if "value" not in item:
            raise Refusal(ErrorCode.BAD_REQUEST, f"{where}.value is missing")
        body, digest = document_body(item["value"], None, None, limit, hint)
        return TxnAppend(kind, prefix, body, digest, _expiry(item, where))
    message = f"{where}.op must be 'put', 'delete', 'delete_prefix' or 'append'"
    raise Refusal(ErrorCode.BAD_REQUEST, message)


def _kept_fields(names: Any, where: str) -> tuple[str, ...]:
    fits = isinstance(names, list) and len(names) <= MAX_KEPT_FIELDS
    if not fits or not all(isinstance(name, str) and name for name in names):
        message = f"{where} must be an array of at most {MAX_KEPT_FIELDS} field names"
        raise Refusal(ErrorCode.BAD_REQUEST, message)
    return tuple(dict.fromkeys(names))


def _expiry(item: dict[str, Any], where: str) -> int:
    ttl = item.get("ttl_s")
    return NEVER if ttl is None else expiry_from_ttl(ttl, f"{where}.ttl_s")


def expiry_from_ttl(ttl: Any, where: str) -> int:
    """The expires_at_ms of a ttl_s: seconds from now, above 0 and at most MAX_TTL_S."""
    if not isinstance(ttl, int | float) or isinstance(ttl, bool) or not 0 < ttl <= MAX_TTL_S:
        message = f"{where} must be a number of seconds above 0, at most {MAX_TTL_S}"
        raise Refusal(ErrorCode.BAD_REQUEST, message)  # NaN fails the comparison too
    return epoch_ms() + max(1, round(ttl * 1000))


def prepared_txn(
    args: dict[str, Any], max_document_bytes: int, hint: Hint = Hint.NONE
) -> PreparedTxn:
    """hint: the request's (Connection.last_hint), which spares most of the encoding."""
    ops = args.get("ops")
    if isinstance(ops, PreparedTxn):
        return ops  # read in a worker already
    if isinstance(ops, CanonicalItem):  # the values of its puts and appends stay bytes
        ops = array_keeping(ops, OP_DOCUMENTS)
    requires = args.get("require", [])
    if not isinstance(ops, list) or not 1 <= len(ops) <= MAX_TXN_OPS:
        raise Refusal(ErrorCode.BAD_REQUEST, f"ops must be an array of 1 to {MAX_TXN_OPS} maps")
    if not isinstance(requires, list) or len(requires) > MAX_TXN_REQUIRES:
        message = f"require must be an array of at most {MAX_TXN_REQUIRES} maps"
        raise Refusal(ErrorCode.BAD_REQUEST, message)
    return PreparedTxn(
        tuple(_require(n, item) for n, item in enumerate(requires)),
        tuple(_op(n, item, max_document_bytes, hint) for n, item in enumerate(ops)),
    )
