"""policy.rate.RatePredictor: max(EWMA, window max) × headroom, as both controllers use it."""

from __future__ import annotations

import pytest

from gshare.policy.rate import RateError, RatePredictor


def test_combined_prediction() -> None:
    p = RatePredictor.fresh(alpha=0.5, window=3, headroom=1.2)
    assert p.predicted_rps() == 0.0
    p = p.observed(10, 1.0)  # EWMA 10, window [10]
    p = p.observed(0, 1.0)  # EWMA 5, window [10, 0]: max 10
    assert p.predicted_rps() == pytest.approx(10 * 1.2)
    p = p.observed(0, 1.0).observed(0, 1.0)  # window [0, 0, 0], EWMA 1.25
    assert p.predicted_rps() == pytest.approx(1.25 * 1.2)


def test_reset_keeps_parameters() -> None:
    p = RatePredictor.fresh(alpha=0.3, window=4, headroom=1.5).observed(8, 2.0)
    r = p.reset()
    assert r.predicted_rps() == 0.0
    assert (r.ewma.alpha, r.window.k, r.headroom) == (0.3, 4, 1.5)


def test_bad_headroom() -> None:
    with pytest.raises(RateError, match="headroom"):
        RatePredictor.fresh(headroom=0.5)
