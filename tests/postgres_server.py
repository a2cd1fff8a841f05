# A throwaway PostgreSQL cluster for the tests, started by the tests: initdb
# and pg_ctl from the machine's PostgreSQL (Debian's postgresql package), run
# as an unprivileged user when the tests run as root, listening on a Unix
# socket and on 127.0.0.1 (password required over TCP). Each test gets a fresh
# database of its own.
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "sessionstore"
NAMESPACE_NETWORK = "10.77.0.0/16"  # tests/test_postgres_hosts.py's veth links
PASSWORD = "throwaway-test-password"


def _bin_dir() -> Path | None:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PostgresServer:
    bin_dir: Path
    data_dir: Path
    socket_dir: Path
    port: int
    run_as: str | None
    preload: str = ""  # shared_preload_libraries (the bench's pg_stat_statements)

    def _run(self, *command: str) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", self.run_as, "--"] if self.run_as else []
        return subprocess.run(
            [*prefix, *command], check=True, capture_output=True, text=True, timeout=120
        )

    def start(self) -> None:
        options = (
            f"-c listen_addresses=* -p {self.port} -k {self.socket_dir}"
            " -c fsync=on -c synchronous_commit=on -c max_connections=300"
        )
        if self.preload:
            options += f" -c shared_preload_libraries={self.preload}"
        if "pg_stat_statements" in self.preload:  # inside functions too; functions' own time
            options += " -c pg_stat_statements.track=all -c pg_stat_statements.track_planning=on"
            options += " -c track_functions=pl"
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-o", options, "-w",
                  "-l", str(self.data_dir / "server.log"), "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "stop")

    def restart_immediately(self) -> None:
        """-m immediate: no checkpoint, no goodbye to clients (a crash, for the server)."""
        self.stop("immediate")
        self.start()

    def url(self, database: str, *, host: str = "127.0.0.1", password: str = PASSWORD) -> str:
        return f"postgresql://{SUPERUSER}:{password}@{host}:{self.port}/{database}"

    def local_url(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@/{database}?host={self.socket_dir}&port={self.port}"

    def sql(self, database: str, statement: str) -> None:
        self._run(
            str(self.bin_dir / "psql"), "-h", str(self.socket_dir), "-p", str(self.port),
            "-U", SUPERUSER, "-d", database, "-v", "ON_ERROR_STOP=1", "-c", statement,
        )  # fmt: skip

    def create_database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.sql("postgres", f"CREATE DATABASE {name}")
        return name


def server_user() -> str | None:
    """Who the servers run as: initdb refuses root."""
    if os.geteuid() != 0:
        return None
    return "postgres" if _user_exists("postgres") else "nobody"


def new_cluster(bin_dir: Path, base: Path) -> PostgresServer:
    """initdb in base (made here, owned by the user the server runs as), not started."""
    base.mkdir(exist_ok=True)
    run_as = server_user()
    if run_as:
        shutil.chown(base, user=run_as)
    data, sockets = base / "data", base / "sock"
    for path in (data, sockets):
        path.mkdir()
        if run_as:
            shutil.chown(path, user=run_as)
    password_file = base / "pw"
    password_file.write_text(PASSWORD)
    if run_as:
        shutil.chown(password_file, user=run_as)
    server = PostgresServer(bin_dir, data, sockets, _free_port(), run_as)
    server._run(
        str(bin_dir / "initdb"), "-D", str(data), "-U", SUPERUSER, "--pwfile", str(password_file),
        "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync",
    )  # fmt: skip
    return server


def start_server(preload: str = "") -> Iterator[PostgresServer | None]:
    bin_dir = _bin_dir()
    if bin_dir is None:
        yield None
        return
    base = Path(tempfile.mkdtemp(prefix="sspg-", dir="/tmp"))
    server = new_cluster(bin_dir, base)
    server.preload = preload
    with open(server.data_dir / "pg_hba.conf", "a") as hba:  # the namespaces' veth links
        hba.write(f"host all all {NAMESPACE_NETWORK} scram-sha-256\n")
    server.start()
    try:
        yield server
    finally:
        try:
            server.stop("immediate")
        finally:
            shutil.rmtree(base, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
