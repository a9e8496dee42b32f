"""Percentiles, the one way gshare computes them: linear between order statistics (numpy's
default, "linear"), so a figure means the same in every experiment, bench and model.

Who calls it: the profile table (``ProfileTable.launch_floor_ms``), the experiments' summaries
and the fidelity scoring, and the benches (``bench/_common.py``). Pure; no numpy needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``; NaN when there are none."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def percentile_or_none(values: Sequence[float], q: float) -> float | None:
    """``percentile``, or None when there are no values (a summary's missing figure)."""
    return percentile(values, q) if len(values) else None


__all__ = ["percentile", "percentile_or_none"]
