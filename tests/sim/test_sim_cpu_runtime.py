"""The simulator's model of the live runtime on the CPU device (``sim.cluster.cpu_runtime_fields``)
and the per-request platform latency (``ClusterConfig.platform_ms``, ``platform_serial_ms``)."""

from __future__ import annotations

import numpy as np
import pytest

from gshare.experiments.fidelity import fifo_waits_ms
from gshare.policy.autoscale import ScaleConfig
from gshare.policy.tokens import LIVE_TOKEN_CONFIG, ClientSpec
from gshare.profiles import ProfilePoint, ProfileTable
from gshare.sim.cluster import ClusterConfig, SimCluster, SimFunction, cpu_runtime_fields
from gshare.sim.engine import EventLoop
from gshare.sim.gpu import SimGpu
from gshare.sim.request import SimRequest
from gshare.sim.workload import drive_open_loop

BURST_MS = 8.0
QUOTAS = {"a": 30.0, "b": 60.0}
HORIZON_MS = 4_000.0


def _table() -> ProfileTable:
    return ProfileTable(
        [
            ProfilePoint(f, 100.0, q, 1, BURST_MS * 100.0 / q)
            for f in QUOTAS
            for q in (30.0, 60.0, 100.0)
        ]
    )


def _saturated_shares(**fields: object) -> dict[str, float]:
    """Two functions at quotas 0.3 / 0.6 (request = limit) on all the SMs of one device, each
    sent twice what its quota serves: the busy share each achieves (finished requests × the
    burst, over the horizon)."""
    loop = EventLoop()
    cluster = SimCluster(
        loop, _table(), ClusterConfig(max_gpus=1, cold_start_ms=0.0, **fields),  # type: ignore[arg-type]
        np.random.default_rng(0),
    )  # fmt: skip
    for f, q in QUOTAS.items():
        tput = q / 100.0 * 1000.0 / BURST_MS
        cfg = ScaleConfig(sm_pct=100.0, quota_pct=q, batch=1, throughput_rps=tput,
                          latency_ms=BURST_MS * 100.0 / q)  # fmt: skip
        cluster.add_function(
            SimFunction(f, f, 1e9, (cfg,), min_instances=1, max_instances=1, quota_limit_pct=q)
        )
        step = 1000.0 / (2 * tput)
        drive_open_loop(loop, cluster.gateway, f, list(np.arange(step, HORIZON_MS, step)))
    cluster.start(until_ms=HORIZON_MS)
    loop.run(until_ms=HORIZON_MS)
    done: dict[str, int] = {f: 0 for f in QUOTAS}
    for r in cluster.log.completed:
        done[r.function] += 1
    return {f: 100.0 * n * BURST_MS / HORIZON_MS for f, n in done.items()}


def test_cpu_runtime_holds_time_sharing_functions_to_their_quotas() -> None:
    cpu = _saturated_shares(**cpu_runtime_fields())
    gpu = _saturated_shares()  # the V100-fitted defaults: launch-gated, interference, 1 ms
    for f, q in QUOTAS.items():
        # the limit is a hard cap; the CPU model loses only grant latencies below it
        assert q - 3.0 <= cpu[f] <= q + 1.0, cpu
        # the GPU model charges a waiting neighbour as interference: far below the quota
        assert gpu[f] < cpu[f] - 3.0, (gpu, cpu)


def _one_instance_run(busy_ms: float, arrivals: list[float], **fields: object) -> list[SimRequest]:
    """One CPU-runtime instance (``busy_ms`` a request, quota 100 %) sent ``arrivals``, with
    more ``ClusterConfig`` ``fields`` (the platform's; the token grant's round trip only when
    they name ``token_grant_ms``). The answered requests, by id."""
    loop = EventLoop()
    table = ProfileTable([ProfilePoint("m", 100.0, 100.0, 1, busy_ms)])
    cfg = ScaleConfig(sm_pct=100.0, quota_pct=100.0, batch=1, throughput_rps=1000.0 / busy_ms,
                      latency_ms=busy_ms)  # fmt: skip
    cluster = SimCluster(
        loop, table,
        ClusterConfig(max_gpus=1, cold_start_ms=0.0,
                      **{**cpu_runtime_fields(), "token_grant_ms": 0.0, **fields}),  # type: ignore[arg-type]
        np.random.default_rng(1),
    )  # fmt: skip
    cluster.add_function(SimFunction("m", "m", 1e9, (cfg,), min_instances=1, max_instances=1))
    drive_open_loop(loop, cluster.gateway, "m", arrivals)
    cluster.start(until_ms=1_000.0)
    loop.run()
    return sorted(cluster.log.completed, key=lambda r: r.request_id)


def test_platform_latency_is_drawn_per_answer_and_does_not_hold_the_instance() -> None:
    arrivals = [10.0 * i for i in range(1, 41)]
    plain = _one_instance_run(5.0, arrivals)
    padded = _one_instance_run(5.0, arrivals, platform_ms=(1.0, 3.0))
    assert len(plain) == len(padded) == 40
    extra = {round(b.latency_ms - a.latency_ms, 9) for a, b in zip(plain, padded, strict=True)}
    assert extra == {1.0, 3.0}  # one sample per answer, both drawn
    # the instance started each burst at the same time: the platform is not its busy time
    assert [r.start_ms for r in plain] == [r.start_ms for r in padded]


def _burst_run(serial_ms: float, arrivals: list[float]) -> list[SimRequest]:
    """``_one_instance_run`` at 0.5 ms a request with the platform's serial stage busy
    ``serial_ms`` per request."""
    return _one_instance_run(0.5, arrivals, platform_serial_ms=serial_ms)


def test_the_serial_stage_delays_a_bursts_later_requests_by_the_fifo_waits() -> None:
    # a burst of 5 at 100 ms, one request alone at 300 ms, two 1 ms apart at 500 ms
    arrivals = [100.0] * 5 + [300.0, 500.0, 501.0]
    plain, staged = _burst_run(0.0, arrivals), _burst_run(1.5, arrivals)
    assert len(plain) == len(staged) == len(arrivals)
    waits = fifo_waits_ms(arrivals, 1.5)
    assert waits == [0.0, 1.5, 3.0, 4.5, 6.0, 0.0, 0.0, 0.5]
    # each request reached the instance after its wait in the stage (the instance's queue,
    # 0.5 ms a request, absorbs part of it: without the stage the burst queued there instead)
    for r, w in zip(staged, waits, strict=True):
        assert r.start_ms >= r.arrival_ms + w - 1e-9
    assert staged[4].start_ms == pytest.approx(100.0 + 6.0)  # the burst's last: after the stage
    assert plain[4].start_ms == pytest.approx(100.0 + 4 * 0.5)  # it waited in the queue before
    # an isolated request pays nothing: the stage's own service time is in the platform samples
    assert staged[5].latency_ms == pytest.approx(plain[5].latency_ms)
    # a wider stage delays more, never less
    wider = _burst_run(3.0, arrivals)
    assert all(w.latency_ms >= s.latency_ms - 1e-9 for w, s in zip(wider, staged, strict=True))


def test_a_negative_serial_stage_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="platform_serial_ms"):
        _burst_run(-1.0, [1.0])


def test_a_request_close_behind_the_previous_one_takes_its_gap_classs_busy_time() -> None:
    # 2 ms a request; arrived at most 1 ms after the previous one: half of it, else 1.5x
    rows = ((1.0, 0.5), (float("inf"), 1.5))
    arrivals = [100.0, 100.0, 100.0, 500.0]  # a burst of three, then one alone
    runs = _one_instance_run(2.0, arrivals, busy_gap_factors=rows)
    busy = [r.finish_ms - r.start_ms for r in runs]
    # the first had no request before it (the last class); the next two came with it
    assert busy == pytest.approx([3.0, 1.0, 1.0, 3.0])
    plain = _one_instance_run(2.0, arrivals)
    assert [r.finish_ms - r.start_ms for r in plain] == pytest.approx([2.0] * 4)


def test_the_gap_class_goes_by_arrivals_not_by_the_instances_idle_time() -> None:
    # requests 2 ms apart queue behind each other (3 ms each at the 1.5x class): each starts
    # the moment the one before it ends, yet its class is its arrival gap (2 ms: 1.5x), as the
    # live answers the factors are fitted on are classed (experiments.fidelity)
    rows = ((1.0, 0.5), (float("inf"), 1.5))
    runs = _one_instance_run(2.0, [100.0, 102.0, 104.0], busy_gap_factors=rows)
    assert [r.start_ms for r in runs] == pytest.approx([100.0, 103.0, 106.0])
    assert [r.finish_ms - r.start_ms for r in runs] == pytest.approx([3.0, 3.0, 3.0])


def test_a_new_instances_first_batch_takes_the_measured_first_busy_time() -> None:
    # 2 ms a request; the instance's first inference 9 ms (in place of its gap factor's 1.5x)
    rows = ((1.0, 0.5), (float("inf"), 1.5))
    arrivals = [100.0, 200.0, 200.5, 300.0]
    runs = _one_instance_run(2.0, arrivals, busy_gap_factors=rows, first_busy_ms=9.0)
    assert [r.finish_ms - r.start_ms for r in runs] == pytest.approx([9.0, 3.0, 1.0, 3.0])
    plain = _one_instance_run(2.0, arrivals, first_busy_ms=9.0)
    assert [r.finish_ms - r.start_ms for r in plain] == pytest.approx([9.0, 2.0, 2.0, 2.0])


def test_an_immediate_token_grant_costs_its_round_trip_uncharged() -> None:
    # 2 ms a request, alone (a new token each) or 0.5 ms behind the previous one (it is ready
    # when that one ends: the kept token, no round trip)
    grant = cpu_runtime_fields()["token_grant_ms"]
    assert grant > 0
    arrivals = [100.0, 200.0, 200.5, 300.0]
    runs = _one_instance_run(2.0, arrivals, token_grant_ms=grant)
    plain = _one_instance_run(2.0, arrivals)
    assert [r.finish_ms - r.start_ms for r in plain] == pytest.approx([2.0] * 4)
    took = [r.finish_ms - r.start_ms for r in runs]
    assert took == pytest.approx([2.0 + grant, 2.0 + grant, 2.0, 2.0 + grant])
    # not charged to the token: a client limited to 4 ms of each 40-ms window runs a 3.9-ms
    # burst on one token (charged, the round trip would have left 3.7 ms for it)
    assert _limited_burst_done_ms(3.9, grant) == pytest.approx(3.9 + grant)
    assert _limited_burst_done_ms(3.9, 0.0) == pytest.approx(3.9)


def _limited_burst_done_ms(work_ms: float, grant_ms: float) -> float:
    """When a ``work_ms`` burst of a client limited to 0.1 of each window (the live token
    protocol: 3.9 ms a token) ends, with ``token_grant_ms`` ``grant_ms``."""
    loop = EventLoop()
    gpu = SimGpu(loop, token_config=LIVE_TOKEN_CONFIG, token_grant_ms=grant_ms)
    gpu.add_client(ClientSpec("a", 100.0, 0.1, 0.1))
    done: list[float] = []
    gpu.run_burst("a", work_ms, lambda: done.append(loop.now_ms))
    loop.run(until_ms=200.0)
    (at,) = done
    return at


def _estimate_run(busy_ms: float, throughput_from_busy: bool) -> SimCluster:
    """One CPU-runtime function whose config says 1 ms a request (1,000 requests/s at quota
    100 %) while its instances take ``busy_ms``; 300 requests/s for 3 s, up to 4 instances."""
    loop = EventLoop()
    table = ProfileTable([ProfilePoint("m", 100.0, 100.0, 1, busy_ms)])
    cfg = ScaleConfig(sm_pct=100.0, quota_pct=100.0, batch=1, throughput_rps=1000.0,
                      latency_ms=1.0)  # fmt: skip
    cluster = SimCluster(
        loop, table,
        ClusterConfig(max_gpus=4, cold_start_ms=0.0, **cpu_runtime_fields()),  # type: ignore[arg-type]
        np.random.default_rng(1),
    )  # fmt: skip
    cluster.add_function(
        SimFunction("m", "m", 1e9, (cfg,), min_instances=1, max_instances=4,
                    throughput_from_busy=throughput_from_busy)
    )  # fmt: skip
    drive_open_loop(loop, cluster.gateway, "m", list(np.arange(1.0, 3_000.0, 1000.0 / 300.0)))
    cluster.start(until_ms=3_000.0)
    loop.run(until_ms=3_000.0)
    return cluster


def test_the_controller_follows_the_measured_busy_time_when_asked() -> None:
    # the instances take 5 ms a request (200 requests/s each) where the config says 1 ms
    fixed = _estimate_run(5.0, throughput_from_busy=False)
    measured = _estimate_run(5.0, throughput_from_busy=True)
    most = {name: max(r["instances"] for r in c.timeline) for name, c in
            (("fixed", fixed), ("measured", measured))}  # fmt: skip
    assert most["fixed"] == 1  # 1,000 requests/s on paper: one instance covers 300
    assert most["measured"] >= 2  # 200 each as measured: more are started
    # an instance as fast as its config: the estimate changes nothing
    same = _estimate_run(1.0, throughput_from_busy=True)
    assert max(r["instances"] for r in same.timeline) == 1


def test_an_answer_stays_outstanding_for_its_share_of_the_platform_latency() -> None:
    """``platform_outstanding_share``: the gateway counts an answered request outstanding until
    the share of its platform sample has passed (the live gateway's window ends when the answer
    is back from the instance); the latency and the instance are as without it."""
    seen: dict[float, int] = {}

    def run(share: float) -> list[SimRequest]:
        loop = EventLoop()
        table = ProfileTable([ProfilePoint("m", 100.0, 100.0, 1, 5.0)])
        cfg = ScaleConfig(sm_pct=100.0, quota_pct=100.0, batch=1, throughput_rps=200.0,
                          latency_ms=5.0)  # fmt: skip
        cluster = SimCluster(
            loop, table,
            ClusterConfig(max_gpus=1, cold_start_ms=0.0, platform_ms=(4.0,),
                          platform_outstanding_share=share,
                          **{**cpu_runtime_fields(), "token_grant_ms": 0.0}),  # type: ignore[arg-type]
            np.random.default_rng(1),
        )  # fmt: skip
        cluster.add_function(SimFunction("m", "m", 1e9, (cfg,), min_instances=1, max_instances=1))
        drive_open_loop(loop, cluster.gateway, "m", [100.0])
        cluster.start(until_ms=1_000.0)
        for t in (104.0, 106.0, 108.0):  # probes after the instance finished (about 105 ms)
            loop.at(t, lambda t=t: seen.__setitem__(t, cluster.gateway.outstanding["m"]))
        loop.run()
        return cluster.log.completed

    plain = run(0.0)
    assert (seen[106.0], seen[108.0]) == (0, 0)
    held = run(0.5)  # 2 ms of the 4-ms sample
    assert held[0].finish_ms - held[0].start_ms < 4.0 + 5.0 + 1.0
    assert (seen[104.0], seen[106.0], seen[108.0]) == (1, 1, 0)
    assert [r.latency_ms for r in held] == [r.latency_ms for r in plain]
    with pytest.raises(ValueError, match=r"platform_outstanding_share must be in \[0, 1\]"):
        run(1.5)
