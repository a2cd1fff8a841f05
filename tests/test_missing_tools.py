# A newcomer's `make test` on a machine without one of the programs the tests run
# (socat, here): the header names it and its Debian package in one line, and the
# tests that need it are skipped saying so; under CI (CI=true) they fail instead.
# Run as an inner pytest with a PATH that holds everything but socat.
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOCAT_TEST = "tests/test_e2e_basic.py::test_socat_round_trip_with_cbor2_tool[log]"


def _path_without(program: str, into: Path) -> str:
    """A PATH that finds every program the usual one does, except program."""
    into.mkdir()
    for directory in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = into / name
            if name != program and not target.exists():
                target.symlink_to(os.path.join(directory, name))
    return str(into)


@pytest.mark.parametrize("ci", ["", "true"])
def test_a_missing_program_is_named_once_and_its_tests_skip_except_under_ci(
    tmp_path: Path, ci: str
) -> None:
    env = {**os.environ, "PATH": _path_without("socat", tmp_path / "bin"), "CI": ci}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", SOCAT_TEST],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    out = result.stdout
    header = [line for line in out.splitlines() if line.startswith("missing socat for")]
    assert header and "apt install socat" in header[0], out
    if ci:
        assert result.returncode == 1 and "1 failed" in out, out
        assert "socat is not installed (apt install socat); CI runs every test" in out
    else:
        assert result.returncode == 0 and "1 skipped" in out, out
        assert "socat is not installed (apt install socat)" in out
        assert "Permission denied" not in out and "BrokenPipeError" not in out
