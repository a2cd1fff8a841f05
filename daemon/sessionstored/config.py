# argv and environment -> one frozen Config. No I/O happens here; a bad value
# raises ConfigError with a one-line reason, which the CLI prints before exiting 2.
from __future__ import annotations

import argparse
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sessionstore import build
from sessionstore.paths import FALLBACK, default_socket, state_dir
from sessionstore.tools.helpformat import (
    DefaultsShown,
    OneLineUsage,
    positive_seconds,
    seconds_or_zero,
)
from sessionstore.version import __version__
from sessionstore.wire import cbor_bytes
from sessionstore.wire.protocol import DEFAULT_MAX_REQUEST_BYTES

from .access import AccessPolicy
from .failpoints import FailpointSpec, parse_failpoints
from .storage.generations import DEFAULT_KEEP_GENERATIONS, MAX_KEEP_GENERATIONS

SYSTEMD_FIRST_FD = 3
LOG_LEVELS = ("debug", "info", "warning", "error")
WATCH_SEND_TIMEOUT_S = 30.0  # a watcher that takes nothing this long is dropped


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Config:
    state_dir: str
    socket_path: str | None
    inherited_fd: int | None
    socket_mode: int
    log_level: str
    max_request_bytes: int
    max_snapshot_bytes: int
    failpoints: tuple[FailpointSpec, ...]
    shutdown_grace_s: float
    history_changes: int
    keep_generations: int
    checkpoint_every: int
    compact_dead_share: float
    segment_bytes: int
    watch_max_lag: int
    watch_send_timeout_s: float
    read_cache_bytes: int
    access: AccessPolicy
    max_connections: int
    request_timeout_s: float
    key_file: str | None
    previous_key_file: str | None = None  # PostgreSQL: the key an online rekey leaves
    private_socket_dir: bool = False  # the /tmp fallback: its directory must be ours, 0700
    database_url: str | None = None  # PostgreSQL instead of the embedded log
    database_password: str | None = None
    batches_in_flight: int = 1  # PostgreSQL: batches committing at once, each its own connection
    metrics_listen: tuple[str, int] | None = None  # where /metrics is served; None: nowhere
    unsafe_settable_clock: bool = False  # clients may move the expiry clock forward (tests)


EPILOG = (
    "Also: `sessionstored rekey --help`, rotating (or adding, or removing) the store's "
    "encryption key, offline for the log, online for PostgreSQL; `sessionstored restore "
    "--help`, a new store from a backup.",
    "State directory: --state-dir, else $SESSIONSTORED_STATE_DIR, $STATE_DIRECTORY, "
    "$XDG_STATE_HOME/sessionstored, ~/.local/state/sessionstored. Socket: --socket, else "
    "$SESSIONSTORE_SOCKET, the socket systemd passed, $RUNTIME_DIRECTORY, $XDG_RUNTIME_DIR, "
    "/tmp/sessionstored-$UID.",
    "Exit status: 0 after a clean stop; 1 when it cannot start (the store locked by another "
    "daemon, the socket in use, a store it cannot read); 2 for bad configuration; 3 when a "
    "failed fsync or write stopped it (systemd restarts it, and recovery runs).",
)


def version_line() -> str:
    """--version: the release, and which build of the request path and which CBOR byte
    helper run (compiled or interpreted; sessionstore/build.py, wire/cbor_bytes.py)."""
    return (
        f"sessionstored {__version__} (request path {build.running('sessionstored')},"
        f" CBOR helper {cbor_bytes.IMPLEMENTATION})"
    )


def _parser() -> argparse.ArgumentParser:
    parser = OneLineUsage(
        prog="sessionstored",
        description="Crash-safe snapshot store for AI-agent session state: recovers the store, "
        "then serves it on a Unix socket until SIGTERM or SIGINT.",
        epilog="\n\n".join(textwrap.fill(paragraph, 79) for paragraph in EPILOG),
        formatter_class=DefaultsShown,
    )
    parser.add_argument("--version", action="version", version=version_line())
    parser.add_argument(
        "--database",
        metavar="URL",
        help="serve from PostgreSQL (postgresql://...) instead of the embedded log; also "
        "SESSIONSTORED_DATABASE_URL; the password may come from the systemd credential "
        "sessionstored.dbpassword",
    )
    parser.add_argument(
        "--UNSAFE-settable-clock",
        action="store_true",
        help="UNSAFE, for tests: any client may move the daemon's clock forward "
        "(`advance_clock`), expiring whatever it likes; also "
        "$SESSIONSTORED_UNSAFE_SETTABLE_CLOCK=1",
    )
    parser.add_argument(
        "--batches-in-flight",
        type=int,
        default=1,
        metavar="N",
        help="PostgreSQL: batches committing at once, each on a connection of its own (1 to 16;"
        " more hides a long round trip to the database; one is fastest when it is near)",
    )
    parser.add_argument(
        "--state-dir", help="where the store lives (default: the search order below)"
    )
    parser.add_argument(
        "--socket", help="Unix socket path to listen on (default: the search order below)"
    )
    parser.add_argument("--socket-mode", default="0660", help="octal mode of the socket")
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    parser.add_argument(
        "--key-file",
        help="seal the store with this key: 32 raw bytes or 64 hex digits "
        "(else SESSIONSTORED_KEY_FILE, else the systemd credential sessionstored.key)",
    )
    parser.add_argument(
        "--previous-key-file",
        help="PostgreSQL: also open with this key, the one an online rekey rotates away from "
        "(else SESSIONSTORED_PREVIOUS_KEY_FILE, else the credential sessionstored.previous-key)",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="largest request accepted, in bytes",
    )
    parser.add_argument(
        "--max-snapshot-bytes",
        type=int,
        default=None,
        help="largest stored snapshot (canonical CBOR), in bytes (defaults to --max-request-bytes)",
    )
    parser.add_argument(
        "--history-changes",
        type=int,
        default=100_000,
        help="changes kept for watch --since, across restarts",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="ADDR:PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (off unless given; "
        "ADDR defaults to 127.0.0.1)",
    )
    parser.add_argument(
        "--keep-generations",
        type=int,
        default=DEFAULT_KEEP_GENERATIONS,
        metavar="N",
        help="earlier generations of each session kept, for history, load --at, revert and "
        f"fork --at ({DEFAULT_KEEP_GENERATIONS}; 0 keeps only the current one)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=100_000,
        help="checkpoint the index after this many changes, or 256 MiB of log",
    )
    parser.add_argument(
        "--compact-dead-share",
        type=float,
        default=0.4,
        help="compact the log once this share of its bytes is dead (0.4; space <= 1/(1-x) live)",
    )
    parser.add_argument(
        "--segment-mib",
        type=int,
        default=16,
        help="size of a log segment, made at full size before it is used (16 MiB)",
    )
    parser.add_argument(
        "--watch-max-lag",
        type=int,
        default=10_000,
        help="a watcher further behind than this many changes gets 'lagged'",
    )
    parser.add_argument(
        "--watch-send-timeout-seconds",
        type=positive_seconds,
        default=WATCH_SEND_TIMEOUT_S,
        metavar="SECONDS",
        help="a watcher whose socket takes nothing for this long is dropped",
    )
    parser.add_argument(
        "--read-cache-mib",
        type=int,
        default=64,
        help="memory for verified document bodies served to load (64 MiB; 0 turns it off)",
    )
    for flag, what in (
        ("--allow-uid", "also allow this uid"),
        ("--allow-gid", "also allow peers with this gid"),
        ("--read-only-uid", "this uid may only read"),
        ("--read-only-gid", "peers with this gid may only read"),
    ):
        parser.add_argument(
            flag, type=int, action="append", default=[], help=f"{what} (repeatable)"
        )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        help="connections served at once; the next gets 'overloaded'",
    )
    parser.add_argument(
        "--request-timeout-seconds",
        type=positive_seconds,
        default=30.0,
        help="a request that has started arriving must be complete within this",
    )
    parser.add_argument(
        "--shutdown-grace-seconds",
        type=seconds_or_zero,
        default=10.0,
        help="how long SIGTERM waits for in-flight requests",
    )
    return parser


DATABASE_PASSWORD_CREDENTIAL = "sessionstored.dbpassword"


def _database_password(env: Mapping[str, str]) -> str | None:
    """The systemd credential holding the database password, if the unit passes one."""
    directory = env.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = os.path.join(directory, DATABASE_PASSWORD_CREDENTIAL)
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ConfigError(f"cannot read the credential {path}: {error.strerror}") from None


def resolve_state_dir(explicit: str | None, env: Mapping[str, str]) -> str:
    return state_dir(explicit, env).path


def _inherited_fd(env: Mapping[str, str], pid: int) -> int | None:
    if env.get("LISTEN_PID") != str(pid):
        return None
    try:
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError as error:
        raise ConfigError(f"LISTEN_FDS is not a number: {env.get('LISTEN_FDS')!r}") from error
    if count < 1:
        return None
    names = env.get("LISTEN_FDNAMES", "").split(":")
    for offset in range(count):
        if offset < len(names) and names[offset] in ("sessionstored", "sessionstored.socket"):
            return SYSTEMD_FIRST_FD + offset
    return SYSTEMD_FIRST_FD


def build_config(
    argv: Sequence[str], env: Mapping[str, str], *, pid: int, uid: int, gid: int
) -> Config:
    args = _parser().parse_args(list(argv))
    _check_ranges(args, env)
    socket_path, private_socket_dir, inherited = _where_to_listen(args, env, pid, uid)
    database_url = args.database or env.get("SESSIONSTORED_DATABASE_URL") or None
    if database_url is not None and not database_url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"--database must be a postgresql:// URL, not {database_url[:40]!r}")
    try:
        failpoints = parse_failpoints(env.get("SESSIONSTORED_FAILPOINTS", ""))
    except ValueError as error:
        raise ConfigError(f"SESSIONSTORED_FAILPOINTS: {error}") from error
    metrics_listen = None
    if args.metrics_listen is not None:
        try:
            metrics_listen = parse_listen(args.metrics_listen)
        except ValueError as error:
            raise ConfigError(f"--metrics-listen {error}") from None
    return Config(
        state_dir=resolve_state_dir(args.state_dir, env),
        socket_path=socket_path,
        private_socket_dir=private_socket_dir,
        inherited_fd=inherited,
        socket_mode=_socket_mode(args.socket_mode),
        log_level=args.log_level,
        max_request_bytes=args.max_request_bytes,
        max_snapshot_bytes=args.max_snapshot_bytes or args.max_request_bytes,
        failpoints=failpoints,
        shutdown_grace_s=args.shutdown_grace_seconds,
        history_changes=args.history_changes,
        keep_generations=args.keep_generations,
        metrics_listen=metrics_listen,
        checkpoint_every=args.checkpoint_every,
        compact_dead_share=args.compact_dead_share,
        segment_bytes=args.segment_mib * 1024 * 1024,
        watch_max_lag=args.watch_max_lag,
        watch_send_timeout_s=args.watch_send_timeout_seconds,
        read_cache_bytes=max(0, args.read_cache_mib) * 1024 * 1024,
        access=AccessPolicy(
            daemon_uid=uid,
            daemon_gid=gid,
            allow_uids=frozenset(args.allow_uid),
            allow_gids=frozenset(args.allow_gid),
            read_only_uids=frozenset(args.read_only_uid),
            read_only_gids=frozenset(args.read_only_gid),
        ),
        max_connections=args.max_connections,
        request_timeout_s=args.request_timeout_seconds,
        key_file=args.key_file,
        previous_key_file=args.previous_key_file,
        database_url=database_url,
        database_password=_database_password(env),
        batches_in_flight=args.batches_in_flight,
        unsafe_settable_clock=args.UNSAFE_settable_clock
        or env.get("SESSIONSTORED_UNSAFE_SETTABLE_CLOCK") == "1",
    )


def _socket_mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError as error:
        raise ConfigError(f"--socket-mode must be octal, got {text!r}") from error
    if not 0 <= mode <= 0o777:
        raise ConfigError(f"--socket-mode out of range: {text}")
    return mode


def _check_ranges(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """Every numeric flag within what the daemon can honour."""
    if args.max_request_bytes < 1024:
        raise ConfigError("--max-request-bytes must be at least 1024")
    if (args.max_snapshot_bytes or args.max_request_bytes) < 256:
        raise ConfigError("--max-snapshot-bytes must be at least 256")
    if not 0.05 <= args.compact_dead_share <= 0.95:
        raise ConfigError("--compact-dead-share must be between 0.05 and 0.95")
    if not 0 <= args.keep_generations <= MAX_KEEP_GENERATIONS:
        raise ConfigError(f"--keep-generations must be from 0 to {MAX_KEEP_GENERATIONS}")
    if not 1 <= args.segment_mib <= 1024:
        raise ConfigError("--segment-mib must be from 1 to 1024")
    if not 1 <= args.batches_in_flight <= 16:
        raise ConfigError("--batches-in-flight must be from 1 to 16")
    if args.batches_in_flight > 1 and not (args.database or env.get("SESSIONSTORED_DATABASE_URL")):
        raise ConfigError("--batches-in-flight is for PostgreSQL: the log commits one at a time")
    for name in ("history_changes", "checkpoint_every", "watch_max_lag", "max_connections"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")


def _where_to_listen(
    args: argparse.Namespace, env: Mapping[str, str], pid: int, uid: int
) -> tuple[str | None, bool, int | None]:
    """(socket path, whether it is the /tmp fallback's private directory, the fd systemd
    passed): a socket named by flag or environment, else systemd's, else the default."""
    explicit_socket = args.socket or env.get("SESSIONSTORE_SOCKET") or None
    inherited = None if explicit_socket else _inherited_fd(env, pid)
    if explicit_socket is not None or inherited is not None:
        return explicit_socket, False, inherited
    chosen = default_socket(env, uid)
    return chosen.path, chosen.reason == FALLBACK, None


def parse_listen(text: str) -> tuple[str, int]:
    """--metrics-listen: ADDR:PORT, [ADDR]:PORT or :PORT / PORT (loopback); ValueError says
    what is wrong."""
    host, colon, port = text.rpartition(":")
    if not colon:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: expected ADDR:PORT (a port from 1 to 65535)")
    return host, int(port)
