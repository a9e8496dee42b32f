"""The simulated gateway's admission control is the live gateway's (``policy.admission``):
with it, a burst over capacity is shed at once instead of queued, every arrival is still
accounted for (a shed request is an answered miss), and the admitted requests stay near the
SLO; without it (the papers' experiments) nothing is shed."""

from __future__ import annotations

import numpy as np
import pytest

from gshare.policy.admission import DEFAULT_MAX_LATENCY_SLO_FACTOR, ServiceEstimate
from gshare.policy.autoscale import ScaleConfig
from gshare.profiles import ProfilePoint, ProfileTable
from gshare.sim.cluster import ClusterConfig, SimCluster, SimFunction
from gshare.sim.engine import EventLoop
from gshare.sim.workload import drive_open_loop

SERVICE_MS = 10.0
SLO_MS = 50.0
TABLE = ProfileTable(
    [ProfilePoint("m", 100.0, q, 1, SERVICE_MS * 100.0 / q) for q in (50.0, 100.0)]
)
CFG = ScaleConfig(sm_pct=100.0, quota_pct=100.0, batch=1, throughput_rps=100.0, latency_ms=10.0)


def _run(factor: float | None, start: dict[str, float] | None = None) -> SimCluster:
    loop = EventLoop()
    cfg = ClusterConfig(
        max_gpus=1, cold_start_ms=0.0, launch=None, token_wakeup_ms=0.0,
        admission_slo_factor=factor, admission_interval_ms=start,
    )  # fmt: skip
    cluster = SimCluster(loop, TABLE, cfg, np.random.default_rng(0))
    cluster.add_function(SimFunction("f", "m", SLO_MS, (CFG,), min_instances=1, max_instances=1))
    # a first burst (measures the service interval: nothing to predict with before it), then a
    # second one, both 40 requests at one instant: 400 ms of work for a 50 ms SLO
    drive_open_loop(loop, cluster.gateway, "f", [100.0] * 40 + [2_000.0] * 40)
    cluster.start(until_ms=3_000.0)
    loop.run(until_ms=3_000.0)
    loop.run()
    return cluster


def test_admission_sheds_what_would_miss_and_accounts_for_every_arrival() -> None:
    on, off = _run(DEFAULT_MAX_LATENCY_SLO_FACTOR), _run(None)
    for c in (on, off):
        assert len(c.log.completed) == c.log.submitted == 80
    assert off.gateway.shed == {} and not any(r.shed for r in off.log.completed)
    shed = [r for r in on.log.completed if r.shed]
    assert on.gateway.shed == {"f": len(shed)}
    # the first burst came before any service interval was measured: all queued
    assert all(r.arrival_ms == 2_000.0 for r in shed) and len(shed) > 0
    assert all(r.finish_ms == r.arrival_ms and not r.slo_met for r in shed)
    second_on = [r for r in on.log.completed if r.arrival_ms == 2_000.0 and not r.shed]
    second_off = [r for r in off.log.completed if r.arrival_ms == 2_000.0]
    # admitted: predicted within factor x SLO (Little's law on the measured interval)
    assert max(r.latency_ms for r in second_on) <= SLO_MS
    assert max(r.latency_ms for r in second_off) > 3 * SLO_MS
    assert len(second_on) < len(second_off)


def test_a_starting_estimate_sheds_the_first_burst_as_a_warm_gateway_would() -> None:
    """A server that served before keeps its estimate: given one, the first burst is judged on
    it (shed beyond the factor x SLO) instead of queued whole; the rest is as before."""
    cold = _run(DEFAULT_MAX_LATENCY_SLO_FACTOR)
    warm = _run(DEFAULT_MAX_LATENCY_SLO_FACTOR, {"f": SERVICE_MS})
    assert len(warm.log.completed) == warm.log.submitted == 80
    first_cold = [r for r in cold.log.completed if r.arrival_ms == 100.0]
    first_warm = [r for r in warm.log.completed if r.arrival_ms == 100.0]
    assert not any(r.shed for r in first_cold)
    admitted = [r for r in first_warm if not r.shed]
    # (outstanding + 1) x 10 ms <= 0.75 x 50 ms: the first three (two outstanding always pass)
    assert len(admitted) == max(2, int(DEFAULT_MAX_LATENCY_SLO_FACTOR * SLO_MS / SERVICE_MS))
    assert max(r.latency_ms for r in admitted) <= SLO_MS
    # a function without a starting estimate is unmeasured as before
    other = _run(DEFAULT_MAX_LATENCY_SLO_FACTOR, {"g": SERVICE_MS})
    assert not any(r.shed for r in other.log.completed if r.arrival_ms == 100.0)


def test_the_gateway_records_the_gaps_its_estimate_counted() -> None:
    """What the live gateway exports (``gshare_admission_gap_seconds``, the interval gauge):
    the gaps replayed through a fresh estimate give the gateway's estimate; one instance at
    10 ms a request answers a backlog 10 ms apart."""
    c = _run(DEFAULT_MAX_LATENCY_SLO_FACTOR)
    gaps = c.gateway.admission_gaps_ms["f"]
    assert gaps and float(np.median(gaps)) == pytest.approx(SERVICE_MS, rel=0.05)
    e, t = ServiceEstimate(), 0.0
    e.observe(t, True)
    for g in gaps:
        t += g / 1000.0
        e.observe(t, True)
    assert e.samples == len(gaps)
    assert c.gateway.admission_interval_ms("f") == pytest.approx(e.interval_s * 1000.0)  # type: ignore[operator]
    assert c.gateway.admission_interval_ms("nobody") is None
    assert _run(None).gateway.admission_gaps_ms == {}  # without admission nothing is counted


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_starting_estimate_must_be_a_positive_interval(bad: float) -> None:
    with pytest.raises(ValueError, match="admission_interval_ms of 'f' must be > 0"):
        _run(DEFAULT_MAX_LATENCY_SLO_FACTOR, {"f": bad})
