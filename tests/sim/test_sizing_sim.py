"""sim.sizing: the Azure 2019 apps and their draws, what each memory policy reserves, and the
memory-bounded capacity model."""

from __future__ import annotations

import numpy as np
import pytest

from gshare.policy.sizing import Sizing
from gshare.sim.sizing import (
    AppTrace,
    PolicyKind,
    PolicySpec,
    Reservation,
    StreamItem,
    draw_invocations,
    evaluate,
    load_apps,
    reservation,
    simulate,
    sustained_rate,
)
from gshare.sim.sizing.apps import DUR_QUANTILES, MEM_QUANTILES, MINUTES


def app(mem: list[float], dur_ms: list[float] | None = None, per_minute: int = 2) -> AppTrace:
    return AppTrace(
        "test",
        np.array(mem, dtype=np.float64),
        np.array(dur_ms or [1000.0] * 7, dtype=np.float64),
        np.full(MINUTES, per_minute, dtype=np.int64),
    )


def sizing(init: float, step: float) -> Sizing:
    return Sizing(init, step, 0.0, 0.0, 0.0, 0, 1, init)


# -- the apps ------------------------------------------------------------------------------------


def test_the_three_files_join_into_990_apps() -> None:
    apps = load_apps()
    assert len(apps) == 990 and len({a.app for a in apps}) == 990
    for a in apps:
        assert a.mem_mb.shape == MEM_QUANTILES.shape and np.all(np.diff(a.mem_mb) >= 0)
        assert a.dur_ms.shape == DUR_QUANTILES.shape and np.all(np.diff(a.dur_ms) >= 0)
        assert a.per_minute.shape == (MINUTES,) and a.invocations >= 1
        assert a.mem_mb[0] > 0 and a.dur_ms[0] > 0


def test_demands_follow_the_percentiles() -> None:
    a = app([100, 110, 120, 130, 140, 150, 160, 400])
    # at each given quantile the inverse CDF returns that percentile
    assert np.array_equal(a.demand_mb(MEM_QUANTILES), a.mem_mb)
    # halfway between p99 (0.99 → 160) and p100 (1.0 → 400): 280
    assert a.demand_mb(np.array([0.995]))[0] == pytest.approx(280.0)
    # below the first percentile: p1
    assert a.demand_mb(np.array([0.0, 0.005]))[0] == 100.0
    draws = a.demand_mb(np.random.default_rng(0).uniform(0, 1, 200_000))
    assert draws.min() >= 100 and draws.max() <= 400
    # exactly 1 % of the mass lies above p99 (sampling error of 200k draws ~ 0.02 %)
    assert np.mean(draws > 160) == pytest.approx(0.01, abs=0.001)


def test_start_times_keep_the_day_profile() -> None:
    per_minute = np.zeros(MINUTES, dtype=np.int64)
    per_minute[10] = 300  # 300 in minute 10, 100 in minute 20
    per_minute[20] = 100
    a = AppTrace("t", np.full(8, 100.0), np.full(7, 10.0), per_minute)
    rng = np.random.default_rng(1)
    every = a.start_times_s(10_000, rng)
    assert every.shape == (400,) and np.all(np.diff(every) >= 0)
    assert np.sum((every >= 600) & (every < 660)) == 300
    capped = a.start_times_s(40, rng)  # 40 evenly spaced of 400 → 30 and 10
    assert capped.shape == (40,) and np.sum(capped < 660) == 30


# -- one invocation under each policy ------------------------------------------------------------

APP = app([100, 110, 120, 130, 140, 150, 160, 400])  # p99 160, max 400


@pytest.mark.parametrize(
    ("kind", "demand", "size", "want"),
    [
        # fixed at max: 400 MB x 2 s = 800 MB·s, whatever the demand
        (PolicyKind.FIXED_MAX, 150.0, None, Reservation(800.0, 400, 400, 0, False)),
        # p99 covers 150: 160 x 2 = 320
        (PolicyKind.FIXED_P99, 150.0, None, Reservation(320.0, 160, 160, 0, False)),
        # p99 killed at half its run, retried at max: (160 x 0.5 + 400) x 2 = 960
        (PolicyKind.FIXED_P99, 300.0, None, Reservation(960.0, 160, 160, 0, True, 400)),
        # BulkX init 120 covers 110: 120 x 2 = 240
        (PolicyKind.BULKX, 110.0, sizing(120, 50), Reservation(240.0, 120, 120, 0, False)),
        # 220 over init 120: k = ceil(100/50) = 2 → 220, held for the run: 440
        (PolicyKind.BULKX, 220.0, sizing(120, 50), Reservation(440.0, 120, 220, 2, False)),
        # 390: k = ceil(270/50) = 6 → 420 > max 400, capped: 400 x 2 = 800, 6 steps
        (PolicyKind.BULKX, 390.0, sizing(120, 50), Reservation(800.0, 120, 400, 6, False)),
        # an init above the app's max is clamped to it
        (PolicyKind.BULKX, 390.0, sizing(500, 50), Reservation(800.0, 400, 400, 0, False)),
    ],
)
def test_reservation_table(
    kind: PolicyKind, demand: float, size: Sizing | None, want: Reservation
) -> None:
    assert reservation(demand, 2.0, kind, APP, size, kill_fraction=0.5) == want


def test_bulkx_never_kills_and_windows_re_solve() -> None:
    a = app([100, 150, 200, 250, 300, 350, 380, 400], per_minute=3)
    inv = draw_invocations(a, 600, 0.2, np.random.default_rng(2))
    assert inv is not None and inv.n == 600 and inv.n_train == 120
    assert inv.weight == pytest.approx(3 * MINUTES / 600)
    kw = {"kill_fraction": 0.5, "window_s": 3600.0, "history_cap": 2000}
    once = evaluate(inv, PolicySpec("b", PolicyKind.BULKX), **kw)
    windows = evaluate(inv, PolicySpec("w", PolicyKind.BULKX_WINDOW), **kw)
    fixed = evaluate(inv, PolicySpec("m", PolicyKind.FIXED_MAX), **kw)
    p99 = evaluate(inv, PolicySpec("p", PolicyKind.FIXED_P99), **kw)
    for o in (once, windows, fixed, p99):
        assert o.invocations == 480  # the training prefix is never scored
        assert o.used_mbs == pytest.approx(fixed.used_mbs)
    assert once.kills == windows.kills == fixed.kills == 0
    assert once.solves == 1
    # the day's invocations start in 20 % of it; one solve per later hour that has invocations
    hours = len({int(t // 3600) for t in inv.start_s[inv.n_train :]})
    assert windows.solves == hours and len(windows.inits_mb) == hours
    # BulkX never reserves more than the maximum: its waste is at most fixed-max's
    assert once.reserved_mbs <= fixed.reserved_mbs
    assert once.steps > 0 and once.grown > 0


# -- the capacity model --------------------------------------------------------------------------


def test_cluster_moves_a_growth_that_does_not_fit_and_rejects_what_fits_nowhere() -> None:
    # two 100-MB nodes. t=0: 60 MB for 10 s → node 0 (free 40). t=1: BulkX init 30 → node 0
    # (free 10), growing to 70 needs +40 there: refused → moved whole to node 1 (free 30).
    # t=2: 50 MB fits neither node (40, 30 free): rejected.
    stream = [
        StreamItem(0, 60, 10.0, 0.0),
        StreamItem(0, 70, 10.0, 1.0),
        StreamItem(0, 50, 1.0, 2.0),
    ]
    plans = [
        Reservation(600.0, 60, 60, 0, False),
        Reservation(700.0, 30, 70, 1, False),
        Reservation(50.0, 50, 50, 0, False),
    ]
    r = simulate(
        plans,
        stream,
        servers=2,
        server_mb=100,
        rate_per_s=1.0,
        kill_fraction=0.5,
        warmup_fraction=0.0,
    )
    assert (r.arrivals, r.rejected, r.moves) == (3, 1, 1)
    # a p99 kill frees its reservation half-way and retries at the maximum: the retry of
    # 100 MB at t=0.5 fits only after the 60-MB invocation ended
    killed = [Reservation(0.0, 40, 40, 0, True, 100), Reservation(600.0, 60, 60, 0, False)]
    items = [StreamItem(0, 90, 1.0, 0.0), StreamItem(0, 60, 10.0, 0.0)]
    r = simulate(
        killed,
        items,
        servers=1,
        server_mb=100,
        rate_per_s=1.0,
        kill_fraction=0.5,
        warmup_fraction=0.0,
    )
    assert r.rejected == 1  # the retry found 40 MB free


def test_sustained_rate_meets_the_target_and_smaller_reservations_sustain_more() -> None:
    rng = np.random.default_rng(4)
    n = 1500
    times = np.cumsum(rng.exponential(1.0, n))
    stream = [
        StreamItem(0, 100.0, float(d), float(t))
        for d, t in zip(rng.uniform(1, 3, n), times, strict=True)
    ]
    big = [Reservation(200.0 * s.exec_s, 200, 200, 0, False) for s in stream]
    small = [Reservation(120.0 * s.exec_s, 120, 120, 0, False) for s in stream]
    kw = {
        "servers": 2,
        "server_mb": 2000.0,
        "kill_fraction": 0.5,
        "warmup_fraction": 0.2,
        "max_reject": 0.01,
        "iterations": 6,
    }
    a = sustained_rate(big, stream, **kw)
    b = sustained_rate(small, stream, **kw)
    for c in (a, b):
        assert c.at_sustained.reject_share <= 0.01 and c.sustained_rate_per_s > 0
    # fluid bound: 4,000 MB / (200 MB x 2 s mean) ≈ 10/s; 120 MB: ≈ 16.7/s
    assert a.fluid_rate_per_s == pytest.approx(4000 / np.mean([p.reserved_mbs for p in big]))
    assert b.sustained_rate_per_s > a.sustained_rate_per_s
