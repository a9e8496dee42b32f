"""policy.control: the reconcile step of one function, table-driven with an injected clock (in
the style of Knative's autoscaler tests). The autoscaler is the real FaST-GShare heuristic over
one config of 10 rps, so "R" maps to instances as ceil(R / 10)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gshare.policy import autoscale
from gshare.policy.control import (
    COLD_DEMAND_RPS,
    ControlError,
    ControlParams,
    ControlState,
    FunctionObservation,
    Warmth,
    cold_start_wanted,
    control_step,
    drain_finished,
    on_start_failed,
    on_started,
)
from gshare.policy.rate import RatePredictor

CFG = autoscale.ScaleConfig(
    sm_pct=50.0, quota_pct=50.0, batch=1, throughput_rps=10.0, latency_ms=100.0
)
SCALE = autoscale.get_autoscaler("fast-heuristic")


def obs(**kw: object) -> FunctionObservation:
    base = FunctionObservation(
        function="f",
        arrivals=None,
        interval_s=1.0,
        idle_since_s=None,
        outstanding=0,
        queued=0,
        running=(),
        configs=(CFG,),
        min_instances=0,
        max_instances=4,
        keep_alive_s=60.0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def running(n: int) -> tuple[autoscale.Instance, ...]:
    return tuple(autoscale.Instance(f"f-{i}", "f", CFG) for i in range(n))


def fresh() -> ControlState:
    return ControlState(RatePredictor.fresh(alpha=0.5, window=3, headroom=1.0))


@pytest.mark.parametrize(
    ("name", "o", "now_s", "want_warmth", "want_min", "want_add", "want_remove"),
    [
        # never invoked: no floor, nothing to do
        ("idle-never-invoked", obs(), 100.0, Warmth.NEVER_INVOKED, 0, 0, 0),
        # idle 30 s < keep-alive 60 s: one instance kept
        (
            "kept-alive",
            obs(idle_since_s=70.0, running=running(1)),
            100.0,
            Warmth.KEPT_ALIVE,
            1,
            0,
            0,
        ),
        # idle 60 s = keep-alive: deadline reached, scaled to zero
        (
            "expired-at-deadline",
            obs(idle_since_s=40.0, running=running(1)),
            100.0,
            Warmth.EXPIRED,
            0,
            0,
            1,
        ),
        # idle for ever, but min_instances 2 keeps two
        (
            "expired-min-2",
            obs(idle_since_s=0.0, running=running(2), min_instances=2),
            100.0,
            Warmth.EXPIRED,
            2,
            0,
            0,
        ),
        # requests in flight keep it warm however long ago the last arrival was
        (
            "busy",
            obs(idle_since_s=0.0, outstanding=3, running=running(1)),
            100.0,
            Warmth.BUSY,
            1,
            0,
            0,
        ),
        # queued with no instance: one starts (the floor and the cold-demand rate)
        (
            "cold-queued",
            obs(idle_since_s=99.0, outstanding=2, queued=2),
            100.0,
            Warmth.BUSY,
            1,
            1,
            0,
        ),
        # queued, no keep-alive rule: the floor still applies
        (
            "cold-no-keepalive",
            obs(keep_alive_s=None, idle_since_s=99.0, queued=1, outstanding=1),
            100.0,
            Warmth.NEVER_INVOKED,
            1,
            1,
            0,
        ),
        # max_instances 0 caps the floor
        (
            "capped",
            obs(idle_since_s=99.0, queued=1, outstanding=1, max_instances=0),
            100.0,
            Warmth.BUSY,
            0,
            0,
            0,
        ),
        # 25 arrivals in 1 s: ceil(25 / 10) = 3 instances
        (
            "tick-25rps",
            obs(arrivals=25, idle_since_s=100.0, outstanding=1),
            100.0,
            Warmth.BUSY,
            1,
            3,
            0,
        ),
    ],
)
def test_control_step_table(
    name: str,
    o: FunctionObservation,
    now_s: float,
    want_warmth: Warmth,
    want_min: int,
    want_add: int,
    want_remove: int,
) -> None:
    d, _ = control_step(o, fresh(), now_s, SCALE)
    assert (d.warmth, d.min_instances, len(d.add), len(d.remove)) == (
        want_warmth,
        want_min,
        want_add,
        want_remove,
    ), name


def test_expiry_forgets_the_rate_history() -> None:
    # 20 rps observed, then idle past the keep-alive: the prediction is 0 and the history gone,
    # so the next request starts from a cold estimate, not from 20 rps.
    s = fresh()
    d, s = control_step(obs(arrivals=20, idle_since_s=1.0), s, 1.0, SCALE)
    assert d.predicted_rps == pytest.approx(20.0)
    d, s = control_step(obs(arrivals=0, idle_since_s=1.0, running=running(2)), s, 62.0, SCALE)
    assert d.warmth is Warmth.EXPIRED and d.predicted_rps == 0.0 and len(d.remove) == 2
    assert s.predictor.ewma.samples == 0 and s.predictor.window.recent_rps == ()


def test_kept_alive_keeps_the_history() -> None:
    s = fresh()
    _, s = control_step(obs(arrivals=20, idle_since_s=1.0), s, 1.0, SCALE)
    d, s = control_step(obs(arrivals=0, idle_since_s=1.0, running=running(2)), s, 2.0, SCALE)
    # EWMA (20 + 0) / 2 = 10, window max 20: R = 20, two instances stay
    assert d.predicted_rps == pytest.approx(20.0) and d.remove == ()
    assert s.predictor.ewma.samples == 2


def test_queued_demand_gets_a_positive_rate() -> None:
    d, _ = control_step(obs(queued=1, outstanding=1, idle_since_s=5.0), fresh(), 5.0, SCALE)
    assert d.predicted_rps == COLD_DEMAND_RPS


def test_a_nudge_takes_no_rate_sample() -> None:
    s = fresh()
    _, s2 = control_step(
        obs(arrivals=None, queued=1, outstanding=1, idle_since_s=5.0), s, 5.0, SCALE
    )
    assert s2.predictor == s.predictor


@pytest.mark.parametrize(
    ("failures", "want_backoff_s"),
    [(1, 2.0), (2, 4.0), (3, 8.0), (6, 60.0), (10, 60.0)],  # 2 · 2^(k-1), at most 60
)
def test_backoff_doubles_up_to_the_cap(failures: int, want_backoff_s: float) -> None:
    s = fresh()
    for _ in range(failures):
        s = on_start_failed(s, 100.0, ControlParams(start_backoff_s=2.0, max_backoff_s=60.0))
    assert s.start_failures == failures
    assert s.backoff_until_s == pytest.approx(100.0 + want_backoff_s)


def test_backoff_holds_additions_not_removals() -> None:
    s = on_start_failed(fresh(), 10.0)  # back off until 12
    o = obs(queued=1, outstanding=1, idle_since_s=10.0)
    d, s = control_step(o, s, 11.0, SCALE)
    assert d.add == () and d.held_back == 1
    d, s = control_step(o, s, 12.0, SCALE)
    assert len(d.add) == 1 and d.held_back == 0
    # removals go through during a back-off
    s = on_start_failed(s, 61.0)
    d, _ = control_step(obs(idle_since_s=0.0, running=running(1)), s, 62.0, SCALE)
    assert d.remove == ("f-0",)


def test_started_resets_the_failure_count() -> None:
    s = on_start_failed(on_start_failed(fresh(), 0.0), 1.0)
    s = on_started(s)
    assert s.start_failures == 0
    assert on_start_failed(s, 50.0).backoff_until_s == pytest.approx(52.0)


@pytest.mark.parametrize(
    ("queued", "live", "want"), [(0, 0, False), (1, 0, True), (1, 1, False), (5, 2, False)]
)
def test_cold_start_wanted(queued: int, live: int, want: bool) -> None:
    assert cold_start_wanted(queued, live) is want


@pytest.mark.parametrize(
    ("in_flight", "since", "now", "want"),
    [(0, 0.0, 0.0, True), (2, 0.0, 119.0, False), (2, 0.0, 120.5, True)],
)
def test_drain_finished(in_flight: int, since: float, now: float, want: bool) -> None:
    assert drain_finished(in_flight, since, now, 120.0) is want


def test_bad_observations_name_the_field() -> None:
    with pytest.raises(ControlError, match="arrivals"):
        control_step(obs(arrivals=-1), fresh(), 0.0, SCALE)
    with pytest.raises(ControlError, match="keep_alive_s"):
        control_step(obs(keep_alive_s=-1.0), fresh(), 0.0, SCALE)
    with pytest.raises(ControlError, match="backoff"):
        ControlParams(start_backoff_s=10.0, max_backoff_s=1.0)
