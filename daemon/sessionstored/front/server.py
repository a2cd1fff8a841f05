# The trio side of the daemon: bind (or inherit) the socket, one task per
# connection (connection.py says what it does), graceful drain on SIGTERM/SIGINT,
# fail-stop on a storage failure, and on PostgreSQL, following every host's commits.
from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
import socket as stdlib_socket
import stat
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from sessionstore.errors import UnsafeSocketDirectory
from sessionstore.paths import FALLBACK, Choice, refuse_unsafe
from sessionstore.wire.codes import ErrorCode

from ..config import Config
from ..exit_codes import ExitCode
from ..notify import notify, watchdog_interval_s
from ..ops import REGISTRY, OpContext
from ..ops.admin import stats_snapshot
from ..ops.watch import Broadcaster
from ..storage import clock
from ..storage.engine import Engine, Follower, StartReport
from ..storage.errors import FatalStorageError
from ..writer.sweeper import Sweeper
from ..writer.writer import Writer
from .connection import ConnectionLoop
from .metrics import Metrics, serve_metrics

log = logging.getLogger("sessionstored.server")

# out of file descriptors or memory for now: wait and accept again (as trio's own
# serve_listeners does); any other accept error means the listener is broken
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_BACKOFF_S = 0.1
LISTEN_BACKLOG = 512


FOLLOW_POLL_S = 0.5
# at most one round of following a second per this: under load, one round reads the
# commits of many batches instead of each batch waking a round of its own (measured:
# a round per batch took 0.3 of a core at 3,500 saves/s, starving the event loop)
FOLLOW_GATHER_S = 0.005
# how long a stopping daemon waits for the database listener's thread: it looks at
# its stop event every quarter second, a connection attempt takes at most 10 s
# (postgres/following.py, connection.py)
LISTENER_STOP_S = 15.0


class _Wakeup:
    """An event that any thread may set, and that resets when waited for."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    def set_from_thread(self) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._event.set)

    async def wait(self, timeout_s: float) -> None:
        with trio.move_on_after(timeout_s):
            await self._event.wait()
        self._event = trio.Event()


class StartupError(Exception):
    pass


async def _run_in(scope: trio.CancelScope, task: Callable[[], Awaitable[None]]) -> None:
    with scope:
        await task()


def _ready_socket_path(path: str, private_directory: bool) -> None:
    """private_directory: the /tmp fallback, whose directory must be ours and 0700."""
    directory = os.path.dirname(path) or "."
    if not os.path.lexists(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
    if private_directory:
        try:
            refuse_unsafe(Choice(path, FALLBACK), os.getuid())
        except UnsafeSocketDirectory as error:
            raise StartupError(str(error)) from None
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise StartupError(f"{path} exists and is not a socket; refusing to replace it")
        probe = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # stale: nobody answers there
        else:
            raise StartupError(f"another daemon is already listening on {path}")
        finally:
            probe.close()


async def open_listener(config: Config) -> tuple[trio.SocketListener, str | None]:
    if config.inherited_fd is not None:
        sock = trio.socket.socket(fileno=config.inherited_fd)
        if sock.family != stdlib_socket.AF_UNIX:
            raise StartupError(f"socket passed on fd {config.inherited_fd} is not a Unix socket")
        return trio.SocketListener(sock), None
    assert config.socket_path is not None
    path = config.socket_path
    try:
        _ready_socket_path(path, config.private_socket_dir)
        sock = trio.socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
        await sock.bind(path)
        os.chmod(path, config.socket_mode)
        sock.listen(LISTEN_BACKLOG)
    except OSError as error:
        raise StartupError(f"cannot listen on {path}: {error.strerror or error}") from error
    return trio.SocketListener(sock), path


class Server:
    def __init__(self, config: Config, store: Engine, report: StartReport) -> None:
        self.config = config
        self.store = store
        self.report = report
        self.exit_code = ExitCode.OK
        self.writer = Writer(store, self._on_fatal)
        self.sweeper = Sweeper(store, self.writer)
        self.broadcaster = Broadcaster(
            store, config.watch_max_lag, send_timeout_s=config.watch_send_timeout_s
        )
        self.writer.on_publish = self.broadcaster.published
        self.ops = OpContext(
            store,
            self.writer,
            self.broadcaster,
            max_snapshot_bytes=config.max_snapshot_bytes,
            max_request_bytes=config.max_request_bytes,
            stats_extra=self._stats_extra,
            advance_clock=self._advance_clock if config.unsafe_settable_clock else None,
        )
        self._stop = trio.Event()
        self._listener: threading.Thread | None = None  # the database's NOTIFY listener
        # counted always (`stats` and `sessionstore top` read it); served over HTTP only
        # with --metrics-listen
        self.metrics = Metrics(REGISTRY)
        self.writer.on_batch = self.metrics.batch
        self.connection_loop = ConnectionLoop(config, self.ops, self.writer, self.metrics)

    def _advance_clock(self, by_ms: int) -> int:
        now_ms = clock.advance(by_ms)
        self.sweeper.wake()  # what expired by the new time is swept now
        return now_ms

    async def _render_metrics(self) -> bytes:
        return await self.metrics.exposition(await stats_snapshot(self.ops))

    def _stats_extra(self) -> dict[str, Any]:
        loop = self.connection_loop
        return {
            "connections": loop.connections,
            "connections_total": loop.connections_total,
            "refused": {
                ErrorCode.OVERLOADED: loop.refused_overloaded,
                ErrorCode.UNAUTHORIZED: loop.refused_unauthorized,
                "request_timeouts": loop.timed_out_requests,
            },
            "batches": self.writer.batches,
            "batches_waited_on_loop": self.writer.waited_on_loop,
            "committed": self.writer.committed_jobs,
            "compactions": self.writer.compactions,
            "checkpoints": self.writer.checkpoints,
            "recent_batches": self.writer.timing(),
            "expirations": self.sweeper.expired,
            "recovery": self.report.as_dict(),
            **self.metrics.stats(),
        }

    def _on_fatal(self, reason: str) -> None:
        self.exit_code = ExitCode.STORAGE_FAILURE
        self._stop.set()

    async def run(
        self,
        listener: trio.SocketListener,
        socket_path: str | None,
        metrics_listeners: list[trio.SocketListener] | None = None,
    ) -> int:
        signal_scope = trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.writer.run, watchdog_interval_s())
            sweep_scope = trio.CancelScope()
            nursery.start_soon(_run_in, sweep_scope, self.sweeper.run)
            follow_scope = trio.CancelScope()
            if self.store.follower is not None:
                nursery.start_soon(self._follow_database, self.store.follower, follow_scope)
            await nursery.start(self._watch_signals, signal_scope)  # before READY=1
            metrics_scope = trio.CancelScope()
            if metrics_listeners and self.config.metrics_listen is not None:
                serve = functools.partial(serve_metrics, metrics_listeners, self._render_metrics)
                nursery.start_soon(_run_in, metrics_scope, serve)
                log.info("serving metrics on http://%s:%d/metrics", *self.config.metrics_listen)
            readiness_scope = trio.CancelScope()
            nursery.start_soon(_run_in, readiness_scope, self.connection_loop.readiness.run)
            async with trio.open_nursery() as connections:
                accept_scope = trio.CancelScope()
                connections.start_soon(self._accept, listener, connections, accept_scope)
                where = socket_path or "the socket passed by systemd"
                notify("READY=1", f"STATUS=serving on {where}; recovered to seq {self.store.seq}")
                log.info("serving on %s", where)
                await self._stop.wait()
                notify("STOPPING=1", "STATUS=stopping")
                log.info("stopping: no new connections, finishing in-flight requests")
                accept_scope.cancel()
                # read no more requests: as if at EOF
                for stream in list(self.connection_loop.streams):
                    with contextlib.suppress(OSError):
                        stream.socket.shutdown(stdlib_socket.SHUT_RD)
                self.broadcaster.close()
                # in-flight requests get the grace period, then are cancelled
                connections.cancel_scope.deadline = trio.current_time() + (
                    self.config.shutdown_grace_s
                )
            readiness_scope.cancel()  # every connection has ended
            sweep_scope.cancel()
            metrics_scope.cancel()
            self.writer.close()
            follow_scope.cancel()
            self.ops.offload.close()
            signal_scope.cancel()
        if socket_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(socket_path)
        if self._listener is not None:  # not left inside libpq while the process exits
            await trio.to_thread.run_sync(self._listener.join, LISTENER_STOP_S)
        if self.exit_code == ExitCode.OK:
            await trio.to_thread.run_sync(self.store.close)
        return int(self.exit_code)

    async def _follow_database(self, follower: Follower, scope: trio.CancelScope) -> None:
        """Every host's commits into the watch history, in seq order: woken by NOTIFY, by
        this daemon's own batches, and every FOLLOW_POLL_S regardless (the table is the
        truth, a notification only a hint)."""
        wakeup = _Wakeup(trio.lowlevel.current_trio_token())
        previous = self.writer.on_publish

        def published() -> None:
            wakeup.set()
            if previous is not None:
                previous()

        self.writer.on_publish = published
        stop = threading.Event()
        listener = threading.Thread(target=follower.listen, args=(stop, wakeup.set_from_thread))
        listener.daemon = True
        listener.start()
        self._listener = listener
        last_round = trio.current_time()
        try:
            with scope:
                while True:
                    await wakeup.wait(FOLLOW_POLL_S)
                    await trio.sleep_until(last_round + FOLLOW_GATHER_S)
                    last_round = trio.current_time()
                    try:
                        moved = await trio.to_thread.run_sync(follower.follow)
                    except FatalStorageError as error:  # e.g. a rotation to a key we lack
                        self.writer.stop_fatally(str(error))
                        return
                    except Exception as error:  # the database is away: the next round retries
                        log.warning("following the database's changes: %s", error)
                        continue
                    if moved:
                        self.broadcaster.published()
        finally:
            stop.set()

    async def _watch_signals(
        self,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with scope, trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async for signum in signals:
                log.info("received %s", signal.Signals(signum).name)
                self._stop.set()
                return

    async def _accept(
        self, listener: trio.SocketListener, nursery: trio.Nursery, scope: trio.CancelScope
    ) -> None:
        with scope:
            async with listener:
                while True:
                    try:
                        stream = await listener.accept()
                    except OSError as error:
                        if error.errno not in ACCEPT_CAPACITY_ERRNOS:
                            log.critical("accept failed, cannot serve: %s", error)
                            self.exit_code = ExitCode.FAILED
                            self._stop.set()
                            return
                        log.warning("accept failed (%s): backing off, still serving", error)
                        await trio.sleep(ACCEPT_BACKOFF_S)
                        continue
                    nursery.start_soon(self.connection_loop.serve, stream)
