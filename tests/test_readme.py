# The README, run: every sh and python block, in order, against a daemon
# started the way `make run` starts it (no flags: the default socket and state
# directory), once with the XDG variables set and once without them, so that
# the README cannot rot. A block that cannot run here says why, in a
# `<!-- readme-test: skip: REASON -->` line just above it.
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sessionstore.client import Client
from sessionstore.paths import default_socket

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
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


def readme_blocks() -> list[Block]:
    text = README.read_text()
    blocks = []
    for match in BLOCK.finditer(text):
        indent = match["indent"]
        body = "\n".join(line.removeprefix(indent) for line in match["body"].splitlines())
        reason = match["reason"].strip(" :") if match["skip"] else None
        blocks.append(Block(text[: match.start()].count("\n") + 1, match["lang"], body, reason))
    return blocks


def test_every_skipped_block_says_why() -> None:
    blocks = readme_blocks()
    assert len([b for b in blocks if b.skip_reason is None]) >= 6
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


@pytest.mark.parametrize("kind", ["xdg", "no-xdg"])
def test_the_readme_runs_as_written(kind: str, tmp_path: Path) -> None:
    workdir = tmp_path / "clone"
    workdir.mkdir()
    (workdir / ".venv").symlink_to(ROOT / ".venv")  # what `make` made in a clone
    env = _environment(kind, tmp_path)
    socket_path = default_socket(env, os.getuid()).path
    daemon = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "sessionstored")],  # `make run` with no ARGS
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with Client(socket_path, timeout=2) as client:
                    client.ping()
                break
            except Exception:
                assert daemon.poll() is None, daemon.communicate()[1]
                assert time.monotonic() < deadline, "the daemon did not come up"
                time.sleep(0.1)
        for block in readme_blocks():
            if block.skip_reason is not None:
                continue
            if block.lang == "sh":
                command = ["bash", "-e", "-o", "pipefail", "-c", block.body]
            else:
                script = tmp_path / f"readme_{block.line}.py"
                script.write_text(block.body)
                command = [str(ROOT / ".venv" / "bin" / "python"), str(script)]
            result = subprocess.run(
                command,
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT_S,
            )
            where = f"README.md line {block.line} ({block.lang})"
            assert result.returncode == 0, f"{where}:\n{result.stdout}\n{result.stderr}"
            assert result.stdout.strip(), f"{where} printed nothing"
            assert "Traceback" not in result.stderr, f"{where}:\n{result.stderr}"
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    assert daemon.returncode == 0
    assert not os.path.exists(socket_path)
    if sys.platform == "linux":
        state = env.get("XDG_STATE_HOME", str(tmp_path / ".local" / "state"))
        assert (Path(state) / "sessionstored" / "FORMAT").exists()


def test_the_protocol_page_documents_every_op_and_error_code() -> None:
    from sessionstore.codes import ErrorCode
    from sessionstored.ops import REGISTRY

    page = (ROOT / "docs" / "protocol.md").read_text()
    table = page[page.index("## Ops") :]
    documented = set(re.findall(r"^\| `(\w+)`", table, re.M))
    assert set(REGISTRY) <= documented, set(REGISTRY) - documented
    for code in ErrorCode:
        assert f"| `{code.value}` |" in page, code
    assert "docs/protocol.md" in README.read_text()
