"""``gshare.stats``: the one percentile agrees with numpy's default (linear) and says when there
is nothing to take it of."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gshare.stats import percentile, percentile_or_none


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
    st.floats(0.0, 100.0),
)
def test_percentile_is_numpys_linear_percentile(xs: list[float], q: float) -> None:
    assert math.isclose(percentile(xs, q), float(np.percentile(xs, q)), rel_tol=1e-9, abs_tol=1e-6)


def test_empty_input_is_nan_or_none() -> None:
    assert math.isnan(percentile([], 50))
    assert percentile_or_none([], 50) is None
    assert percentile_or_none([3.0, 1.0, 2.0], 50) == 2.0
