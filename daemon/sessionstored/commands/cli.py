from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import resource
import sys
import threading
import time
from collections.abc import Iterator, Sequence

import trio

from sessionstore.errors import UnsafeSocketDirectory
from sessionstore.paths import FALLBACK, Choice, refuse_unsafe

from ..config import Config, ConfigError, build_config
from ..exit_codes import ExitCode, refuse
from ..failpoints import Failpoints
from ..front.server import Server, StartupError, open_listener
from ..notify import notify
from ..storage.engine import Engine, StartReport
from ..storage.errors import KeyFileError, StoreFormatError, StoreLocked
from ..storage.log.fs import RealFileSystem
from ..storage.log.recovery import open_store
from ..storage.sealing import Key
from .keyfile import PREVIOUS_CREDENTIAL_NAME, load_key
from .rekey_command import rekey_main
from .restore_command import restore_main

PROGRAM = "sessionstored"

log = logging.getLogger("sessionstored")

SYSLOG_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


class _JournalFormatter(logging.Formatter):
    """stderr goes to the journal: a <N> priority prefix instead of a timestamp."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{SYSLOG_PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(_JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def _raise_open_files_limit() -> None:
    """Every connection is a descriptor: use the hard limit, not the (often 1024) soft one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


START_EXTENSION_USEC = 30_000_000
START_EXTENSION_EVERY_S = 10.0


@contextlib.contextmanager
def _start_timeout_extended() -> Iterator[None]:
    """While recovery runs, keep asking systemd for more start time (a large store)."""
    done = threading.Event()

    def extend() -> None:
        while not done.wait(START_EXTENSION_EVERY_S):
            notify(f"EXTEND_TIMEOUT_USEC={START_EXTENSION_USEC}", "STATUS=still recovering")

    worker = threading.Thread(target=extend, name="extend-start-timeout", daemon=True)
    worker.start()
    try:
        yield
    finally:
        done.set()


def _return_freed_memory() -> None:
    """Recovery decodes the whole index checkpoint; give the heap it leaves behind back to
    the OS (glibc's malloc_trim), so RSS is what the store holds, not the peak of its boot.
    Then what recovery built is frozen (collector.py)."""
    gc.collect()
    gc.freeze()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the process reuses it
        ctypes.CDLL("libc.so.6").malloc_trim(0)


DATABASE_RETRY_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


def _open_database(
    config: Config, key: Key | None, previous_key: Key | None
) -> tuple[Engine, StartReport] | int:
    """The PostgreSQL store, open; while the database does not answer, say so in STATUS=
    and retry with backoff; a refusal (bad URL, credentials, key) exits at once."""
    from ..storage.errors import DatabaseRefused, DatabaseUnreachable
    from ..storage.postgres.connection import redacted
    from ..storage.postgres.store import PgStore

    assert config.database_url is not None
    store = PgStore(
        config.database_url,
        key=key,
        previous_key=previous_key,
        password=config.database_password,
        history_changes=config.history_changes,
        keep_generations=config.keep_generations,
        max_document_bytes=config.max_snapshot_bytes,
        failpoint=Failpoints(config.failpoints).hit if config.failpoints else None,
        batches_in_flight=config.batches_in_flight,
    )
    attempt = 0
    while True:
        try:
            report = store.open()
            log.info("connected to %s", report.summary())
            return store, report
        except DatabaseRefused as error:
            return refuse(PROGRAM, str(error), ExitCode.BAD_USAGE)
        except DatabaseUnreachable as error:
            if error.unresolved and attempt == 0:  # a typo in the URL, not an outage
                return refuse(PROGRAM, f"{error} (the host does not resolve)", ExitCode.BAD_USAGE)
            wait_s = DATABASE_RETRY_S[min(attempt, len(DATABASE_RETRY_S) - 1)]
            attempt += 1
            notify(f"STATUS=waiting for PostgreSQL at {redacted(config.database_url)}: {error}")
            log.warning("PostgreSQL does not answer (%s); retrying in %.0f s", error, wait_s)
            time.sleep(wait_s)


def run(config: Config) -> int:
    _setup_logging(config.log_level)
    _raise_open_files_limit()
    if config.private_socket_dir and config.socket_path is not None:
        try:  # before anything is opened (the listener checks again when it binds)
            refuse_unsafe(Choice(config.socket_path, FALLBACK), os.getuid())
        except UnsafeSocketDirectory as error:
            return refuse(PROGRAM, str(error), ExitCode.FAILED)
    keys = _load_keys(config)
    if isinstance(keys, int):
        return keys
    if config.database_url is not None:
        opened = _open_database(config, *keys)
    else:
        opened = _open_log(config, keys[0])
    if isinstance(opened, int):
        return opened
    return _serve(config, *opened)


def _load_keys(config: Config) -> tuple[Key | None, Key | None] | int:
    """The key and the previous key (an online rekey's), or the exit code of a refusal."""
    try:
        key = load_key(config.key_file, os.environ)
        previous_key = load_key(
            config.previous_key_file,
            os.environ,
            variable="SESSIONSTORED_PREVIOUS_KEY_FILE",
            credential_name=PREVIOUS_CREDENTIAL_NAME,
        )
    except KeyFileError as error:
        return refuse(PROGRAM, str(error), ExitCode.BAD_USAGE)
    if previous_key is not None and config.database_url is None:
        return refuse(
            PROGRAM,
            "a previous key is for a PostgreSQL store's online rekey; the embedded log is "
            "rekeyed offline (sessionstored rekey --state-dir)",
            ExitCode.BAD_USAGE,
        )
    if previous_key is not None and key is None:
        return refuse(PROGRAM, "a previous key needs a key (--key-file) too", ExitCode.BAD_USAGE)
    return key, previous_key


def _open_log(config: Config, key: Key | None) -> tuple[Engine, StartReport] | int:
    """The embedded log, recovered (or the exit code of a refusal)."""
    try:
        os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
    except OSError as error:
        return refuse(
            PROGRAM,
            f"cannot create state directory {config.state_dir}: {error.strerror}",
            ExitCode.FAILED,
        )
    failpoints = Failpoints(config.failpoints)
    notify(f"STATUS=recovering {config.state_dir}")
    try:
        with _start_timeout_extended():
            store, report = open_store(
                RealFileSystem(),
                config.state_dir,
                max_document_bytes=config.max_snapshot_bytes,
                history_changes=config.history_changes,
                keep_generations=config.keep_generations,
                checkpoint_every=config.checkpoint_every,
                compact_dead_share=config.compact_dead_share,
                segment_bytes=config.segment_bytes,
                read_cache_bytes=config.read_cache_bytes,
                failpoint=failpoints.hit,
                key=key,
            )
    except (StoreLocked, StoreFormatError) as error:
        return refuse(PROGRAM, str(error), ExitCode.FAILED)
    except OSError as error:
        return refuse(PROGRAM, f"cannot open store in {config.state_dir}: {error}", ExitCode.FAILED)
    # corruption is an error, a torn tail (a crash mid-write) a warning
    level = logging.INFO
    if report.corruption:
        level = logging.ERROR
    elif report.torn_tail:
        level = logging.WARNING
    log.log(level, "recovered %s: %s", config.state_dir, report.summary())
    _return_freed_memory()
    if store.sealer.seal_with is not None:
        log.info("documents are sealed with key id %s", store.sealer.key_id_hex)
        if key is not None and store.sealer.key_id_hex != key.key_id_hex:
            log.warning(
                "a key rotation finished with the old key: from now on start with key id %s",
                store.sealer.key_id_hex,
            )
    return store, report


def _serve(config: Config, store: Engine, report: StartReport) -> int:
    served = False

    async def serve() -> int:
        nonlocal served
        metrics: list[trio.SocketListener] = []
        if config.metrics_listen is not None:
            host, port = config.metrics_listen
            try:
                metrics = await trio.open_tcp_listeners(port, host=host)
            except OSError as error:
                reason = f"cannot serve metrics on {host}:{port}: {error.strerror or error}"
                return refuse(PROGRAM, reason, ExitCode.FAILED)
        try:
            listener, path = await open_listener(config)
        except StartupError as error:
            return refuse(PROGRAM, str(error), ExitCode.FAILED)
        served = True
        return await Server(config, store, report).run(listener, path, metrics)

    code = trio.run(serve)
    if code and served:
        log.critical("exiting with status %d so that recovery runs at the next start", code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["rekey"]:
        return rekey_main(arguments[1:])
    if arguments[:1] == ["restore"]:
        return restore_main(arguments[1:])
    try:
        config = build_config(
            arguments,
            os.environ,
            pid=os.getpid(),
            uid=os.getuid(),
            gid=os.getgid(),
        )
    except ConfigError as error:
        return refuse(PROGRAM, str(error), ExitCode.BAD_USAGE)
    return run(config)
