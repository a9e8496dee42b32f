"""SimInstance batching and cold start; the gateway never loses a request; RequestLog metrics."""

from __future__ import annotations

import numpy as np
import pytest

from gshare.profiles import ProfilePoint, ProfileTable
from gshare.resources import GpuShare
from gshare.sim.engine import EventLoop
from gshare.sim.gateway import Gateway
from gshare.sim.gpu import SimGpu
from gshare.sim.instance import InstanceConfig, SimInstance
from gshare.sim.request import RequestLog, SimRequest
from gshare.sim.workload import drive_open_loop, poisson

# A tiny profile: model "m" takes 10 / 14 / 20 ms for a batch of 1 / 2 / 4 at any SM share.
LAT = {1: 10.0, 2: 14.0, 4: 20.0}
TABLE = ProfileTable(
    ProfilePoint("m", sm, 100.0, b, lat) for sm in (10.0, 100.0) for b, lat in LAT.items()
)


def _setup(
    max_batch: int = 1, max_wait_ms: float = 0.0, cold_start_ms: float = 0.0
) -> tuple[EventLoop, Gateway, SimInstance]:
    loop = EventLoop()
    gpu = SimGpu(loop)
    gw = Gateway(loop)
    gw.register("f")
    cfg = InstanceConfig(
        "f", "m", GpuShare(100.0, 1.0, 1.0), max_batch, max_wait_ms, cold_start_ms=cold_start_ms
    )
    inst = SimInstance(loop, gpu, "i0", cfg, TABLE, np.random.default_rng(0), gw.completed)
    gw.add_instance(inst)
    return loop, gw, inst


def _submit_at(loop: EventLoop, gw: Gateway, times: list[float]) -> list[SimRequest]:
    out: list[SimRequest] = []
    for t in times:
        loop.at(t, lambda: out.append(gw.submit("f")))
    return out


def test_full_batch_starts_at_once() -> None:
    # 4 requests at t=0, max_batch 4: one batch of 4 starts at 0 and takes lat(4) = 20 ms.
    loop, gw, _ = _setup(max_batch=4, max_wait_ms=10.0)
    reqs = _submit_at(loop, gw, [0.0] * 4)
    loop.run()
    assert [(r.start_ms, r.finish_ms) for r in reqs] == [(0.0, pytest.approx(20.0))] * 4


def test_partial_batch_waits_max_wait_ms() -> None:
    # 2 requests at t=0, max_batch 4, max_wait 10 ms: the batch of 2 starts at 10 (the oldest
    # waited max_wait) and takes lat(2) = 14 ms -> done at 24.
    loop, gw, _ = _setup(max_batch=4, max_wait_ms=10.0)
    reqs = _submit_at(loop, gw, [0.0, 3.0])
    loop.run()
    assert [r.start_ms for r in reqs] == [10.0, 10.0]
    assert [r.finish_ms for r in reqs] == [pytest.approx(24.0)] * 2
    assert [r.latency_ms for r in reqs] == [pytest.approx(24.0), pytest.approx(21.0)]


def test_queue_longer_than_max_batch_splits_into_batches() -> None:
    # 6 requests at t=0, max_batch 4: a batch of 4 runs [0, 20); the other 2 have waited 20 ms
    # >= max_wait 10 when it ends, so a batch of 2 starts at 20 and ends at 20 + 14 = 34.
    loop, gw, _ = _setup(max_batch=4, max_wait_ms=10.0)
    reqs = _submit_at(loop, gw, [0.0] * 6)
    loop.run()
    assert [r.finish_ms for r in reqs] == [pytest.approx(20.0)] * 4 + [pytest.approx(34.0)] * 2


def test_batch_of_one_runs_requests_back_to_back() -> None:
    loop, gw, _ = _setup()
    reqs = _submit_at(loop, gw, [0.0, 0.0, 0.0])
    loop.run()
    assert [r.finish_ms for r in reqs] == [pytest.approx(10.0 * k) for k in (1, 2, 3)]


def test_cold_start_delays_the_first_requests() -> None:
    # cold start 500 ms: requests at 0 and 100 wait in the starting instance's queue; they run
    # one at a time (batch 1) from 500: done at 510 and 520.
    loop, gw, inst = _setup(cold_start_ms=500.0)
    reqs = _submit_at(loop, gw, [0.0, 100.0])
    loop.run(until_ms=499.0)
    assert not inst.ready
    assert inst.outstanding == 2
    loop.run()
    assert inst.ready
    assert [r.start_ms for r in reqs] == [500.0, 510.0]
    assert [r.finish_ms for r in reqs] == [pytest.approx(510.0), pytest.approx(520.0)]


def test_gateway_never_loses_a_request() -> None:
    # Poisson load on a function whose instances come and go: one starts cold at 0, a second
    # is added at 1 s and removed (drained) at 3 s, the first is removed at 4 s and a third is
    # added only at 5 s (requests in between wait at the gateway). At the horizon every
    # submitted request is completed, queued at an instance, running, or pending at the gateway.
    rng = np.random.default_rng(3)
    loop = EventLoop()
    gpu = SimGpu(loop)
    gw = Gateway(loop)
    gw.register("f")
    insts: list[SimInstance] = []

    def add(i: int, cold_ms: float) -> None:
        cfg = InstanceConfig("f", "m", GpuShare(50.0, 0.5, 1.0), 4, 5.0, cold_start_ms=cold_ms)
        inst = SimInstance(loop, gpu, f"i{i}", cfg, TABLE, np.random.default_rng(i), gw.completed)
        insts.append(inst)
        gw.add_instance(inst)

    add(0, 200.0)
    loop.at(1000.0, lambda: add(1, 300.0))
    loop.at(3000.0, lambda: gw.remove_instance(insts[1]))
    loop.at(4000.0, lambda: gw.remove_instance(insts[0]))
    loop.at(5000.0, lambda: add(2, 100.0))
    drive_open_loop(loop, gw, "f", poisson(150.0, 6000.0, rng))
    pending_at_4500: list[int] = []
    loop.at(4500.0, lambda: pending_at_4500.append(gw.pending("f")))
    loop.run(until_ms=5800.0)

    queued = sum(len(i.queue) + len(i.in_flight) for i in insts)
    assert gw.log.submitted > 800
    assert pending_at_4500[0] > 0  # the no-instance gap really parked requests at the gateway
    assert insts[0].stopped and insts[1].stopped  # drained ones finished their queues
    assert gw.log.submitted == len(gw.log.completed) + gw.pending("f") + queued
    loop.run()  # with the arrivals over, everything left completes
    assert len(gw.log.completed) == gw.log.submitted
    assert len({r.request_id for r in gw.log.completed}) == gw.log.submitted


def test_request_log_summary_on_hand_built_requests() -> None:
    # Warm-up 100 ms: the request that arrived at 50 is excluded. The other four have
    # latencies 10, 20, 30, 40 ms; the span is 100 -> 1100 ms = 1 s, so 4 req/s. SLO 25 ms is
    # missed by two of four -> 50 %.
    log = RequestLog(warmup_ms=100.0)
    for i, (arr, lat) in enumerate(
        [(50.0, 5.0), (100.0, 10.0), (300.0, 20.0), (500.0, 30.0), (900.0, 40.0)]
    ):
        r = SimRequest(i, "f", arr, slo_ms=25.0)
        r.finish_ms = arr + lat
        log.record(r)
    s = log.summary("f", until_ms=1100.0)
    assert s["requests"] == 4
    assert s["throughput_rps"] == pytest.approx(4.0)
    assert s["mean_ms"] == pytest.approx(25.0)
    assert s["p50_ms"] == pytest.approx(25.0)  # numpy linear: halfway between 20 and 30
    assert s["slo_violation_pct"] == pytest.approx(50.0)
