# How a figure of this run is judged against an issue's target.
from __future__ import annotations

from typing import Any


def verdict(value: float | None, bound: float, at_most: bool) -> tuple[Any, str]:
    """(the figure, "met" or "missed" with the bound), or "not measured"."""
    if value is None:
        return "-", "not measured"
    met = value <= bound if at_most else value >= bound
    return value, ("met" if met else "missed") + f" ({'<=' if at_most else '>='} {bound:g})"
