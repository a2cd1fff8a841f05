# The command lines as a newcomer meets them, against a real daemon: exit codes
# (one per kind of outcome, the same for every command), messages that name
# what is at fault and the fix, --json, the terminal format under a pty,
# `where`, watch's start line and Ctrl-C.
from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import IO

import pytest

from sessionstore import paths
from sessionstore.tools.cli_common import EXIT_CODES

from .conftest import DaemonProcess, snapshot


def cli(
    *args: str,
    socket_path: str | None = None,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sessionstore.tools.cli"]
    if socket_path is not None:
        command += ["--socket", socket_path]
    return subprocess.run(
        [*command, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def terminal() -> tuple[int, int]:
    """A pty (master, slave) the size of a real terminal (a new one is 0 by 0 columns)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    return master, slave


def drain(master: int, idle_s: float = 1.0) -> bytes:
    """Everything written to a pty until it has been quiet for idle_s; closes it."""
    chunks = []
    while select.select([master], [], [], idle_s)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other side is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return b"".join(chunks)


def with_stderr_on_a_terminal(command: list[str]) -> tuple[subprocess.CompletedProcess[str], bytes]:
    """Run command with stdout piped and stderr on a pty (where progress bars go): the
    result, and what the terminal showed."""
    master, slave = terminal()
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=slave, text=True, timeout=120)
    os.close(slave)
    return result, drain(master)


def on_a_terminal(*args: str, socket_path: str) -> str:
    """What the CLI prints with a pty as its stdin and stdout."""
    return run_on_a_terminal(*args, socket_path=socket_path)[0]


def run_on_a_terminal(*args: str, socket_path: str) -> tuple[str, int, str]:
    """stdout, exit status and stderr of the CLI with a pty as its stdin and stdout."""
    master, slave = terminal()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sessionstore.tools.cli", "--socket", socket_path, *args],
        stdin=slave,
        stdout=slave,
        stderr=subprocess.PIPE,
    )
    os.close(slave)
    shown = drain(master, idle_s=30)
    proc.wait(30)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    return shown.decode().replace("\r\n", "\n"), proc.returncode, err


def test_no_exit_status_means_two_things_across_the_two_commands() -> None:
    from sessionstored.exit_codes import ExitCode

    cli_meanings = dict(EXIT_CODES)
    shared = {code for code in ExitCode if code in cli_meanings}
    assert shared == {ExitCode.OK, ExitCode.FAILED, ExitCode.BAD_USAGE}  # 0, 1, 2 alike
    assert ExitCode.STORAGE_FAILURE not in cli_meanings


def test_version_and_help_show_defaults_and_the_exit_codes() -> None:
    assert cli("--version").stdout.startswith("sessionstore ")
    top = cli("--help").stdout
    for code, _ in EXIT_CODES:
        assert f"  {code:>3}  " in top
    assert "sessionstore where" in top
    assert "(default: 60.0)" in top
    assert "(default: -)" in cli("put", "--help").stdout
    daemon_help = subprocess.run(
        [sys.executable, "-m", "sessionstored", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "rekey" in daemon_help and "(default: 0660)" in daemon_help


def test_not_found_is_3_for_every_reader(running: DaemonProcess) -> None:
    sock = running.socket_path
    for args in (
        ("get", "nope"),
        ("head", "nope"),
        ("exists", "nope"),
        ("checkpoint", "get", "loop", "nope"),
    ):
        result = cli(*args, socket_path=sock)
        assert result.returncode == 3, (args, result)
    assert json.loads(cli("head", "nope", socket_path=sock).stdout)["found"] is False


def test_conflicts_are_5_and_say_what_happened(running: DaemonProcess) -> None:
    sock = running.socket_path
    document = json.dumps(snapshot("c/1"))
    put = cli("put", "-", socket_path=sock, stdin=document)
    assert put.returncode == 0, put.stderr
    create_only = cli("put", "--create-only", "-", socket_path=sock, stdin=document)
    assert create_only.returncode == 5
    assert "already exists (create-only)" in create_only.stderr
    assert "expect does not match" not in create_only.stderr
    cli("put", "-", socket_path=sock, stdin=json.dumps(snapshot("c/2")))
    fork = cli("fork", "c/1", "c/2", "/ws", socket_path=sock)
    assert fork.returncode == 5 and "cannot fork onto 'c/2'" in fork.stderr
    stale = cli("rm", "c/1", "--expect", "xxh3-128:" + "0" * 32, socket_path=sock)
    assert stale.returncode == 5 and "no longer at the expected digest" in stale.stderr


def test_a_fence_is_6_and_says_who_holds_the_lease_never_its_epoch(
    running: DaemonProcess,
) -> None:
    sock = running.socket_path
    acquired = cli("lease", "acquire", "--holder", "ops", socket_path=sock)
    epoch = json.loads(acquired.stdout)["epoch"]
    assert f"--lease ops:{epoch}" in acquired.stderr
    fenced = cli("put", "-", socket_path=sock, stdin=json.dumps(snapshot("f")))
    assert fenced.returncode == 6
    assert "held by 'ops'" in fenced.stderr and "lease acquire --holder" in fenced.stderr
    assert str(epoch) not in fenced.stderr and "--lease ops:" not in fenced.stderr
    bad = cli("put", "--lease", "ops", "-", socket_path=sock, stdin="{}")
    assert bad.returncode == 2 and "HOLDER:EPOCH" in bad.stderr
    allowed = cli(
        "put", "--lease", f"ops:{epoch}", "-", socket_path=sock, stdin=json.dumps(snapshot("f"))
    )
    assert allowed.returncode == 0, allowed.stderr


def test_usage_errors_are_2_and_name_the_input(running: DaemonProcess, tmp_path: Path) -> None:
    sock = running.socket_path
    broken = tmp_path / "snapshot.json"
    broken.write_text('{"schema_version": 1,')
    result = cli("put", str(broken), socket_path=sock)
    assert result.returncode == 2
    assert str(broken) in result.stderr and "not valid JSON" in result.stderr
    missing = cli("put", str(tmp_path / "absent.json"), socket_path=sock)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    invalid = cli("put", "-", socket_path=sock, stdin='{"schema_version": 2}')
    assert invalid.returncode == 2 and "invalid_snapshot" in invalid.stderr
    assert cli("frobnicate", socket_path=sock).returncode == 2
    out, code, err = run_on_a_terminal("put", socket_path=sock)  # no file, stdin a terminal
    assert (out, code) == ("", 2) and "give a JSON file" in err


def test_no_daemon_is_7_with_a_hint_to_start_one(tmp_path: Path) -> None:
    result = cli("stats", socket_path=str(tmp_path / "nobody.sock"))
    assert result.returncode == 7
    assert "no daemon is listening on" in result.stderr and "make run" in result.stderr
    assert "Traceback" not in result.stderr


def test_json_under_a_pipe_and_readable_on_a_terminal(running: DaemonProcess) -> None:
    sock = running.socket_path
    for name in ("b", "a", "c"):
        cli("put", "-", socket_path=sock, stdin=json.dumps(snapshot(name)))
    assert cli("ls", socket_path=sock).stdout.split() == ["a", "b", "c"]
    assert len(cli("stats", socket_path=sock).stdout.strip().splitlines()) == 1
    assert on_a_terminal("ls", socket_path=sock).split() == ["a", "b", "c"]
    assert json.loads(on_a_terminal("ls", "--json", socket_path=sock))["ids"] == ["a", "b", "c"]
    stats = on_a_terminal("stats", socket_path=sock)
    assert len(stats.splitlines()) > 5 and json.loads(stats)["sessions"] == 3
    assert on_a_terminal("exists", "a", socket_path=sock).strip() == "yes"


def test_where_says_which_socket_and_state_dir_and_why(
    running: DaemonProcess, tmp_path: Path
) -> None:
    bare = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("XDG_", "SESSIONSTORE", "RUNTIME_DIRECTORY", "STATE_DIRECTORY", "SESSIONSTORED")
        )
    }
    (tmp_path / "run").mkdir(mode=0o700)  # never the fallback, where `make run` may serve
    env_run = subprocess.run(
        [sys.executable, "-m", "sessionstore.tools.cli", "--json", "where"],
        capture_output=True,
        text=True,
        env={**bare, "HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")},
        check=True,
    )
    report = json.loads(env_run.stdout)
    assert report["socket"] == f"{tmp_path}/run/sessionstored.sock"
    assert report["socket_reason"] == "$XDG_RUNTIME_DIR" and report["serves"] is None
    assert report["state_dir"] == f"{tmp_path}/.local/state/sessionstored"
    pointed = cli("--json", "where", env={"SESSIONSTORE_SOCKET": running.socket_path})
    report = json.loads(pointed.stdout)
    assert report["socket"] == running.socket_path
    assert report["socket_reason"] == "$SESSIONSTORE_SOCKET"
    assert report["socket_status"] == "a daemon is listening"
    # asked over the socket: the state directory that daemon serves, not the defaults
    served = report["serves"]
    assert served == str(running.state_dir) or served.startswith("postgresql://"), served
    human = on_a_terminal("where", socket_path=running.socket_path)
    assert "(" not in human.splitlines()[0], human  # no brackets within brackets


def test_the_client_falls_back_to_the_systemd_socket(
    running: DaemonProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(paths, "SYSTEMD_SOCKET", running.socket_path)
    env = {"XDG_RUNTIME_DIR": str(tmp_path)}  # nothing listens there
    choice = paths.client_socket(None, env, os.getuid())
    assert choice.path == running.socket_path and "systemd" in choice.reason
    (tmp_path / "sessionstored.sock").touch()  # not a socket: still the fallback
    assert paths.client_socket(None, env, os.getuid()).path == running.socket_path
    assert paths.client_socket("/x.sock", env, os.getuid()).path == "/x.sock"


def test_watch_says_where_it_starts_and_stops_cleanly_on_ctrl_c(running: DaemonProcess) -> None:
    sock = running.socket_path
    cli("put", "-", socket_path=sock, stdin=json.dumps(snapshot("w")))
    watcher = subprocess.Popen(
        [sys.executable, "-m", "sessionstore.tools.cli", "--socket", sock, "watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a shell runs a background job with SIGINT ignored, and a child inherits that:
        # Ctrl-C reaches the watch as it would in a terminal only with it restored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert watcher.stdout is not None and watcher.stderr is not None
    try:
        started = _line_of(watcher.stderr)  # once it says so, the watch is open
        cli("put", "-", socket_path=sock, stdin=json.dumps(snapshot("w2")))
        event = _line_of(watcher.stdout)
        watcher.send_signal(signal.SIGINT)
        out, err = watcher.communicate(timeout=30)
    finally:  # never left behind, whatever failed above
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 130
    assert "watching changes after seq 1" in started and "Traceback" not in err
    assert [json.loads(line)["session_id"] for line in [event, *out.splitlines()]] == ["w2"]


def _line_of(stream: IO[str], timeout_s: float = 30.0) -> str:
    """The next line a child writes to this pipe, as soon as it is written."""
    ready, _, _ = select.select([stream], [], [], timeout_s)
    assert ready, f"no line within {timeout_s} s"
    return stream.readline()


def test_json_lines_mode_tolerates_leading_whitespace(running: DaemonProcess) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(running.socket_path)
        sock.sendall(b' \n\t {"op":"ping","rid":1}\n')
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert json.loads(reply) == {"ok": True, "rid": 1}


def test_a_second_daemon_on_the_same_socket_says_so_plainly(
    running: DaemonProcess, tmp_path: Path
) -> None:
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "sessionstored",
            "--state-dir",
            str(tmp_path / "other"),
            "--socket",
            running.socket_path,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert "another daemon is already listening" in second.stderr
    assert "recovery runs" not in second.stderr


@pytest.mark.log_only  # rekey reseals the log
def test_rekey_shows_a_progress_bar_on_a_terminal(daemon: DaemonProcess, tmp_path: Path) -> None:
    daemon.start()
    with daemon.client() as client:
        for n in range(20):
            client.save(snapshot(f"k{n}"))
    daemon.stop()
    key = tmp_path / "new.key"
    key.write_bytes(os.urandom(32))
    rekey, shown = with_stderr_on_a_terminal(
        [sys.executable, "-m", "sessionstored", "rekey", "--state-dir", str(daemon.state_dir),
         "--new-key-file", str(key)]
    )  # fmt: skip
    assert rekey.returncode == 0, shown
    assert "resealed" in rekey.stdout
    assert b"resealing" in shown and b"documents" in shown


def test_verify_shows_its_elapsed_time_on_a_terminal(running: DaemonProcess) -> None:
    result, shown = with_stderr_on_a_terminal(
        [sys.executable, "-m", "sessionstore.tools.cli", "--socket", running.socket_path, "verify"]
    )
    assert result.returncode == 0 and json.loads(result.stdout)["problems"] == []
    assert b"verify: 00:0" in shown


def test_the_cli_takes_its_options_anywhere_and_refuses_what_it_cannot_use(
    running: DaemonProcess,
) -> None:
    sock = running.socket_path
    cli("put", "-", socket_path=sock, stdin=json.dumps(snapshot("o")))
    for args in (
        ["--socket", sock, "--json", "--timeout", "5", "ls"],
        ["ls", "--socket", sock, "--json", "--timeout", "5"],
        ["--json", "ls", "--socket", sock],
    ):
        done = cli(*args)
        assert done.returncode == 0 and json.loads(done.stdout) == {"ids": ["o"], "next": None}
    for args, words in (
        (["--timeout", "-1", "ls"], "--timeout: -1 is not a positive number of seconds"),
        (["ls", "--timeout", "0"], "--timeout: 0 is not a positive number of seconds"),
        (["watch", "--count", "0"], "--count: 0 is not 1 or more"),
        (["watch", "--since", "-1"], "--since: -1 is not a seq"),
        (["checkpoint", "get", "kv", "k", "extra"], "checkpoint get takes no value: unexpected"),
        (["ping", "extra"], "unrecognized arguments: extra"),
    ):
        done = cli(*args, socket_path=sock)
        assert done.returncode == 2, (args, done.stderr)
        [line] = done.stderr.strip().splitlines()
        assert words in line and done.stdout == "", (args, line)
    bad = cli("call", "ping", "{", socket_path=sock)
    assert bad.returncode == 2 and "ARGS is not valid JSON" in bad.stderr


def test_ls_is_one_id_per_line_and_one_json_shape_whatever_the_flags(
    running: DaemonProcess,
) -> None:
    sock = running.socket_path
    for name in ("b", "a", "c"):
        cli("put", "-", socket_path=sock, stdin=json.dumps(snapshot(name)))
    for n in range(3):
        cli("checkpoint", "put", "kv", f"k/{n}", "{}", socket_path=sock)
    assert cli("ls", socket_path=sock).stdout == "a\nb\nc\n"
    page = cli("ls", "--limit", "2", socket_path=sock)
    assert page.stdout == "a\nb\n" and "--after 'b'" in page.stderr
    assert cli("ls", "--limit", "2", "--after", "b", socket_path=sock).stdout == "c\n"
    assert json.loads(cli("ls", "--json", socket_path=sock).stdout) == {
        "ids": ["a", "b", "c"],
        "next": None,
    }
    assert json.loads(cli("ls", "--json", "--limit", "2", socket_path=sock).stdout) == {
        "ids": ["a", "b"],
        "next": "b",
    }
    assert cli("ls", "--kind", "kv", "--prefix", "k/", socket_path=sock).stdout == (
        "k/0\nk/1\nk/2\n"
    )
    assert on_a_terminal("ls", socket_path=sock).split() == ["a", "b", "c"]
    assert cli("ls", "--kind", "loop", socket_path=sock).stdout == ""


def test_completion_and_man_pages_come_from_the_parser(tmp_path: Path) -> None:
    from sessionstore.tools.install_docs import install

    written = install(tmp_path)
    commands = ["ls", "put", "watch", "checkpoint", "where", "completion"]
    bash = (tmp_path / "share/bash-completion/completions/sessionstore").read_text()
    assert subprocess.run(["bash", "-n"], input=bash, text=True, check=False).returncode == 0
    assert all(name in bash for name in commands)
    assert (
        "--kind" in bash
        and "_sessionstore" in (tmp_path / "share/zsh/site-functions/_sessionstore").read_text()
    )
    pages = {p.name for p in written if p.suffix == ".1"}
    assert {"sessionstore.1", *(f"sessionstore-{name}.1" for name in commands)} <= pages
    ls_path = tmp_path / "share/man/man1/sessionstore-ls.1"
    ls_page = ls_path.read_text()
    assert ls_page.startswith('.TH SESSIONSTORE\\-LS "1"') and "\\-\\-kind" in ls_page
    if shutil.which("lexgrog"):  # what whatis and apropos read of each page
        for page in pages:
            name = page.removesuffix(".1")
            found = subprocess.run(["lexgrog", str(tmp_path / "share/man/man1" / page)],
                                   capture_output=True, text=True, check=True).stdout  # fmt: skip
            assert f'"{name} - ' in found, found
    printed = cli("completion", "bash")
    assert printed.returncode == 0 and printed.stdout.strip() == bash.strip()


def test_watch_since_beyond_the_store_says_that_it_waits(running: DaemonProcess) -> None:
    watcher = subprocess.Popen(
        [sys.executable, "-m", "sessionstore.tools.cli", "--socket", running.socket_path, "watch",
         "--since", "999"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert watcher.stderr is not None
        first, second = watcher.stderr.readline(), watcher.stderr.readline()
    finally:
        watcher.kill()
        watcher.communicate()
    assert "watching changes after seq 999" in first
    assert "the store is at seq 0: waiting until it passes 999" in second
