"""Scoring a simulated figure against live runs (``experiments.fidelity``) and the seeds'
intervals of ``gshare simulate --seeds``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gshare.cli import main
from gshare.experiments.fidelity import (
    BOUNDS,
    busy_factors_by_gap,
    fifo_waits_ms,
    fit_serial_ms,
    idle_arrival_queue_ms,
    interval,
    outstanding_share,
    score,
    token_release_ms,
    within_all,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "mlp-chain.yaml"


def test_interval_is_the_median_and_the_5th_to_95th_percentiles() -> None:
    iv = interval([float(x) for x in range(101)])  # 0..100: percentiles are the values
    assert iv == {"median": 50.0, "p05": 5.0, "p95": 95.0}
    one = interval([3.0])
    assert one["p05"] == one["median"] == one["p95"] == 3.0


def test_a_figure_within_its_relative_bound_when_the_live_runs_agree() -> None:
    live = [10.0, 10.2]  # spread 2 %: below p50's 15 %, so the bound decides
    s = score("p50_ms", [11.0, 9.0, 12.0], live)
    assert s["basis"] == "bound" and s["live"] == pytest.approx(10.1)
    assert s["error"] == pytest.approx(11.0 / 10.1 - 1)  # the scenario's seed: the first
    assert s["within"] is True
    far = score("p50_ms", [13.0, 9.0, 12.0], live)  # 29 % over
    assert far["basis"] == "bound" and far["within"] is False


def test_percentage_figures_are_scored_in_points() -> None:
    assert BOUNDS["slo_hit_rate_pct"].kind == "pp"
    s = score("slo_hit_rate_pct", [94.0], [99.0, 99.0])
    assert s["error"] == pytest.approx(-5.0) and s["within"] is True
    assert score("share_pct:a", [27.0], [30.0, 30.5])["within"] is False  # 3.25 pp > 2 pp


def test_a_noisy_live_figure_outside_its_bound_is_judged_on_the_simulated_interval() -> None:
    live = [20.0, 40.0]  # spread 67 % of the mean: larger than p99's 30 % bound
    inside = score("p99_ms", [18.0, 25.0, 35.0, 45.0], live)  # 18 vs 30: -40 %
    assert inside["basis"] == "interval" and inside["live_spread"] == pytest.approx(20 / 30)
    assert inside["sim_p05"] <= 30.0 <= inside["sim_p95"] and inside["within"] is True
    outside = score("p99_ms", [10.0, 11.0, 12.0], live)
    assert outside["basis"] == "interval" and outside["within"] is False
    # within the bound, a noisy figure needs no interval
    near = score("p99_ms", [33.0, 33.0], live)
    assert near["basis"] == "bound" and near["within"] is True


def test_the_interval_is_no_excuse_where_the_live_runs_agree() -> None:
    s = score("p50_ms", [5.0, 9.0, 12.0], [10.0, 10.1])  # live inside the interval, but -50 %
    assert s["sim_p05"] <= s["live"] <= s["sim_p95"]
    assert s["basis"] == "bound" and s["within"] is False


def test_a_given_point_is_scored_while_every_seed_makes_the_interval() -> None:
    # two calibrations, one per live run: their figures at the scenario's seed average 10.5
    pooled = [9.0, 12.0, 9.5, 11.5, 8.0, 13.0]
    s = score("p50_ms", pooled, [10.4, 10.6], sim_point=10.5)
    assert s["sim"] == 10.5 and s["error"] == pytest.approx(0.0) and s["within"] is True
    assert (s["sim_p05"], s["sim_p95"]) == (interval(pooled)["p05"], interval(pooled)["p95"])
    # without it the first seed is the point, and the same runs miss
    assert score("p50_ms", pooled, [10.4, 10.6])["error"] == pytest.approx(9.0 / 10.5 - 1)
    assert score("p50_ms", [12.5], [10.0, 10.0], sim_point=float("nan"))["sim"] == 12.5


def test_missing_figures_are_not_within() -> None:
    s = score("p99_ms", [float("nan")], [5.0])
    assert s["within"] is None
    assert within_all([s]) is False and within_all([]) is False
    assert within_all([score("p50_ms", [1.0], [1.0])]) is True


def test_gshare_simulate_seeds_reports_median_and_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["simulate", str(EXAMPLE), "--quick", "--seeds", "3", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "p05" in out and "p95" in out
    folder = tmp_path / "mlp-chain-simulate"
    doc = json.loads((folder / "results.json").read_text())
    assert doc["seeds"] == [1, 2, 3]  # the scenario's seed first
    p99 = doc["summary"]["workflows"]["mlp-chain"]["p99_ms"]
    assert len(p99["values"]) == 3
    assert p99["min"] <= p99["p05"] <= p99["median"] <= p99["p95"] <= p99["max"]
    for s in (1, 2, 3):
        one = json.loads((folder / f"seed-{s}" / "results.json").read_text())
        assert one["summary"]["seed"] == s


def test_simulate_draws_measured_platform_latency_per_plain_request() -> None:
    from gshare.experiments.scenario_sim import simulate
    from gshare.scenario import load_scenario

    sc = load_scenario(EXAMPLE.parent / "priority-pair.yaml")
    base = simulate(sc, duration_s=2.0)
    plus = simulate(sc, duration_s=2.0, platform_ms=(5.0,))
    a = {(r["name"], r["arrival_ms"]): r for r in base.rows}
    b = {(r["name"], r["arrival_ms"]): r for r in plus.rows}
    assert a.keys() == b.keys() and a
    # the same decisions (admission and instances read the answers' times, not the client's):
    # every request 5 ms later at its client, none shed differently
    for k, r in a.items():
        assert b[k]["status"] == r["status"]
        assert b[k]["latency_ms"] - r["latency_ms"] == pytest.approx(5.0)


def test_fifo_waits_follow_lindleys_recursion() -> None:
    assert fifo_waits_ms([], 1.0) == []
    assert fifo_waits_ms([0.0, 0.0, 0.0], 2.0) == [0.0, 2.0, 4.0]  # a burst queues
    assert fifo_waits_ms([0.0, 5.0], 2.0) == [0.0, 0.0]  # far apart: no wait
    assert fifo_waits_ms([0.0, 1.0, 1.5], 2.0) == [0.0, 1.0, 2.5]  # a backlog carries over
    assert fifo_waits_ms([0.0, 0.0], 0.0) == [0.0, 0.0]


@given(
    st.lists(st.floats(0.0, 1e4, allow_nan=False), max_size=40),
    st.floats(0.0, 10.0, allow_nan=False),
)
def test_fifo_waits_keep_the_stage_work_conserving(arrivals: list[float], s: float) -> None:
    ts = sorted(arrivals)
    waits = fifo_waits_ms(ts, s)
    starts = [t + w for t, w in zip(ts, waits, strict=True)]
    assert all(w >= 0.0 for w in waits)
    # one request at a time, in order, and never idle while one waits
    for i in range(1, len(ts)):
        assert starts[i] >= starts[i - 1] + s - 1e-6
        if waits[i] > 1e-9:
            assert starts[i] == pytest.approx(starts[i - 1] + s)


def test_the_serial_stage_is_fitted_from_the_bursts_means() -> None:
    # bursts of a FIFO stage with s = 1.3 ms above a 2.5-ms base: the mean is a + s (k - 1) / 2
    bursts = [(k, 2.5 + 1.3 * (k - 1) / 2 + e) for k in (1, 2, 4, 8) for e in (-0.2, 0.2)]
    assert fit_serial_ms(bursts) == pytest.approx(1.3)
    # no growth with the burst: no serial stage (and never a negative one)
    assert fit_serial_ms([(1, 3.0), (8, 3.0)]) == 0.0
    assert fit_serial_ms([(1, 3.0), (8, 2.0)]) == 0.0
    with pytest.raises(ValueError, match="two sizes"):
        fit_serial_ms([(4, 3.0), (4, 5.0)])


def test_busy_factors_class_each_request_by_the_gap_before_it() -> None:
    # arrivals 0, 0.5, 1.0 (gaps inf, 0.5, 0.5), then 50 (gap 49), then 50.2 (gap 0.2)
    arrivals = [0.0, 0.5, 1.0, 50.0, 50.2]
    busy = [4.0, 1.0, 1.0, 3.0, 1.0]  # mean 2.0
    bounds = (1.0, 10.0, 100.0, math.inf)
    rows = busy_factors_by_gap(arrivals, busy, bounds_ms=bounds, min_requests=1)
    assert [b for b, _ in rows] == [1.0, 10.0, 100.0, math.inf]
    factors = dict(rows)
    assert factors[1.0] == pytest.approx(0.5)  # three requests under 1 ms after the previous
    assert factors[100.0] == pytest.approx(1.5)  # the one after 49 ms
    assert factors[math.inf] == pytest.approx(2.0)  # the first (no previous request)
    assert factors[10.0] == factors[1.0]  # no request: the class below it
    # the answers may come in any order: only the arrivals order them
    assert busy_factors_by_gap(arrivals[::-1], busy[::-1], bounds, min_requests=1) == rows


def test_busy_factors_pool_a_class_of_few_requests_with_the_class_below() -> None:
    # 30 requests 0.5 ms apart (busy 1), then 30 requests 50 ms apart (busy 2), then 3 after a
    # second each (busy 5): the three alone would make the top class's factor from 3 requests
    arrivals = [0.5 * i for i in range(30)]
    arrivals += [100.0 + 50.0 * i for i in range(30)]
    arrivals += [5000.0 + 1000.0 * i for i in range(3)]
    busy = [1.0] * 30 + [2.0] * 30 + [5.0] * 3
    bounds = (1.0, 100.0, math.inf)
    mean = sum(busy) / len(busy)
    alone = dict(busy_factors_by_gap(arrivals, busy, bounds, min_requests=1))
    # the top class: the three and the very first request (no previous one: gap inf)
    assert alone[math.inf] == pytest.approx((1.0 + 5.0 * 3) / 4 / mean)
    pooled = dict(busy_factors_by_gap(arrivals, busy, bounds, min_requests=20))
    # those 4 join the 30 below them
    top = (2.0 * 30 + 1.0 + 5.0 * 3) / 34
    assert pooled[100.0] == pooled[math.inf] == pytest.approx(top / mean)
    assert pooled[1.0] == pytest.approx(alone[1.0])
    # a lowest class of few requests joins the class above it; fewer than the minimum in all:
    # one class, factor 1
    low = dict(busy_factors_by_gap(arrivals[29:], busy[29:], bounds, min_requests=20))
    assert low[1.0] == low[100.0]
    assert set(dict(busy_factors_by_gap(arrivals, busy, bounds, 100)).values()) == {1.0}
    with pytest.raises(ValueError, match="min_requests"):
        busy_factors_by_gap(arrivals, busy, bounds, min_requests=0)


@given(st.lists(st.tuples(st.floats(0.0, 1e4), st.floats(0.01, 10.0)), min_size=1, max_size=60))
def test_busy_factors_weighted_by_their_requests_average_one(
    pairs: list[tuple[float, float]],
) -> None:
    arrivals, busy = [a for a, _ in pairs], [b for _, b in pairs]
    rows = busy_factors_by_gap(arrivals, busy)
    # reclass the requests as the fit does: their factors, weighted, give back the mean
    order = sorted(zip(arrivals, busy, strict=True))
    total, previous = 0.0, None
    for at, _ in order:
        gap = math.inf if previous is None else at - previous
        previous = at
        total += next(f for bound, f in rows if gap <= bound)
    assert total / len(order) == pytest.approx(1.0)


def test_busy_factors_refuse_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="arrivals"):
        busy_factors_by_gap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="ascending"):
        busy_factors_by_gap([1.0], [1.0], bounds_ms=(10.0, 1.0))
    assert busy_factors_by_gap([], []) == ()


def test_the_outstanding_share_is_the_platform_latency_inside_the_gateways_window() -> None:
    # client 12 ms, of which 4 ms platform; the gateway saw 9 ms: 3 of the 4 ms were outside it
    assert outstanding_share(12.0, 9.0, 4.0) == pytest.approx(0.25)
    assert outstanding_share(12.0, 12.0, 4.0) == 1.0  # all of it inside
    assert outstanding_share(12.0, 13.0, 4.0) == 1.0  # the means disagree: clipped
    assert outstanding_share(12.0, 6.0, 4.0) == 0.0
    assert outstanding_share(5.0, 5.0, 0.0) == 0.0  # no platform share
    with pytest.raises(ValueError, match="gateway_ms must be a finite number >= 0, got nan"):
        outstanding_share(12.0, math.nan, 4.0)


def _row(name: str, sent_ms: float, latency_ms: float, queue_ms: float, late_ms: float = 0.0):
    return {
        "name": name, "status": "ok", "arrival_ms": sent_ms - late_ms, "late_ms": late_ms,
        "latency_ms": latency_ms, "queue_ms": queue_ms,
    }  # fmt: skip


def test_idle_arrivals_are_the_requests_sent_after_every_earlier_answer() -> None:
    rows = [
        _row("f", 0.0, 10.0, 0.2),  # idle: the first
        _row("f", 5.0, 12.0, 4.0),  # sent while the first was out
        _row("f", 16.0, 3.0, 0.3),  # the second (5 + 12 = 17) was still out
        _row("f", 20.0, 5.0, 0.4, late_ms=1.0),  # idle: everything answered by 19
        _row("g", 21.0, 50.0, 0.1),  # another function: its own count
        _row("f", 30.0, 5.0, 0.5),  # idle: g's request does not count
        {**_row("f", 40.0, 1.0, 0.6), "status": "error"},  # not answered: not counted
        {**_row("f", 50.0, 1.0, 0.7), "queue_ms": None},  # no header: nothing
    ]
    assert idle_arrival_queue_ms(rows, "f") == [0.2, 0.4, 0.5]
    assert idle_arrival_queue_ms(rows, "g") == [0.1]
    assert idle_arrival_queue_ms(rows, "h") == []


def test_the_release_delay_is_the_idle_hold_per_token_beyond_the_grants_round_trip() -> None:
    # 100 tokens held 1,100 ms for 1,000 ms busy: 1 ms idle each, 0.3 of it the grant's
    assert token_release_ms(1100.0, 1000.0, 100, 0.3) == pytest.approx(0.7)
    assert token_release_ms(1010.0, 1000.0, 100, 0.3) == 0.0  # under the grant's: none
    assert token_release_ms(0.0, 0.0, 0, 0.3) == 0.0  # no token
    with pytest.raises(ValueError, match="held_ms"):
        token_release_ms(math.nan, 0.0, 1, 0.3)
