# Which build of the request path runs (sessionstore/build.py): the compiled one only
# where every module's extension is there and no older than its source, the source
# wherever asked for or stale; and a daemon that says which one it runs.
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import sessionstored  # its __init__ chooses its build
from sessionstore import build, compiled_modules

EXTENSION = build.EXTENSION_SUFFIX
assert sessionstored.__version__


def _module(root: Path, name: str, *, compiled: bool, source_newer: bool = False) -> Path:
    source = root / f"{name}.py"
    source.write_text("VALUE = 1\n")
    if compiled:
        extension = root / f"{name}{EXTENSION}"
        extension.write_bytes(b"")
        older, newer = (extension, source) if source_newer else (source, extension)
        os.utime(older, (1_000_000, 1_000_000))
        os.utime(newer, (2_000_000, 2_000_000))
    return source


@pytest.fixture(autouse=True)
def _no_choice_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(build.ENVIRONMENT_VARIABLE, raising=False)


def test_every_module_built_and_current_runs_compiled(tmp_path: Path) -> None:
    sources = [_module(tmp_path, name, compiled=True) for name in ("a", "b")]
    assert build.decide_build("pkg", sources) == build.COMPILED


def test_one_module_edited_since_the_build_runs_all_from_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = [
        _module(tmp_path, "a", compiled=True),
        _module(tmp_path, "b", compiled=True, source_newer=True),
    ]
    assert build.decide_build("pkg", sources) == build.INTERPRETED
    monkeypatch.setenv(build.ENVIRONMENT_VARIABLE, build.COMPILED)
    with pytest.raises(RuntimeError, match="older than their source: run make"):
        build.decide_build("pkg", sources)


def test_a_module_never_built_runs_all_from_source(tmp_path: Path) -> None:
    sources = [_module(tmp_path, "a", compiled=True), _module(tmp_path, "b", compiled=False)]
    assert build.decide_build("pkg", sources) == build.INTERPRETED


def test_asked_for_source_runs_source_and_a_bad_value_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = [_module(tmp_path, "a", compiled=True)]
    monkeypatch.setenv(build.ENVIRONMENT_VARIABLE, build.INTERPRETED)
    assert build.decide_build("pkg", sources) == build.INTERPRETED
    monkeypatch.setenv(build.ENVIRONMENT_VARIABLE, "fast")
    with pytest.raises(RuntimeError, match="must be 'compiled' or 'interpreted'"):
        build.decide_build("pkg", sources)


def _imported_from(choice: str) -> list[str]:
    """Where a fresh process imports each compiled module from, under this choice."""
    program = (
        "import importlib, sessionstored\n"
        "from sessionstore import build, compiled_modules\n"
        "for package, paths in compiled_modules.COMPILED_GROUPS.items():\n"
        "    for path in paths:\n"
        "        print(importlib.import_module(build.module_name(package, path)).__file__)\n"
    )
    env = {**os.environ, build.ENVIRONMENT_VARIABLE: choice}
    run = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, check=True
    )
    return run.stdout.split()


def test_the_interpreted_build_imports_every_compiled_module_from_its_source() -> None:
    files = _imported_from(build.INTERPRETED)
    assert len(files) == sum(len(paths) for paths in compiled_modules.COMPILED_GROUPS.values())
    assert all(file.endswith(".py") for file in files)


def test_the_compiled_build_imports_every_compiled_module_compiled() -> None:
    if not build.compiled_available("sessionstored"):
        pytest.skip("the request path is not compiled here (no C compiler, or not built)")
    assert all(file.endswith(".so") for file in _imported_from(build.COMPILED))


def test_the_daemon_names_its_build_in_its_version() -> None:
    for choice in (build.INTERPRETED, build.COMPILED):
        if choice == build.COMPILED and not build.compiled_available("sessionstored"):
            continue
        env = {**os.environ, build.ENVIRONMENT_VARIABLE: choice}
        run = subprocess.run(
            [sys.executable, "-m", "sessionstored", "--version"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert f"(request path {choice}, CBOR helper " in run.stdout
