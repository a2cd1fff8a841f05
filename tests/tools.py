# Programs outside pip that some tests run, each with the Debian package that
# brings it. Where one is missing, a test that needs it is skipped, saying which
# package to install, and the run's header and summary say so in one line; under
# CI (CI=true, as .ci/run sets it) a missing program fails the test instead, since
# CI must run everything.
from __future__ import annotations

import glob
import os
import shutil

import pytest

# program -> (Debian package, what needs it)
TOOLS = {
    "socat": ("socat", "the socat round trips and the README's socat examples"),
    "initdb": ("postgresql", "every test on the PostgreSQL backend"),
    "systemd-analyze": ("systemd", "the unit checks"),
    "systemd-socket-activate": ("systemd", "socket activation"),
    "ip": ("iproute2", "the many-hosts tests' network namespaces"),
}


def installed(program: str) -> bool:
    if program == "initdb":  # Debian keeps it off PATH
        return bool(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or bool(shutil.which(program))
    return shutil.which(program) is not None


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(program: str, consequence: str = "") -> None:
    """Return when program is installed; skip the test otherwise (fail it under CI)."""
    if installed(program):
        return
    package, _ = TOOLS[program]
    message = f"{program} is not installed (apt install {package})"
    if consequence:
        message += f": {consequence}"
    if under_ci():
        pytest.fail(f"{message}; CI runs every test")
    pytest.skip(message)


def missing_line() -> str | None:
    """One line naming every missing program and its package, or None."""
    missing = [p for p in TOOLS if not installed(p)]
    if not missing:
        return None
    packages = sorted({TOOLS[p][0] for p in missing})
    needs = "; ".join(f"{p} for {TOOLS[p][1]}" for p in missing)
    effect = "those tests fail (CI=true)" if under_ci() else "those tests are skipped"
    return f"missing {needs}: {effect}; apt install {' '.join(packages)}"


def require_root(what: str) -> None:
    """Return as root; skip the test otherwise (fail it under CI, which runs as root)."""
    if os.geteuid() == 0:
        return
    message = f"{what} need root"
    if under_ci():
        pytest.fail(f"{message}; CI runs as root")
    pytest.skip(message)
