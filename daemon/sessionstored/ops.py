# Request -> Step. A Step is what a connection does with one request, in order:
# an immediate response, a job for the writer whose outcome becomes the
# response, or a read evaluated when every earlier request on the connection
# has been answered (so a pipelined load sees the save sent before it).
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sessionstore.canonical import (
    canonical_dumps,
    digest_bytes_of_canonical,
    digest_text,
    parse_digest,
)
from sessionstore.protocol import PROTOCOL_VERSION, RawCBOR, Request, error_response, ok_response

from . import __version__
from .snapshot import InvalidSnapshot, id_problem, validate_snapshot
from .storage.check import check
from .storage.files import CorruptDocument
from .storage.index import SESSION
from .storage.store import ANY, Outcome, Put, ReadRace, Remove, Store
from .writer import Job, Writer

log = logging.getLogger("sessionstored.ops")

LIST_DEFAULT_LIMIT = 1000
LIST_MAX_LIMIT = 10000
READ_RACE_RETRIES = 3
READ_OPS = frozenset(
    {
        "hello",
        "ping",
        "load",
        "head",
        "exists",
        "list",
        "checkpoint_get",
        "lease_get",
        "watch",
        "stats",
        "verify",
    }
)


class RequestError(Exception):
    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


Response = dict[str, Any]


@dataclass
class Step:
    request: Request | None
    response: Response | None = None
    job: Job | None = None
    on_outcome: Callable[[Outcome], Response] | None = None
    read: Callable[[], Awaitable[Response]] | None = None

    async def resolve(self) -> Response:
        if self.response is not None:
            return self.response
        if self.read is not None:
            return await self.read()
        assert self.job is not None
        await self.job.done.wait()
        if self.job.exclusive is not None and self.job.outcome is None:
            if self.job.error is not None:
                raise self.job.error
            result: Response = self.job.result
            return result
        assert self.job.outcome is not None and self.on_outcome is not None
        return self.on_outcome(self.job.outcome)


def _session_id_arg(args: dict[str, Any], name: str = "session_id") -> str:
    value = args.get(name)
    problem = id_problem(value)
    if problem:
        raise RequestError("bad_request", f"{name} {problem}")
    assert isinstance(value, str)
    return value


def _expect_arg(args: dict[str, Any]) -> Any:
    if "expect" not in args:
        return ANY
    expect = args["expect"]
    if expect is None:
        return None
    digest = parse_digest(expect)
    if digest is None:
        raise RequestError("bad_request", "expect must be null or an 'xxh3-128:<32 hex>' digest")
    return digest


def _text_digest(raw: bytes | None) -> str | None:
    return None if raw is None else digest_text(raw)


class Ops:
    def __init__(
        self,
        store: Store,
        writer: Writer,
        *,
        max_snapshot_bytes: int,
        max_request_bytes: int,
        stats_extra: Callable[[], dict[str, Any]],
    ) -> None:
        self.store = store
        self.writer = writer
        self.max_snapshot_bytes = max_snapshot_bytes
        self.max_request_bytes = max_request_bytes
        self.stats_extra = stats_extra
        self.started = time.monotonic()
        self._handlers: dict[str, Callable[[Request], Step]] = {
            "hello": self._hello,
            "ping": lambda r: Step(r, ok_response(r)),
            "save": self._save,
            "load": self._load,
            "head": self._head,
            "exists": self._exists,
            "list": self._list,
            "delete": self._delete,
            "stats": self._stats,
            "verify": self._verify,
        }

    def dispatch(self, request: Request) -> Step:
        handler = self._handlers.get(request.op)
        if handler is None:
            return Step(
                request, error_response(request, "unknown_op", f"unknown op {request.op!r}")
            )
        try:
            return handler(request)
        except RequestError as error:
            return Step(
                request, error_response(request, error.code, error.message, **error.details)
            )

    # -- read ops ------------------------------------------------------------

    def _hello(self, request: Request) -> Step:
        return Step(
            request,
            ok_response(
                request,
                protocol=PROTOCOL_VERSION,
                server=f"sessionstored/{__version__}",
                capabilities={
                    "atomic_session_snapshots": True,
                    "aggregate_cas": True,
                    "append_only_event_log": True,
                    "lease_fencing": False,
                    "encrypted_at_rest": False,
                    "watch": False,
                },
                limits={
                    "max_request_bytes": self.max_request_bytes,
                    "max_snapshot_bytes": self.max_snapshot_bytes,
                },
            ),
        )

    def _load(self, request: Request) -> Step:
        session_id = _session_id_arg(request.args)

        async def read() -> Response:
            for _ in range(READ_RACE_RETRIES):
                try:
                    doc = self.store.read(SESSION, session_id)
                except ReadRace:
                    await self.writer.wait_published()
                    continue
                except (CorruptDocument, OSError) as error:
                    log.error("load %r: %s", session_id, error)
                    return error_response(request, "io_error", str(error))
                if doc is None:
                    return ok_response(request, snapshot=None, digest=None, seq=None)
                return ok_response(
                    request, snapshot=RawCBOR(doc.body), digest=digest_text(doc.digest), seq=doc.seq
                )
            return error_response(request, "overloaded", "session kept changing while being read")

        return Step(request, read=read)

    def _head(self, request: Request) -> Step:
        session_id = _session_id_arg(request.args)

        async def read() -> Response:
            entry = self.store.head(SESSION, session_id)
            if entry is None:
                return ok_response(request, found=False, digest=None, seq=None, size=None)
            return ok_response(
                request,
                found=True,
                digest=digest_text(entry.digest),
                seq=entry.seq,
                size=entry.size,
            )

        return Step(request, read=read)

    def _exists(self, request: Request) -> Step:
        session_id = _session_id_arg(request.args)

        async def read() -> Response:
            return ok_response(request, exists=self.store.head(SESSION, session_id) is not None)

        return Step(request, read=read)

    def _list(self, request: Request) -> Step:
        args = request.args
        prefix = args.get("prefix", "")
        after = args.get("after")
        limit = args.get("limit", LIST_DEFAULT_LIMIT)
        if prefix is None:
            prefix = ""
        if not isinstance(prefix, str):
            raise RequestError("bad_request", "prefix must be text")
        if after is not None and not isinstance(after, str):
            raise RequestError("bad_request", "after must be text or null")
        if (
            not isinstance(limit, int)
            or isinstance(limit, bool)
            or not 1 <= limit <= LIST_MAX_LIMIT
        ):
            raise RequestError(
                "bad_request", f"limit must be an integer from 1 to {LIST_MAX_LIMIT}"
            )

        async def read() -> Response:
            ids, cursor = self.store.index.list_sessions(prefix, after, limit)
            return ok_response(request, ids=ids, next=cursor)

        return Step(request, read=read)

    def _stats(self, request: Request) -> Step:
        async def read() -> Response:
            return ok_response(
                request,
                sessions=self.store.session_count(),
                seq=self.store.seq,
                wal_bytes=self.store.wal.size_bytes,
                uptime_s=round(time.monotonic() - self.started, 3),
                **self.stats_extra(),
            )

        return Step(request, read=read)

    def _verify(self, request: Request) -> Step:
        def run_check() -> Response:
            checked, problems = check(self.store)
            return ok_response(request, checked=checked, problems=problems)

        return Step(
            request, job=Job(exclusive=run_check), on_outcome=lambda o: self._failure(request, o)
        )

    # -- mutations -----------------------------------------------------------

    def _save(self, request: Request) -> Step:
        snapshot = request.args.get("snapshot")
        try:
            session_id = validate_snapshot(snapshot)
            body = canonical_dumps(snapshot)
        except InvalidSnapshot as error:
            raise RequestError("invalid_snapshot", str(error)) from None
        except (ValueError, TypeError, OverflowError) as error:
            raise RequestError("invalid_snapshot", f"cannot encode snapshot: {error}") from None
        if len(body) > self.max_snapshot_bytes:
            raise RequestError(
                "too_large",
                f"snapshot is {len(body)} bytes, over max_snapshot_bytes={self.max_snapshot_bytes}",
            )
        digest = digest_bytes_of_canonical(body)
        job = Job(Put(SESSION, session_id, body, digest, _expect_arg(request.args)))

        def respond(outcome: Outcome) -> Response:
            if not outcome.ok:
                return self._failure(request, outcome)
            return ok_response(request, digest=digest_text(digest), seq=outcome.seq)

        return Step(request, job=job, on_outcome=respond)

    def _delete(self, request: Request) -> Step:
        session_id = _session_id_arg(request.args)
        job = Job(Remove(SESSION, session_id, _expect_arg(request.args)))

        def respond(outcome: Outcome) -> Response:
            if not outcome.ok:
                return self._failure(request, outcome)
            return ok_response(request, deleted=outcome.existed, seq=outcome.seq)

        return Step(request, job=job, on_outcome=respond)

    @staticmethod
    def _failure(request: Request, outcome: Outcome) -> Response:
        code = outcome.code or "internal"
        if code == "conflict":
            return error_response(
                request,
                code,
                "expect does not match the current digest",
                current=_text_digest(outcome.current),
            )
        return error_response(request, code, outcome.message or code)
