"""SimCluster runs policy.control like the runtime's controller: a function with keep_alive_s is
kept warm while idle for less than that, scaled to zero after it, and a request that arrives
with no instance is a cold start served after ``cold_start_ms`` (stepped at once, not at the
next period)."""

from __future__ import annotations

import numpy as np

from gshare.policy.autoscale import ScaleConfig
from gshare.profiles import ProfileTable
from gshare.sim.cluster import ClusterConfig, SimCluster, SimFunction
from gshare.sim.engine import EventLoop
from gshare.sim.workload import drive_open_loop

CFG = ScaleConfig(sm_pct=50.0, quota_pct=100.0, batch=1, throughput_rps=50.0, latency_ms=10.0)


def _cluster(keep_alive_s: float | None) -> tuple[EventLoop, SimCluster]:
    loop = EventLoop()
    cfg = ClusterConfig(max_gpus=2, period_ms=1000.0, cold_start_ms=500.0, launch=None)
    cluster = SimCluster(loop, ProfileTable.shipped_v100(), cfg, np.random.default_rng(0))
    cluster.add_function(SimFunction("r", "resnet50", 1000.0, (CFG,), keep_alive_s=keep_alive_s))
    return loop, cluster


def _instances_at(cluster: SimCluster, t_s: float) -> int:
    rows = [r for r in cluster.timeline if abs(r["t_s"] - t_s) < 1e-9]
    return int(rows[0]["instances"])


def test_keep_alive_then_scale_to_zero_then_cold_start() -> None:
    loop, cluster = _cluster(keep_alive_s=5.0)
    # a request at 0.2 s, then silence until one at 20.2 s
    drive_open_loop(loop, cluster.gateway, "r", [200.0, 20_200.0])
    cluster.start(until_ms=30_000.0)
    loop.run(until_ms=30_000.0)
    loop.run()
    reqs = sorted(cluster.log.completed, key=lambda r: r.arrival_ms)
    assert len(reqs) == 2 and all(r.finish_ms is not None for r in reqs)
    # cold starts: stepped at the arrival, served after the 500-ms cold start, not at the
    # next period (1 s)
    for r in reqs:
        assert r.start_ms is not None
        assert r.start_ms - r.arrival_ms == 500.0
    # warm while idle < 5 s after the answer (~0.7 s); zero once the keep-alive passed
    assert _instances_at(cluster, 5.0) == 1
    assert _instances_at(cluster, 6.0) == 0
    assert _instances_at(cluster, 19.0) == 0
    assert _instances_at(cluster, 21.0) == 1


def test_without_keep_alive_only_the_period_steps() -> None:
    loop, cluster = _cluster(keep_alive_s=None)
    drive_open_loop(loop, cluster.gateway, "r", [200.0])
    cluster.start(until_ms=5_000.0)
    loop.run(until_ms=5_000.0)
    loop.run()
    (req,) = cluster.log.completed
    # queued at the gateway until the step at 1 s starts an instance (cold 500 ms)
    assert req.start_ms == 1500.0
