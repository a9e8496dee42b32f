"""policy.rate: EWMA and window-max request-rate predictors (pure, clock passed in)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gshare.policy.rate import EwmaRate, RateError, WindowMaxRate, observe, predict


def test_ewma_arithmetic() -> None:
    s = EwmaRate(alpha=0.5)
    assert predict(s) == 0.0  # nothing observed yet
    s = observe(s, 100, 10.0)  # first sample taken as is: 100 / 10 = 10 rps
    assert predict(s) == pytest.approx(10.0)
    s = observe(s, 300, 10.0)  # sample 30: 0.5 · 30 + 0.5 · 10 = 20
    assert predict(s) == pytest.approx(20.0)
    s = observe(s, 0, 5.0)  # sample 0: 0.5 · 0 + 0.5 · 20 = 10
    assert predict(s) == pytest.approx(10.0)
    assert s.samples == 3


def test_ewma_alpha() -> None:
    s = observe(observe(EwmaRate(alpha=0.2), 50, 1.0), 150, 1.0)
    # 50, then 0.2 · 150 + 0.8 · 50 = 30 + 40 = 70
    assert predict(s) == pytest.approx(70.0)
    s = observe(observe(EwmaRate(alpha=1.0), 50, 1.0), 150, 1.0)
    assert predict(s) == pytest.approx(150.0)  # alpha 1: only the last interval


def test_observe_returns_new_state() -> None:
    s0 = EwmaRate(alpha=0.5)
    s1 = observe(s0, 10, 1.0)
    assert s0.samples == 0 and s0.rate_rps == 0.0
    assert s1 is not s0


def test_window_max() -> None:
    s = WindowMaxRate(k=3)
    assert predict(s) == 0.0
    for count in (10, 50, 20):  # 1 s intervals: rates 10, 50, 20
        s = observe(s, count, 1.0)
    assert predict(s) == 50.0
    s = observe(s, 5, 1.0)  # window now 50, 20, 5
    assert predict(s) == 50.0
    s = observe(s, 5, 1.0)  # 20, 5, 5: the 50 fell out
    assert predict(s) == 20.0
    assert s.recent_rps == (20.0, 5.0, 5.0)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: EwmaRate(alpha=0.0), "alpha"),
        (lambda: EwmaRate(alpha=1.5), "alpha"),
        (lambda: WindowMaxRate(k=0), "k must"),
        (lambda: observe(EwmaRate(), -1, 1.0), "count"),
        (lambda: observe(EwmaRate(), 1, 0.0), "interval_s"),
        (lambda: observe(WindowMaxRate(), 1, -2.0), "interval_s"),
    ],
)
def test_validation(make: object, match: str) -> None:
    with pytest.raises(RateError, match=match):
        make()  # type: ignore[operator]


@settings(max_examples=100, deadline=None)
@given(
    st.floats(min_value=0.01, max_value=1.0),
    st.lists(
        st.tuples(st.integers(0, 10_000), st.floats(min_value=0.1, max_value=60.0)),
        min_size=1,
        max_size=20,
    ),
)
def test_ewma_stays_between_min_and_max_sample(alpha: float, obs: list[tuple[int, float]]) -> None:
    s = EwmaRate(alpha=alpha)
    for count, interval_s in obs:
        s = observe(s, count, interval_s)
    rates = [c / i for c, i in obs]
    assert min(rates) - 1e-9 <= predict(s) <= max(rates) + 1e-9
