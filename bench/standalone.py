# Running one part of `make bench` alone (python -m bench.adapters, bench.postgres):
# a temporary directory on the chosen disk, the part, its figures printed.
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Part = Callable[[Any, Path, float], dict[str, Any]]  # (daemon factory, workdir, seconds)
PICTURED = ("adapters", "postgres")  # the parts with a picture on the performance page


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
    part = prog.rsplit(".", 1)[-1]
    if part in PICTURED:
        from .plots import write_part
        from .rows import RESULTS

        RESULTS.mkdir(exist_ok=True)
        result_file = RESULTS / f"{part}.json"
        command = " ".join([f"python -m bench.{part}", *sys.argv[1:]])
        when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        result_file.write_text(json.dumps({"when": when, "command": command, "figures": result}))
        for path in write_part(part, result_file):
            print(f"bench: wrote {path}")
