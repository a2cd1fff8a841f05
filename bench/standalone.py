# Running one part of `make bench` alone (python -m bench.adapters, bench.postgres,
# bench.item_cost_alone): a temporary directory on the chosen disk, the part, its
# figures printed; with draw, the figures also go to bench/results/NAME.json and
# draw makes the part's picture and section of the performance page from it.
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.options import existing_dir

Part = Callable[[Any, Path, float], dict[str, Any]]  # (daemon factory, workdir, seconds)
Draw = Callable[[Path], list[Path]]  # result file -> what it wrote


def run_alone(prog: str, part: Part, default_seconds: float, draw: Draw | None = None) -> None:
    from .daemon import Daemon

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument(
        "--dir", default=None, type=existing_dir, help="where to put the stores (a real disk)"
    )
    parser.add_argument("--seconds", type=float, default=default_seconds)
    options = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ssbench-", dir=options.dir))
    try:
        result = part(Daemon, base, options.seconds)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for name, figures in result.items():
        print(f"{name}: {json.dumps(figures)}")
    if draw is not None:
        from .rows import RESULTS, run_header

        RESULTS.mkdir(exist_ok=True)
        result_file = RESULTS / f"{prog.rsplit('.', 1)[-1]}.json"
        header = run_header(" ".join([prog, *sys.argv[1:]]))
        result_file.write_text(json.dumps({**header, "figures": result}))
        for path in draw(result_file):
            print(f"bench: wrote {path}")
