from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionstore.client import Client

from .postgres_server import PostgresServer, start_server
from .tools import missing_line, require

READY_TIMEOUT_S = 30.0

# A test reaches only daemons that it started, and never the user's store: a client or
# daemon that forgets to name its own socket or state directory lands on these, which
# no daemon serves, instead of on the defaults that `make run` beside the suite uses.
UNSERVED_SOCKET = "/nonexistent/sessionstore-tests-must-name-their-socket.sock"
os.environ["SESSIONSTORE_SOCKET"] = UNSERVED_SOCKET
os.environ["SESSIONSTORED_STATE_DIR"] = "/nonexistent/sessionstore-tests-must-name-their-state"


def private_tmp_command(*command: str) -> tuple[list[str], Path]:
    """command, run as root in a mount namespace whose /tmp is a fresh tmpfs, so that
    /tmp/sessionstored-$UID there is never the one `make run` beside the suite uses; the
    checkout and the interpreter stay reachable when they live under /tmp (a clone in
    /tmp), bound back in from the real /tmp. Returns the command and a directory to
    remove afterwards (the real /tmp's mount point)."""
    keep = {
        str(path)
        for path in (Path(__file__).resolve().parent.parent, Path(sys.prefix).resolve(),
                     Path(sys.base_prefix).resolve(), Path(sys.executable).resolve().parent)
        if str(path).startswith("/tmp/")
    }  # fmt: skip
    outside = Path(tempfile.mkdtemp(prefix="sessionstore-real-tmp-", dir="/var/tmp"))
    lines = [
        "set -e",
        f"mount --bind /tmp {outside}",
        "mount -t tmpfs -o size=64m tmpfs /tmp",
        *(
            f"mkdir -p {path} && mount --bind {outside}{path[len('/tmp') :]} {path}"
            for path in sorted(keep)
        ),
        'exec "$@"',
    ]
    script = "\n".join(lines)
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "-",
        *command,
    ], outside


def snapshot(session_id: str, **extra: Any) -> dict[str, Any]:
    return {"schema_version": 1, "session": {"id": session_id, **extra}}


def descendants(pid: int) -> set[int]:
    """Every process below pid, read from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as stat:
                parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class DaemonProcess:
    """A real sessionstored process on a real socket, readiness via a fake NOTIFY_SOCKET;
    on the embedded log, or on PostgreSQL when given a database URL."""

    def __init__(
        self, workdir: Path, database_url: str | None = None, prefix: tuple[str, ...] = ()
    ) -> None:
        self.workdir = workdir
        self.database_url = database_url
        self.prefix = prefix  # e.g. `ip netns exec NAME`: the daemon runs on another "host"
        self.state_dir = workdir / "state"
        self.socket_path = str(workdir / "sock")
        self.notify_path = str(workdir / "notify")
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "daemon.log"
        self.notifications: list[str] = []
        self._notify_sock: socket.socket | None = None

    def command(self, *extra: str) -> list[str]:
        return [
            *self.prefix,
            sys.executable,
            "-m",
            "sessionstored",
            "--state-dir",
            str(self.state_dir),
            "--socket",
            self.socket_path,
            *(["--database", self.database_url] if self.database_url else []),
            *extra,
        ]

    def start(self, *extra: str, env: dict[str, str] | None = None, wait: bool = True) -> None:
        assert self.proc is None or self.proc.poll() is not None, "daemon already running"
        if self._notify_sock is None:
            if os.path.exists(self.notify_path):
                os.unlink(self.notify_path)
            self._notify_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._notify_sock.bind(self.notify_path)
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONSTORE")}
        full_env["NOTIFY_SOCKET"] = self.notify_path
        # the tests move a daemon's expiry clock (wall_clock.py) instead of waiting
        full_env["SESSIONSTORED_UNSAFE_SETTABLE_CLOCK"] = "1"
        full_env.update(env or {})
        self.notifications = []
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(*extra), env=full_env, stdout=log, stderr=subprocess.STDOUT
            )
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        assert self.proc is not None and self._notify_sock is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            if self.wait_notification("READY=1", timeout=0.2):
                return
        raise AssertionError(f"daemon not ready after {READY_TIMEOUT_S}s:\n{self.log()}")

    def wait_notification(self, field: str, timeout: float) -> bool:
        assert self._notify_sock is not None
        deadline = time.monotonic() + timeout
        while not any(field in n.split("\n") for n in self.notifications):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._notify_sock.settimeout(remaining)
            try:
                self.notifications.append(self._notify_sock.recv(4096).decode())
            except TimeoutError:
                return False
        return True

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self, timeout: float = 30.0) -> Client:
        return Client(self.socket_path, timeout=timeout)

    def stop(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill9(self) -> None:
        """SIGKILL, and every process the daemon started (workers, the fork server, the
        resource tracker) must go with it."""
        assert self.proc is not None
        children = descendants(self.proc.pid) if self.proc.poll() is None else set()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        deadline = time.monotonic() + 20
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in children if alive(pid)]
        assert not left, f"processes the killed daemon started are still running: {left}"

    def wait_exit(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self._notify_sock is not None:
            self._notify_sock.close()


def take_backup(daemon: DaemonProcess, path: Path) -> Path:
    command = [sys.executable, "-m", "sessionstore.tools.cli", "--socket", daemon.socket_path,
               "backup", str(path)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return path


@contextlib.contextmanager
def restored_client(backup: Path) -> Iterator[Client]:
    """A client of a daemon serving the backup restored into a new log store."""
    workdir = Path(tempfile.mkdtemp(prefix="ss-", dir="/tmp"))
    command = [sys.executable, "-m", "sessionstored", "restore", str(backup),
               "--state-dir", str(workdir / "state")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    restored = DaemonProcess(workdir)
    restored.start()
    try:
        with restored.client() as client:
            yield client
    finally:
        restored.stop()
        restored.cleanup()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # AF_UNIX paths are limited to 107 bytes: pytest's tmp_path can be longer
    path = Path(tempfile.mkdtemp(prefix="ss-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    require("initdb")
    for server in start_server():
        assert server is not None  # require() found initdb
        yield server


@pytest.fixture(params=["log", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    """Every end-to-end test runs on both backends, except those about the log's files
    (marked log_only), which run on the log alone."""
    if request.param == "postgresql" and request.node.get_closest_marker("log_only"):
        pytest.skip("about the embedded log's files")
    return str(request.param)


@pytest.fixture
def daemon(
    short_tmp: Path, backend: str, request: pytest.FixtureRequest
) -> Iterator[DaemonProcess]:
    database_url = None
    if backend == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres")
        database_url = server.url(server.create_database())
    process = DaemonProcess(short_tmp, database_url)
    yield process
    try:
        if process.proc is not None and process.proc.poll() is None:
            with process.client() as client:
                result = client.verify()
                internal_errors = client.stats()["internal_errors"]
            assert result["problems"] == [], result
            assert internal_errors == 0, f"the daemon answered `internal`: {process.log()}"
            assert process.stop() == 0, process.log()
    finally:
        process.cleanup()


@pytest.fixture
def running(daemon: DaemonProcess) -> DaemonProcess:
    daemon.start()
    return daemon


def pytest_report_header() -> list[str]:
    line = missing_line()
    return [line] if line else []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    line = missing_line()
    if line:
        terminalreporter.write_line(line, yellow=True)
