# `python -m bench.item_cost_alone [--dir DIR] [--seconds S]`: the cost per CBOR item
# alone (both helper paths, a few minutes), its picture and its section of the
# performance page; `make bench` draws the same from its full run.
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import item_cost
from .plots import write_item_cost
from .rows import RESULTS


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.item_cost_alone")
    parser.add_argument("--dir", default=None, help="where to put the stores (a real disk)")
    parser.add_argument("--seconds", type=float, default=5.0)
    options = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ssbench-", dir=options.dir))
    try:
        figures = item_cost.run(base, options.seconds)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    result_file = RESULTS / "item_cost.json"
    command = " ".join(["python -m bench.item_cost_alone", *sys.argv[1:]])
    when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result_file.write_text(json.dumps({"when": when, "command": command, "figures": figures}))
    for path in write_item_cost(result_file):
        print(f"bench: wrote {path}")


if __name__ == "__main__":
    main()
