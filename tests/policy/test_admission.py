"""``policy.admission``: SLO-aware shedding, table-driven with an injected clock."""

from __future__ import annotations

import pytest

from gshare.policy.admission import MAX_GAP_S, Admit, ServiceEstimate, admit


def estimate_from(departures: list[tuple[float, bool]]) -> ServiceEstimate:
    e = ServiceEstimate()
    for t, backlogged in departures:
        e.observe(t, backlogged)
    return e


def test_estimate_measures_only_backlogged_runs() -> None:
    # 10 ms apart while backlogged; an idle departure resets the run; a long gap is not a sample
    e = estimate_from([(0.0, True), (0.01, True), (0.02, True)])
    assert e.interval_s == pytest.approx(0.01)
    e.observe(0.5, False)  # the backlog emptied: the next gap (idle) is not a service interval
    e.observe(3.0, True)
    assert e.interval_s == pytest.approx(0.01)
    e.observe(3.0 + MAX_GAP_S + 0.5, True)  # too far apart: skipped
    assert e.interval_s == pytest.approx(0.01)
    e.observe(3.0 + MAX_GAP_S + 0.52, True)  # 20 ms: moves the mean towards it
    assert 0.01 < e.interval_s < 0.02  # type: ignore[operator]


def test_a_batch_answered_at_once_counts_its_requests() -> None:
    # batches of 4 every 40 ms: 4 departures at once, then a 40 ms gap -> 10 ms per request
    times = [b * 0.04 for b in range(200) for _ in range(4)]
    e = estimate_from([(t, True) for t in times])
    assert e.interval_s == pytest.approx(0.01, rel=0.15)  # an EWMA: it ripples within a batch


@pytest.mark.parametrize(
    ("outstanding", "interval_s", "slo_ms", "factor", "verdict"),
    [
        (0, 0.010, 20.0, 1.0, Admit.ACCEPT),  # nothing outstanding: served at once
        (1, 0.010, 20.0, 1.0, Admit.ACCEPT),  # (1 + 1) x 10 ms = 20 ms: within
        (2, 0.010, 20.0, 1.0, Admit.SHED),  # 30 ms > 20 ms
        (2, 0.010, 20.0, 2.0, Admit.ACCEPT),  # within 2 SLOs
        (500, 0.010, None, 1.0, Admit.ACCEPT),  # no SLO: never shed here
        (500, 0.010, 20.0, 0.0, Admit.ACCEPT),  # factor 0: shedding off
        (500, None, 20.0, 1.0, Admit.ACCEPT),  # no measurement yet: no guess
    ],
)
def test_admit_table(
    outstanding: int,
    interval_s: float | None,
    slo_ms: float | None,
    factor: float,
    verdict: Admit,
) -> None:
    d = admit(outstanding, ServiceEstimate(interval_s=interval_s), slo_ms, factor)
    assert d.verdict is verdict
    if interval_s is not None:
        assert d.predicted_ms == pytest.approx((outstanding + 1) * interval_s * 1000.0)


def test_admitted_backlog_is_bounded_by_the_slo() -> None:
    """Feeding admit's own decisions back: the accepted backlog never predicts past the SLO."""
    e = ServiceEstimate(interval_s=0.004)
    outstanding = 0
    for _ in range(1000):
        if admit(outstanding, e, 20.0, 1.0).verdict is Admit.ACCEPT:
            outstanding += 1
    assert (outstanding) * 4.0 <= 20.0
    assert outstanding == 5
