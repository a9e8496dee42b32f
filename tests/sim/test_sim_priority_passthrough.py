"""The simulated cluster gives each instance its function's priority (the spec's
``priority``), as the live token server registers a client with it: the simulated token
scheduler then orders waiting clients by it (``policy.tokens``)."""

from __future__ import annotations

import numpy as np

from gshare.policy.autoscale import ScaleConfig
from gshare.profiles import ProfilePoint, ProfileTable
from gshare.sim.cluster import ClusterConfig, SimCluster, SimFunction
from gshare.sim.engine import EventLoop


def test_function_priority_reaches_the_simulated_token_scheduler() -> None:
    table = ProfileTable(
        [ProfilePoint("m", 100.0, q, 1, 2.0 * 100.0 / q) for q in (25.0, 50.0, 100.0)]
    )
    cfg = ScaleConfig(sm_pct=100.0, quota_pct=50.0, batch=1, throughput_rps=250.0, latency_ms=4.0)
    loop = EventLoop()
    cluster = SimCluster(
        loop, table, ClusterConfig(max_gpus=1, cold_start_ms=0.0), np.random.default_rng(0)
    )
    for name, prio in (("hi", 8), ("lo", 1)):  # both fit one device (2 x 50 %)
        cluster.add_function(
            SimFunction(name, "m", 100.0, (cfg,), min_instances=1, max_instances=1, priority=prio)
        )
    cluster.start(until_ms=1.0)
    loop.run(until_ms=1.0)
    clients = {
        cid.rsplit("-", 1)[0]: c.spec.priority
        for gpu in cluster.gpus.values()
        for cid, c in gpu.scheduler.clients.items()
    }
    assert clients == {"hi": 8, "lo": 1}
