"""policy.prewarm: EWMA of call intervals, pool targets (Little's law), when to pre-warm,
keep-alive."""

from __future__ import annotations

import pytest

from gshare.policy.prewarm import (
    IntervalEwma,
    PoolView,
    Prewarm,
    PrewarmError,
    PrewarmParams,
    ewma,
    keep_alive_deadline_ms,
    observe_call,
    plan_prewarm,
    predicted_interval_ms,
    predicted_next_call_ms,
    target_containers,
)


@pytest.mark.parametrize(
    ("old", "sample", "alpha", "want"),
    [
        (None, 40.0, 0.2, 40.0),  # first sample taken as is
        (100.0, 50.0, 0.2, 90.0),  # 0.2 * 50 + 0.8 * 100 = 10 + 80
        (100.0, 200.0, 0.5, 150.0),  # 0.5 * 200 + 0.5 * 100
        (100.0, 0.0, 1.0, 0.0),  # alpha 1: only the newest sample
    ],
)
def test_ewma_step(old: float | None, sample: float, alpha: float, want: float) -> None:
    assert ewma(old, sample, alpha) == pytest.approx(want)


def test_observe_call_sequence() -> None:
    e = IntervalEwma()
    e = observe_call(e, 1000.0, 0.5)  # first call: no interval yet
    assert (e.mean_interval_ms, e.last_ms, e.count) == (None, 1000.0, 1)
    e = observe_call(e, 1100.0, 0.5)  # interval 100 taken as is
    assert (e.mean_interval_ms, e.last_ms, e.count) == (100.0, 1100.0, 2)
    e = observe_call(e, 1400.0, 0.5)  # interval 300: 0.5 * 300 + 0.5 * 100 = 200
    assert (e.mean_interval_ms, e.last_ms, e.count) == (200.0, 1400.0, 3)


def test_observe_call_rejects_time_going_back() -> None:
    with pytest.raises(PrewarmError, match="before the previous"):
        observe_call(IntervalEwma(100.0, 500.0, 3), 400.0)


@pytest.mark.parametrize(
    ("est", "now", "interval", "nxt"),
    [
        (IntervalEwma(), 0.0, None, None),  # no history
        (IntervalEwma(None, 10.0, 1), 50.0, None, None),  # one call: no interval
        (IntervalEwma(100.0, 1000.0, 5), 1050.0, 100.0, 1100.0),  # within the interval
        # quiet for 400 ms > the EWMA of 100: the interval stretches to 400, next call "now"
        (IntervalEwma(100.0, 1000.0, 5), 1400.0, 400.0, 1400.0),
    ],
)
def test_prediction(
    est: IntervalEwma, now: float, interval: float | None, nxt: float | None
) -> None:
    assert predicted_interval_ms(est, now) == interval
    assert predicted_next_call_ms(est, now) == nxt


def pool(
    *,
    idle: int = 0,
    busy: int = 0,
    starting: int = 0,
    interval: float | None = 100.0,
    last: float = 1000.0,
    hold: float | None = 250.0,
    cold: float = 5000.0,
) -> PoolView:
    calls = IntervalEwma(interval, last, 5) if interval is not None else IntervalEwma(None, last, 1)
    return PoolView("deblur", 3, idle, busy, starting, cold, calls, hold)


P = PrewarmParams(headroom=1.5, spare=1, max_per_pool=7, period_ms=1000.0)


@pytest.mark.parametrize(
    ("view", "now", "target"),
    [
        # 250 ms held per call, a call every 100 ms: 2.5 busy; ceil(2.5 * 1.5 = 3.75) + 1 = 5
        (pool(), 1000.0, 5),
        # a call every 250 ms: 1 busy; ceil(1.5) + 1 = 3
        (pool(interval=250.0), 1000.0, 3),
        # a call every 20 ms: 12.5 busy -> 18.75 -> 19 + 1 = 20, capped at 7
        (pool(interval=20.0), 1000.0, 7),
        # quiet for 1000 ms: interval 1000, 0.25 busy; ceil(0.375) + 1 = 2
        (pool(), 2000.0, 2),
        # not called for more than the keep-alive (600 s): nothing
        (pool(), 1000.0 + 600_001.0, 0),
        # no interval yet, or no hold time yet: nothing to predict from
        (pool(interval=None), 1000.0, 0),
        (pool(hold=None), 1000.0, 0),
    ],
)
def test_target_containers(view: PoolView, now: float, target: int) -> None:
    assert target_containers(view, now, P) == target


def test_plan_prewarm_starts_the_deficit() -> None:
    # target 5 (see above); the pool has 1 idle + 2 busy + 1 starting = 4 -> start 1
    views = [pool(idle=1, busy=2, starting=1)]
    assert plan_prewarm(views, 1000.0, P) == (Prewarm("deblur", 3, 1, 5),)


def test_plan_prewarm_skips_full_pools_and_keeps_order() -> None:
    full = pool(idle=3, busy=2)  # 5 = target
    short = PoolView("segmentation", 0, 0, 0, 0, 5000.0, IntervalEwma(250.0, 1000.0, 5), 250.0)
    short2 = PoolView("classification", 9, 1, 0, 0, 5000.0, IntervalEwma(100.0, 1000.0, 5), 250.0)
    # segmentation: target 3 (interval 250), has 0 -> 3; classification: target 5, has 1 -> 4
    assert plan_prewarm([short, full, short2], 1000.0, P) == (
        Prewarm("segmentation", 0, 3, 3),
        Prewarm("classification", 9, 4, 5),
    )


def test_plan_prewarm_waits_when_the_next_call_is_far() -> None:
    # a call every 60 s; last at 0; now 1 s: next predicted at 60 s. A container started at the
    # next tick (2 s) is ready at 2 s + 5 s cold start = 7 s < 60 s: not yet.
    sparse = pool(interval=60_000.0, last=0.0, hold=500.0, cold=5000.0)
    assert target_containers(sparse, 1000.0, P) == 2  # ceil(500/60000 * 1.5) + 1
    assert plan_prewarm([sparse], 1000.0, P) == ()
    # at 55 s: 55 s + 5 s + 1 s = 61 s >= 60 s -> start both now
    assert plan_prewarm([sparse], 55_000.0, P) == (Prewarm("deblur", 3, 2, 2),)


@pytest.mark.parametrize(
    ("since", "keep", "deadline"),
    [(0.0, 600_000.0, 600_000.0), (1234.5, 600_000.0, 601_234.5), (10.0, 0.0, 10.0)],
)
def test_keep_alive_deadline(since: float, keep: float, deadline: float) -> None:
    assert keep_alive_deadline_ms(since, keep) == deadline


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1.5}, "alpha"),
        ({"headroom": 0.5}, "headroom"),
        ({"spare": -1}, "spare"),
        ({"max_per_pool": 0}, "max_per_pool"),
        ({"period_ms": 0.0}, "period_ms"),
        ({"keep_alive_ms": -1.0}, "keep_alive_ms"),
    ],
)
def test_params_are_checked(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(PrewarmError, match=field):
        PrewarmParams(**kwargs)  # type: ignore[arg-type]
