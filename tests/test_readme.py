# The README and every page under docs/, run: every sh and python block, in
# order, against a daemon started the way `make run` starts it (no flags: the
# default socket and state directory); the README once with the XDG variables set
# and once without them. So the documentation cannot rot. A block that cannot
# run here says why, in a `<!-- readme-test: skip: REASON -->` line just above it.
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sessionstore.paths import default_socket

from .conftest import private_tmp_command
from .tools import installed, require

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("**/*.md"))]
BLOCK = re.compile(
    r"(?P<skip><!-- readme-test: skip(?P<reason>[^>]*)-->\s*\n)?"
    r"(?P<indent>[ ]*)```(?P<lang>sh|python)\n(?P<body>.*?)\n(?P=indent)```",
    re.S,
)
BLOCK_TIMEOUT_S = 180


@dataclass
class Block:
    line: int
    lang: str
    body: str
    skip_reason: str | None


def readme_blocks(page: Path = README) -> list[Block]:
    text = page.read_text()
    blocks = []
    for match in BLOCK.finditer(text):
        indent = match["indent"]
        body = "\n".join(line.removeprefix(indent) for line in match["body"].splitlines())
        reason = match["reason"].strip(" :") if match["skip"] else None
        blocks.append(Block(text[: match.start()].count("\n") + 1, match["lang"], body, reason))
    return blocks


def test_every_python_block_type_checks(tmp_path: Path) -> None:
    """mypy --strict over every Python block of README.md and docs/, each a module of
    its own, against the packages' own sources."""
    written = []
    for page in PAGES:
        for block in readme_blocks(page):
            if block.lang == "python":
                path = tmp_path / f"{page.stem.replace('-', '_')}_line_{block.line}.py"
                path.write_text(block.body + "\n")
                written.append(str(path))
    assert len(written) >= 8
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", *written],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT / "client")},
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_skipped_block_says_why() -> None:
    blocks = [block for page in PAGES for block in readme_blocks(page)]
    assert len([b for b in blocks if b.skip_reason is None]) >= 15
    for block in blocks:
        assert block.skip_reason is None or len(block.skip_reason) > 10, block.line


def _environment(kind: str, home: Path) -> dict[str, str]:
    unset = ("XDG_", "SESSIONSTORE", "SESSIONSTORED", "RUNTIME_DIRECTORY", "STATE_DIRECTORY")
    env = {k: v for k, v in os.environ.items() if not k.startswith(unset)}
    env.pop("VIRTUAL_ENV", None)
    env["HOME"] = str(home)
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if ".venv" not in p)
    if kind == "xdg":
        (home / "run").mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(home / "run")
        env["XDG_STATE_HOME"] = str(home / "state")
    return env


def _listener_pid(socket_path: str) -> int | None:
    """The pid of whoever listens at socket_path (SO_PEERCRED), or None."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(2)
        try:
            sock.connect(socket_path)
        except OSError:
            return None
        credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        pid: int = struct.unpack("3i", credentials)[0]
        return pid


@dataclass
class Sandbox:
    """Where the README runs: the commands get prefix, so that without XDG variables,
    as root, they run in a mount namespace whose /tmp is its own, and the fallback
    socket /tmp/sessionstored-$UID is never one that `make run` beside us serves."""

    base: Path
    env: dict[str, str]
    prefix: list[str]

    def command(self, command: list[str], cwd: Path | None = None) -> list[str]:
        if not self.prefix:
            return command
        # entering a mount namespace moves to its root: name the directory again
        return [*self.prefix, f"--wd={cwd or os.getcwd()}", "--", *command]

    def run(
        self, command: list[str], cwd: Path | None = None, **options: object
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(command, cwd), cwd=cwd, env=self.env, **options)  # type: ignore[call-overload, no-any-return]


def _sandbox(kind: str, tmp_path: Path) -> Iterator[Sandbox]:
    if kind == "xdg":
        yield Sandbox(tmp_path, _environment(kind, tmp_path), [])
        return
    base = Path(tempfile.mkdtemp(prefix="sessionstore-readme-", dir="/var/tmp"))
    env = _environment(kind, base)
    holder = None
    try:
        if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("nsenter"):
            command, outside = private_tmp_command("sh", "-c", "echo ready && exec sleep infinity")
            holder = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
            assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
            yield Sandbox(base, env, ["nsenter", "--target", str(holder.pid), "--mount"])
            return
        fallback = default_socket(env, os.getuid()).path
        if _listener_pid(fallback) is not None:
            pytest.skip(f"a daemon we did not start listens on {fallback}, the fallback socket")
        yield Sandbox(base, env, [])
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
            outside.rmdir()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("kind", ["xdg", "no-xdg"])
def test_the_readme_runs_as_written(kind: str, tmp_path: Path) -> None:
    for sandbox in _sandbox(kind, tmp_path):
        _run_blocks(sandbox, README)


def _runnable(page: Path) -> bool:
    return any(block.skip_reason is None for block in readme_blocks(page))


@pytest.mark.parametrize(
    "page", [p for p in PAGES[1:] if _runnable(p)], ids=lambda page: str(page.relative_to(ROOT))
)
def test_each_page_runs_as_written(page: Path, tmp_path: Path) -> None:
    for sandbox in _sandbox("xdg", tmp_path):
        _run_blocks(sandbox, page)


def _run_blocks(sandbox: Sandbox, page: Path) -> None:
    base, env = sandbox.base, sandbox.env
    workdir = base / "clone"
    workdir.mkdir()
    (workdir / ".venv").symlink_to(ROOT / ".venv")  # what `make` made in a clone
    socket_path = default_socket(env, os.getuid()).path
    daemon = subprocess.Popen(
        sandbox.command([str(ROOT / ".venv" / "bin" / "sessionstored")]),  # `make run`, no ARGS
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    ours = f"""
import socket, struct, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect({socket_path!r})
pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
print(pid)
"""
    try:
        deadline = time.monotonic() + 30
        while True:
            probe = sandbox.run(
                [str(ROOT / ".venv" / "bin" / "python"), "-c", ours],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if probe.returncode == 0:
                # never a daemon we did not start: the one listening is the one we ran
                # (nsenter execs it, so the pid is the same)
                assert int(probe.stdout) == daemon.pid, "another daemon serves that socket"
                break
            assert daemon.poll() is None, daemon.communicate()[1]
            assert time.monotonic() < deadline, "the daemon did not come up"
            time.sleep(0.1)
        need_socat = []  # lines of the blocks that need socat, when it is missing
        for block in readme_blocks(page):
            if block.skip_reason is not None:
                continue
            if "socat" in block.body and not installed("socat"):
                need_socat.append(block.line)
                continue
            if block.lang == "sh":
                command = ["bash", "-e", "-o", "pipefail", "-c", block.body]
            else:
                script = base / f"readme_{block.line}.py"
                script.write_text(block.body)
                command = [str(ROOT / ".venv" / "bin" / "python"), str(script)]
            result = sandbox.run(
                command,
                cwd=workdir,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT_S,
            )
            where = f"{page.relative_to(ROOT)} line {block.line} ({block.lang})"
            assert result.returncode == 0, f"{where}:\n{result.stdout}\n{result.stderr}"
            assert result.stdout.strip(), f"{where} printed nothing"
            assert "Traceback" not in result.stderr, f"{where}:\n{result.stderr}"
        if need_socat:  # every other block ran
            lines = ", ".join(map(str, need_socat))
            require("socat", f"{page.relative_to(ROOT)} lines {lines} did not run")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    assert daemon.returncode == 0
    if not sandbox.prefix:
        assert not os.path.exists(socket_path)
    if sys.platform == "linux":
        state = env.get("XDG_STATE_HOME", str(base / ".local" / "state"))
        assert (Path(state) / "sessionstored" / "FORMAT").exists()


def test_the_protocol_page_documents_every_op_and_error_code() -> None:
    from sessionstore.wire.codes import ErrorCode
    from sessionstored.ops import REGISTRY

    page = (ROOT / "docs" / "protocol.md").read_text()
    table = page[page.index("## Ops") :]
    documented = set(re.findall(r"^\| `(\w+)`", table, re.M))
    assert set(REGISTRY) <= documented, set(REGISTRY) - documented
    for code in ErrorCode:
        assert f"| `{code.value}` |" in page, code
    assert "docs/protocol.md" in README.read_text()
