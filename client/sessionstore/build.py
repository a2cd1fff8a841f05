# Which build of the daemon's request path runs: "compiled" (mypyc, from this same
# source, built by `make` where a C compiler works) or "interpreted".
#
# compiled_modules.py is the one list of what is compiled (setup.py reads it too).
# Compiled code calls across its modules, and across groups, without going through
# Python. So a package is all or nothing: were one module of it imported from source
# and the rest compiled, two copies of its classes would run side by side.
#
# The compiled extension files sit next to their sources, and Python's import prefers
# them. choose_build() (run by the package's __init__ before any of its compiled
# modules is imported; for this package, by this module) turns that around when
# SESSIONSTORE_BUILD=interpreted, or when a source is newer than its extension (an
# edit since the last `make`): then all of that package's compiled modules are
# imported from their sources.
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from .compiled_modules import COMPILED_GROUPS

ENVIRONMENT_VARIABLE = "SESSIONSTORE_BUILD"
COMPILED = "compiled"
INTERPRETED = "interpreted"

_chosen: dict[str, str] = {}  # package -> the build it runs
_sources: dict[str, dict[str, Path]] = {}  # package -> its compiled modules' sources


def module_name(package: str, path: str) -> str:
    """("sessionstored", "front/outbox.py") -> sessionstored.front.outbox"""
    return ".".join((package, *Path(path).with_suffix("").parts))


# the name setuptools gives an extension module built for this interpreter
EXTENSION_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _built_and_current(sources: list[Path]) -> bool:
    """Every compiled module has its extension, none older than its source."""
    try:
        return all(
            source.with_suffix(EXTENSION_SUFFIX).stat().st_mtime >= source.stat().st_mtime
            for source in sources
        )
    except FileNotFoundError:
        return False


def decide_build(package: str, sources: list[Path]) -> str:
    wanted = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if wanted not in ("", COMPILED, INTERPRETED):
        raise RuntimeError(f"{ENVIRONMENT_VARIABLE} must be {COMPILED!r} or {INTERPRETED!r}")
    if wanted == INTERPRETED:
        return INTERPRETED
    if _built_and_current(sources):
        return COMPILED
    if wanted == COMPILED:
        raise RuntimeError(
            f"{ENVIRONMENT_VARIABLE}=compiled, but {package}'s compiled modules are missing"
            " or older than their source: run make"
        )
    return INTERPRETED


def compiled_available(package: str) -> bool:
    """The package's compiled modules are built and current (whichever build runs)."""
    return package in _sources and _built_and_current(list(_sources[package].values()))


def running(package: str) -> str:
    """The build the package runs ("compiled" or "interpreted"), once it is imported."""
    return _chosen.get(package, INTERPRETED)


class _SourceFirst:
    """A finder that imports a package's compiled modules from their sources."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        source = self.sources.get(fullname)
        if source is None:
            return None
        loader = importlib.machinery.SourceFileLoader(fullname, str(source))
        return importlib.util.spec_from_file_location(fullname, source, loader=loader)


def choose_build(package: str, package_path: Sequence[str]) -> None:
    """Run by the package's __init__, before any of its compiled modules is imported."""
    if package in _chosen:
        return
    root = Path(package_path[0])
    sources = _sources[package] = {
        module_name(package, path): root / path for path in COMPILED_GROUPS[package]
    }
    _chosen[package] = decide_build(package, list(sources.values()))
    if _chosen[package] == INTERPRETED:
        sys.meta_path.insert(0, _SourceFirst(sources))


choose_build("sessionstore", [str(Path(__file__).parent)])  # this module's own package
