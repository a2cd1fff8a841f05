# Request -> Step. A Step is what a connection does with one request, in order:
# an immediate response, a job for the writer whose outcome becomes the
# response, a read evaluated when every earlier request on the connection has
# been answered (so a pipelined load sees the save sent before it), or a
# stream (watch) that takes over the connection's replies.
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import cbor2

from sessionstore.canonical import (
    canonical_dumps,
    digest_text,
    parse_digest,
)
from sessionstore.codes import ErrorCode
from sessionstore.protocol import PROTOCOL_VERSION, RawCBOR, Request, error_response, ok_response

from . import __version__
from .jobs import ExclusiveJob, MutationJob
from .offload import OFFLOAD_ABOVE_BYTES, Offload
from .prepare import (
    Encoded,
    checkpoint_document,
    forked_body,
    snapshot_document,
    updated_body,
)
from .snapshot import UPDATABLE, InvalidSnapshot, id_problem
from .steps import Exclusive, Read, Reply, Response, Step, Stream, Write
from .storage.errors import CorruptRecord, InjectedFault, NoSpace, Refused
from .storage.mutations import (
    ANY,
    LEASE,
    LEASE_ID,
    LOOP_CHECKPOINT,
    SESSION,
    WORKFLOW_CHECKPOINT,
    Mutation,
    Outcome,
    Put,
    Remove,
    Rewrite,
)
from .storage.store import Store
from .watch import Broadcaster, Sink
from .writer import Writer

log = logging.getLogger("sessionstored.ops")

LIST_DEFAULT_LIMIT = 1000
LIST_MAX_LIMIT = 10000
CHECKPOINT_KINDS = {
    "loop": (LOOP_CHECKPOINT, "run_id"),
    "workflow": (WORKFLOW_CHECKPOINT, "workflow_id"),
}
READ_ONLY_OPS = frozenset(
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


# -- argument parsing --------------------------------------------------------


def _id_arg(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    problem = id_problem(value)
    if problem:
        raise Refused(ErrorCode.BAD_REQUEST, f"{name} {problem}")
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
        raise Refused(ErrorCode.BAD_REQUEST, "expect must be null or an 'xxh3-128:<32 hex>' digest")
    return digest


def _lease_arg(args: dict[str, Any]) -> Any:
    lease = args.get("lease")
    if lease is None:
        return ANY
    if not isinstance(lease, dict):
        raise Refused(ErrorCode.BAD_REQUEST, "lease must be a map {holder, epoch}")
    holder, epoch = lease.get("holder"), lease.get("epoch")
    if not isinstance(holder, str) or not holder or not _is_int(epoch):
        raise Refused(ErrorCode.BAD_REQUEST, "lease must be {holder: text, epoch: integer}")
    return (holder, epoch)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checkpoint_kind(args: dict[str, Any]) -> tuple[str, str]:
    kind = args.get("kind")
    if not isinstance(kind, str) or kind not in CHECKPOINT_KINDS:
        raise Refused(ErrorCode.BAD_REQUEST, "kind must be 'loop' or 'workflow'")
    return CHECKPOINT_KINDS[kind]


def _rewritten_reply(request: Request) -> Callable[[Outcome], Response]:
    """The reply to a session Rewrite (update, fork): the new generation's digest and seq."""
    return lambda outcome: ok_response(
        request, digest=digest_text(outcome.digest or b""), seq=outcome.seq
    )


class Ops:
    def __init__(
        self,
        store: Store,
        writer: Writer,
        broadcaster: Broadcaster,
        *,
        max_snapshot_bytes: int,
        max_request_bytes: int,
        stats_extra: Callable[[], dict[str, Any]],
        offload: Offload | None = None,
    ) -> None:
        self.offload = offload or Offload()
        self.store = store
        self.writer = writer
        self.broadcaster = broadcaster
        self.max_snapshot_bytes = max_snapshot_bytes
        self.max_request_bytes = max_request_bytes
        self.stats_extra = stats_extra
        self.started = time.monotonic()
        self.internal_errors = 0  # our bugs answered as `internal`; the tests watch it
        self._handlers: dict[str, Callable[[Request], Step]] = {
            "hello": self._hello,
            "ping": lambda r: Reply(r, ok_response(r)),
            "save": self._save,
            "load": self._load,
            "head": self._head,
            "exists": self._exists,
            "list": self._list,
            "delete": self._delete,
            "update": self._update,
            "fork": self._fork,
            "checkpoint_put": self._checkpoint_put,
            "checkpoint_get": self._checkpoint_get,
            "checkpoint_delete": self._checkpoint_delete,
            "lease_acquire": self._lease_acquire,
            "lease_get": self._lease_get,
            "lease_release": self._lease_release,
            "watch": self._watch,
            "stats": self._stats,
            "verify": self._verify,
            "compact": self._compact,
        }

    def dispatch(self, request: Request) -> Step:
        handler = self._handlers.get(request.op)
        if handler is None:
            return Reply(
                request, error_response(request, ErrorCode.UNKNOWN_OP, f"unknown op {request.op!r}")
            )
        try:
            return handler(request)
        except Refused as error:
            return Reply(
                request, error_response(request, error.code, error.message, **error.details)
            )
        except InvalidSnapshot as error:
            return Reply(request, error_response(request, ErrorCode.INVALID_SNAPSHOT, str(error)))
        except Exception as error:  # our bug, not the client's: answer it, keep the connection
            return Reply(request, self.internal_error(request, error, "dispatching"))

    def internal_error(self, request: Request | None, error: BaseException, doing: str) -> Response:
        """Our bug, never the client's: logged, counted in `stats`, answered."""
        self.internal_errors += 1
        log.error("internal error %s %r", doing, request and request.op, exc_info=error)
        return error_response(request, ErrorCode.INTERNAL, f"internal error: {error}")

    def _mutation(
        self, request: Request, mutation: Mutation, respond: Callable[[Outcome], Response]
    ) -> Step:
        return Write(request, MutationJob(mutation), respond)

    def _read_document(self, kind: str, doc_id: str) -> Callable[[], Awaitable[Any]]:
        """A reader of the committed generation; returns the Document or None."""

        async def read() -> Any:
            return self.store.read(kind, doc_id)

        return read

    async def _guarded_read(
        self, request: Request, produce: Callable[[], Awaitable[Response]]
    ) -> Response:
        try:
            return await produce()
        except Refused as error:
            return error_response(request, error.code, error.message, **error.details)
        except (CorruptRecord, OSError) as error:
            log.error("%s: %s", request.op, error)
            return error_response(request, ErrorCode.IO_ERROR, str(error))

    # -- sessions --------------------------------------------------------------

    def _hello(self, request: Request) -> Step:
        return Reply(
            request,
            ok_response(
                request,
                protocol=PROTOCOL_VERSION,
                server=f"sessionstored/{__version__}",
                capabilities={
                    "atomic_session_snapshots": True,
                    "aggregate_cas": True,
                    "append_only_event_log": True,
                    "lease_fencing": True,
                    "encrypted_at_rest": self.store.encrypted,
                    "watch": True,
                },
                limits={
                    "max_request_bytes": self.max_request_bytes,
                    "max_snapshot_bytes": self.max_snapshot_bytes,
                },
            ),
        )

    def _save(self, request: Request) -> Step:
        document = snapshot_document(request.args, self.max_snapshot_bytes, request.canonical_hint)
        assert document.session_id is not None
        put = Put(
            SESSION,
            document.session_id,
            document.body,
            document.digest,
            _expect_arg(request.args),
            _lease_arg(request.args),
        )
        digest = digest_text(document.digest)
        return self._mutation(
            request, put, lambda o: ok_response(request, digest=digest, seq=o.seq)
        )

    def _heavy(self, size: int, fn: Callable[..., bytes], *args: Any) -> bytes:
        """fn(*args) inline, or in a worker when its input is large (the writer's thread
        waits; the event loop does not)."""
        if size <= OFFLOAD_ABOVE_BYTES:
            return fn(*args)
        return self.offload.run_blocking(fn, *args)

    def _load(self, request: Request) -> Step:
        read = self._read_document(SESSION, _id_arg(request.args, "session_id"))

        async def produce() -> Response:
            doc = await read()
            if doc is None:
                return ok_response(request, snapshot=None, digest=None, seq=None)
            return ok_response(
                request, snapshot=RawCBOR(doc.body), digest=digest_text(doc.digest), seq=doc.seq
            )

        return Read(request, lambda: self._guarded_read(request, produce))

    def _head(self, request: Request) -> Step:
        session_id = _id_arg(request.args, "session_id")

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

        return Read(request, lambda: self._guarded_read(request, read))

    def _exists(self, request: Request) -> Step:
        session_id = _id_arg(request.args, "session_id")

        async def read() -> Response:
            return ok_response(request, exists=self.store.head(SESSION, session_id) is not None)

        return Read(request, lambda: self._guarded_read(request, read))

    def _list(self, request: Request) -> Step:
        args = request.args
        prefix = args.get("prefix") or ""
        after = args.get("after")
        limit = args.get("limit", LIST_DEFAULT_LIMIT)
        if not isinstance(prefix, str):
            raise Refused(ErrorCode.BAD_REQUEST, "prefix must be text")
        if after is not None and not isinstance(after, str):
            raise Refused(ErrorCode.BAD_REQUEST, "after must be text or null")
        if not _is_int(limit) or not 1 <= limit <= LIST_MAX_LIMIT:
            raise Refused(
                ErrorCode.BAD_REQUEST, f"limit must be an integer from 1 to {LIST_MAX_LIMIT}"
            )

        async def read() -> Response:
            ids, cursor = self.store.list_sessions(prefix, after, limit)
            return ok_response(request, ids=ids, next=cursor)

        return Read(request, read)

    def _delete(self, request: Request) -> Step:
        session_id = _id_arg(request.args, "session_id")
        remove = Remove(SESSION, session_id, _expect_arg(request.args), _lease_arg(request.args))
        return self._mutation(
            request, remove, lambda o: ok_response(request, deleted=o.existed, seq=o.seq)
        )

    def _update(self, request: Request) -> Step:
        args = request.args
        session_id = _id_arg(args, "session_id")
        component = args.get("component")
        if component not in UPDATABLE:
            raise Refused(ErrorCode.BAD_REQUEST, f"component must be one of {', '.join(UPDATABLE)}")
        if "value" not in args:
            raise Refused(ErrorCode.BAD_REQUEST, "value is missing")
        value = args["value"]
        limit = self.max_snapshot_bytes
        value_size = len(value.data) if isinstance(value, Encoded) else 0

        def apply(current: bytes | None, _source: bytes | None) -> bytes:
            size = len(current or b"") + value_size
            return self._heavy(size, updated_body, current, session_id, component, value, limit)

        rewrite = Rewrite(SESSION, session_id, apply, _expect_arg(args), _lease_arg(args))
        return self._mutation(
            request,
            rewrite,
            _rewritten_reply(request),
        )

    def _fork(self, request: Request) -> Step:
        args = request.args
        source_id = _id_arg(args, "session_id")
        new_id = _id_arg(args, "new_session_id")
        if "workspace" not in args:
            raise Refused(ErrorCode.BAD_REQUEST, "workspace is missing")
        workspace = args["workspace"]

        def apply(_current: bytes | None, source: bytes | None) -> bytes:
            if source is None:
                raise Refused(ErrorCode.NOT_FOUND, f"no session {source_id!r}")
            return self._heavy(len(source), forked_body, source, new_id, workspace)

        rewrite = Rewrite(
            SESSION, new_id, apply, expect=None, fence=_lease_arg(args), source=(SESSION, source_id)
        )
        return self._mutation(
            request,
            rewrite,
            _rewritten_reply(request),
        )

    # -- checkpoints -------------------------------------------------------------

    def _checkpoint_put(self, request: Request) -> Step:
        args = request.args
        kind, id_field = _checkpoint_kind(args)
        key = _id_arg(args, "key")
        document = checkpoint_document(args, id_field, key, self.max_snapshot_bytes)
        put = Put(kind, key, document.body, document.digest, fence=_lease_arg(args))
        return self._mutation(request, put, lambda o: ok_response(request, seq=o.seq))

    def _checkpoint_get(self, request: Request) -> Step:
        kind, _ = _checkpoint_kind(request.args)
        read = self._read_document(kind, _id_arg(request.args, "key"))

        async def produce() -> Response:
            doc = await read()
            return ok_response(request, value=RawCBOR(doc.body) if doc is not None else None)

        return Read(request, lambda: self._guarded_read(request, produce))

    def _checkpoint_delete(self, request: Request) -> Step:
        kind, _ = _checkpoint_kind(request.args)
        remove = Remove(kind, _id_arg(request.args, "key"), fence=_lease_arg(request.args))
        return self._mutation(request, remove, lambda o: ok_response(request, deleted=o.existed))

    # -- leases ------------------------------------------------------------------

    def _lease_acquire(self, request: Request) -> Step:
        holder = request.args.get("holder")
        if not isinstance(holder, str) or not holder:
            raise Refused(ErrorCode.BAD_REQUEST, "holder must be non-empty text")
        granted: dict[str, Any] = {}

        def apply(current: bytes | None, _source: bytes | None) -> bytes:
            epoch = cbor2.loads(current).get("epoch", 0) if current is not None else 0
            granted.update(holder=holder, epoch=epoch + 1, acquired_at_ms=int(time.time() * 1000))
            return canonical_dumps(granted)

        rewrite = Rewrite(LEASE, LEASE_ID, apply, fenced=False, exclusive=True)
        return self._mutation(request, rewrite, lambda o: ok_response(request, **granted))

    def _lease_get(self, request: Request) -> Step:
        async def read() -> Response:
            lease = self.store.lease
            if not lease or lease.get("holder") is None:
                return ok_response(request, lease=None)
            fields = ("holder", "epoch", "acquired_at_ms")
            return ok_response(request, lease={k: lease.get(k) for k in fields})

        return Read(request, read)

    def _lease_release(self, request: Request) -> Step:
        holder, epoch = request.args.get("holder"), request.args.get("epoch")
        if not isinstance(holder, str) or not holder or not _is_int(epoch):
            raise Refused(
                ErrorCode.BAD_REQUEST, "lease_release needs holder (text) and epoch (integer)"
            )

        def apply(current: bytes | None, _source: bytes | None) -> bytes | None:
            lease = cbor2.loads(current) if current is not None else {}
            if lease.get("holder") != holder or lease.get("epoch") != epoch:
                return None
            return canonical_dumps(
                {"holder": None, "epoch": epoch, "released_at_ms": int(time.time() * 1000)}
            )

        rewrite = Rewrite(LEASE, LEASE_ID, apply, fenced=False, exclusive=True)
        return self._mutation(request, rewrite, lambda o: ok_response(request, released=o.changed))

    # -- watch, stats, verify, compact -------------------------------------------

    def _watch(self, request: Request) -> Step:
        since = request.args.get("since")
        if since is not None and (not _is_int(since) or since < 0):
            raise Refused(ErrorCode.BAD_REQUEST, "since must be a non-negative integer")

        async def stream(sink: Sink) -> None:
            current = self.store.seq
            if since is not None:
                oldest = self.broadcaster.compacted_before(since)
                if oldest is not None:
                    await sink.send(
                        error_response(
                            request,
                            ErrorCode.COMPACTED,
                            f"history before seq {oldest} is no longer retained",
                            oldest_seq=oldest,
                        )
                    )
                    return
            await sink.send(ok_response(request, watching=True, seq=current))
            await self.broadcaster.stream(current if since is None else since, sink)

        return Stream(request, stream)

    def _stats(self, request: Request) -> Step:
        async def read() -> Response:
            return ok_response(
                request,
                sessions=self.store.session_count(),
                seq=self.store.seq,
                uptime_s=round(time.monotonic() - self.started, 3),
                watchers=self.broadcaster.watchers,
                watchers_cut_off=self.broadcaster.cut_off,
                watchers_dropped=self.broadcaster.dropped,
                internal_errors=self.internal_errors,
                lease_epoch=(self.store.lease or {}).get("epoch"),
                **self.store.stats(),
                **self.stats_extra(),
            )

        return Read(request, read)

    def _verify(self, request: Request) -> Step:
        def run_check() -> Response:
            checked, problems = self.store.verify()
            return ok_response(request, checked=checked, problems=problems)

        return Exclusive(request, ExclusiveJob(run_check))

    def _compact(self, request: Request) -> Step:
        def run_compact() -> Response:
            try:
                result = self.store.compact()
            except NoSpace as error:
                return error_response(
                    request, ErrorCode.NO_SPACE, f"compaction did not run: {error}"
                )
            except InjectedFault as error:
                return error_response(
                    request, ErrorCode.IO_ERROR, f"compaction did not run: {error}"
                )
            return ok_response(
                request,
                seq=result.seq,
                wal_bytes_before=result.wal_bytes_before,
                wal_bytes_after=result.wal_bytes_after,
                segments_replaced=result.segments_replaced,
            )

        return Exclusive(request, ExclusiveJob(run_compact))
