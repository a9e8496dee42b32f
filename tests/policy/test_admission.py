"""``policy.admission``: SLO-aware shedding, table-driven with an injected clock."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gshare.policy.admission import EWMA_ALPHA, MAX_GAP_S, Admit, ServiceEstimate, admit


def estimate_from(departures: list[tuple[float, bool]]) -> ServiceEstimate:
    e = ServiceEstimate()
    for t, backlogged in departures:
        e.observe(t, backlogged)
    return e


def test_estimate_measures_only_backlogged_runs() -> None:
    # 10 ms apart while backlogged; an idle departure resets the run; a long gap is not a sample
    e = estimate_from([(0.0, True), (0.01, True), (0.02, True)])
    assert e.interval_s == pytest.approx(0.01) and e.samples == 2
    e.observe(0.5, False)  # the backlog emptied: the next gap (idle) is not a service interval
    e.observe(3.0, True)
    assert e.interval_s == pytest.approx(0.01) and e.samples == 2
    e.observe(3.0 + MAX_GAP_S + 0.5, True)  # too far apart: skipped
    assert e.samples == 2
    e.observe(3.0 + MAX_GAP_S + 0.52, True)  # 20 ms: moves the mean towards it
    assert 0.01 < e.interval_s < 0.02  # type: ignore[operator]


def test_observe_returns_the_gap_it_counted() -> None:
    # what the live gateway exports as gshare_admission_gap_seconds: exactly the samples
    e = ServiceEstimate()
    got = [e.observe(t, b) for t, b in [(0.0, True), (0.004, True), (0.5, False), (0.6, True)]]
    assert got[0] is None and got[1] == pytest.approx(0.004) and got[2:] == [None, None]
    assert e.observe(0.6 + MAX_GAP_S + 0.1, True) is None and e.samples == 1  # too far apart


def test_the_first_intervals_weigh_the_same() -> None:
    # one slow first interval (a cold instance's, a pause) does not stand for the rate
    e = estimate_from([(0.0, True), (0.015, True), (0.017, True), (0.019, True), (0.021, True)])
    assert e.interval_s == pytest.approx((0.015 + 3 * 0.002) / 4)
    # after 1 / EWMA_ALPHA samples the newest one weighs EWMA_ALPHA
    e = estimate_from([(i * 0.002, True) for i in range(int(1 / EWMA_ALPHA) + 1)])
    before = e.interval_s
    assert before == pytest.approx(0.002)
    e.observe(int(1 / EWMA_ALPHA) * 0.002 + 0.012, True)
    assert e.interval_s == pytest.approx((1 - EWMA_ALPHA) * 0.002 + EWMA_ALPHA * 0.012)


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
        (1, 0.030, 20.0, 1.0, Admit.ACCEPT),  # one ahead: always (the estimate needs it)
        (2, 0.030, 20.0, 1.0, Admit.SHED),  # 90 ms > 20 ms
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


def _serve(
    estimate: ServiceEstimate,
    rng: np.random.Generator,
    *,
    start_s: float,
    end_s: float,
    rate_rps: float,
    servers: int,
    service_s: Callable[[], float],
    slo_ms: float,
) -> tuple[int, int]:
    """Poisson arrivals from ``start_s`` to ``end_s`` at FIFO ``servers``, admitted by ``admit``
    on ``estimate``, which is fed every departure as the gateways feed it; (accepted, shed)."""
    t = start_s
    queue: list[float] = []  # admitted, waiting
    busy: list[float] = []  # departure times of the requests in service
    accepted = shed = 0
    while True:
        t_next = t + float(rng.exponential(1.0 / rate_rps))
        while busy and min(busy) <= min(t_next, end_s):  # departures before the next arrival
            done = min(busy)
            busy.remove(done)
            if queue:
                queue.pop(0)
                busy.append(done + service_s())
            estimate.observe(done, bool(queue) or bool(busy))
        if t_next > end_s:
            return accepted, shed
        t = t_next
        if admit(len(queue) + len(busy), estimate, slo_ms).verdict is Admit.SHED:
            shed += 1
            continue
        accepted += 1
        if len(busy) < servers:
            busy.append(t + service_s())
        else:
            queue.append(t)


def test_a_function_that_became_faster_is_not_held_to_one_request() -> None:
    """An interval measured on one instance (80 ms: two requests' 160 ms are over the budget of
    0.75 x 200 ms) must not hold the function to one request at a time after it has four:
    shedding at one outstanding would stop the measurement for good (it shed 60 % here)."""
    rng = np.random.default_rng(3)
    e = ServiceEstimate()
    load = dict(rate_rps=20.0, slo_ms=200.0, service_s=lambda: 0.080)
    _serve(e, rng, start_s=0.0, end_s=20.0, servers=1, **load)  # type: ignore[arg-type]
    assert e.interval_s == pytest.approx(0.080, rel=0.1)
    _serve(e, rng, start_s=20.0, end_s=40.0, servers=4, **load)  # type: ignore[arg-type]
    accepted, shed = _serve(e, rng, start_s=40.0, end_s=60.0, servers=4, **load)  # type: ignore[arg-type]
    assert e.interval_s < 0.6 * 0.080  # type: ignore[operator]
    assert shed < 0.1 * (accepted + shed)
