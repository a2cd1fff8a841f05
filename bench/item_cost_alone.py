# `python -m bench.item_cost_alone [--dir DIR] [--seconds S]`: the cost per CBOR item
# alone (both helper paths, a few minutes), its picture and its section of the
# performance page; `make bench` draws the same from its full run.
from __future__ import annotations

from . import item_cost
from .plots import write_item_cost
from .standalone import run_alone

if __name__ == "__main__":
    run_alone(
        "python -m bench.item_cost_alone",
        lambda _daemon, workdir, seconds: item_cost.run(workdir, seconds),
        5.0,
        write_item_cost,
    )
