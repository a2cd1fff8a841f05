# Parsers for the arguments several ops share: ids, `expect`, `lease`, checkpoint
# kinds. Each raises Refusal(bad_request) with a message naming the argument.
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sessionstore.wire.canonical import digest_text, parse_digest
from sessionstore.wire.codes import ErrorCode
from sessionstore.wire.protocol import Request, ok_response
from sessionstore.wire.shared import Refusal

from ..storage.mutations import ANY, Expect, Fence, Outcome
from .document_arguments import document_kind, expiry_from_ttl, key_text
from .snapshot import is_int
from .steps import Response


def id_arg(args: dict[str, Any], name: str) -> str:
    return key_text(args.get(name), name)


def expect_arg(args: dict[str, Any]) -> Expect:
    if "expect" not in args:
        return ANY
    expect = args["expect"]
    if expect is None:
        return None
    digest = parse_digest(expect)
    if digest is None:
        raise Refusal(ErrorCode.BAD_REQUEST, "expect must be null or an 'xxh3-128:<32 hex>' digest")
    return digest


def lease_arg(args: dict[str, Any]) -> Fence:
    lease = args.get("lease")
    if lease is None:
        return ANY
    if not isinstance(lease, dict):
        raise Refusal(ErrorCode.BAD_REQUEST, "lease must be a map {holder, epoch}")
    holder, epoch = lease.get("holder"), lease.get("epoch")
    if not isinstance(holder, str) or not holder or not is_int(epoch):
        raise Refusal(ErrorCode.BAD_REQUEST, "lease must be {holder: text, epoch: integer}")
    return (holder, epoch)


def prefix_arg(args: dict[str, Any]) -> str:
    """`prefix`: text; left out or null is the empty prefix. Anything else (false, 0, an
    empty array) is refused, not read as empty."""
    prefix = args.get("prefix")
    if prefix is None:
        return ""
    if not isinstance(prefix, str):
        raise Refusal(ErrorCode.BAD_REQUEST, "prefix must be text or null")
    return prefix


def at_arg(args: dict[str, Any]) -> int | None:
    """`at`: a seq, for a read or a write of the generation that was current then."""
    at = args.get("at")
    if at is None:
        return None
    if not is_int(at) or at < 0:
        raise Refusal(ErrorCode.BAD_REQUEST, "at must be a seq (an integer, 0 or more)")
    return at


def ttl_arg(args: dict[str, Any]) -> int | None:
    """The expires_at_ms that `ttl_s` gives, or None when it is left out."""
    if args.get("ttl_s") is None:
        return None
    return expiry_from_ttl(args["ttl_s"], "ttl_s")


class Refresh:
    """A read's refresh_ttl_s: the expiry it gives, taken when the refresh is decided."""

    def __init__(self, ttl_s: Any) -> None:
        self.ttl_s = ttl_s
        expiry_from_ttl(ttl_s, "refresh_ttl_s")  # refuses a bad one before the read
        self.expires_at_ms = 0

    def __call__(self) -> int:
        self.expires_at_ms = expiry_from_ttl(self.ttl_s, "refresh_ttl_s")
        return self.expires_at_ms


def refresh_arg(args: dict[str, Any]) -> Refresh | None:
    """LangGraph's refresh_on_read: the documents a read finds with an expiry get one
    refresh_ttl_s from now (those without keep none)."""
    if args.get("refresh_ttl_s") is None:
        return None
    return Refresh(args["refresh_ttl_s"])


def expires_field(expires_at_ms: int) -> dict[str, int]:
    """A reply's expires_at_ms, there only for a generation that expires."""
    return {"expires_at_ms": expires_at_ms} if expires_at_ms else {}


def checkpoint_kind(args: dict[str, Any]) -> tuple[str, str | None]:
    return document_kind(args.get("kind"))


def rewritten_reply(request: Request) -> Callable[[Outcome], Response]:
    """The reply to a session Rewrite (update, fork): the new generation's digest and seq."""
    return lambda outcome: ok_response(
        request, digest=digest_text(outcome.digest or b""), seq=outcome.seq
    )
