# Running one part of `make bench` alone (python -m bench.adapters, bench.postgres):
# a temporary directory on the chosen disk, the part, its figures printed.
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

Part = Callable[[Any, Path, float], dict[str, Any]]  # (daemon factory, workdir, seconds)


def run_alone(prog: str, part: Part, default_seconds: float) -> None:
    from .daemon import Daemon

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--dir", default=None, help="where to put the stores (a real disk)")
    parser.add_argument("--seconds", type=float, default=default_seconds)
    options = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ssbench-", dir=options.dir))
    try:
        result = part(Daemon, base, options.seconds)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for name, figures in result.items():
        print(f"{name}: {json.dumps(figures)}")
