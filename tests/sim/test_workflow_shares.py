"""The workflow simulator on gshare's share space (``SharePerf``): fixed pools of instances, the
per-task dispatch cost and the per-request front-end cost (the twin's calibrated constants)."""

from __future__ import annotations

import pytest

from gshare.policy.workflow.esg import make_share_policy
from gshare.profiles import ProfilePoint, ProfileTable
from gshare.sim.workflow import TransferModel, WorkflowSim, WorkflowSimConfig
from gshare.workflows.perf import PerfParams
from gshare.workflows.shares import QUOTA_UNITS, ShareFunction, SharePerf
from gshare.workflows.spec import parse_workflow

EXEC_MS = {"a": 4.0, "b": 6.0}


def perf() -> SharePerf:
    rows = [
        ProfilePoint(fn, 50.0, q, b, b * ms * 100.0 / q)
        for fn, ms in EXEC_MS.items()
        for b in (1, 2)
        for q in (25.0, 50.0, 100.0)
    ]
    fns = [ShareFunction(fn, fn, 50.0, (1, 2), (25.0, 50.0, 100.0)) for fn in EXEC_MS]
    return SharePerf(fns, ProfileTable(rows), params=PerfParams(noise_sigma_frac=0.0))


def chain(slo_ms: float):  # type: ignore[no-untyped-def]
    return parse_workflow(
        {
            "name": "ab",
            "slo_ms": slo_ms,
            "stages": [
                {"name": "a", "function": "a"},
                {"name": "b", "function": "b", "after": ["a"]},
            ],
        },
        known_functions=list(EXEC_MS),
    )


def run(arrivals: list[float], **cfg: object):  # type: ignore[no-untyped-def]
    p = perf()
    config = WorkflowSimConfig(
        nodes=1,
        node_vcpus=2,
        node_vgpus=QUOTA_UNITS,
        prewarm=None,
        initial_warm_per_pool=1,
        fixed_pools=True,
        transfer=TransferModel(local_latency_ms=0.0, remote_latency_ms=0.0),
        noise_sigma_frac=0.0,
        **cfg,
    )
    sim = WorkflowSim({"ab": chain(10.0)}, make_share_policy("esg", perf=p), config, perf=p)
    return sim.run([(t, "ab") for t in arrivals], 1_000.0)


def test_one_request_takes_the_front_end_plus_each_task_and_its_dispatch() -> None:
    # SLO 10 ms: only 100 % quota fits a (4 ms) + b (6 ms); ESG's late answer is the fastest
    res = run([0.0], dispatch_ms=0.5, frontend_ms=2.0)
    (r,) = res.requests
    # 2 (front end) + (0.5 + 4) + (0.5 + 6) = 13 ms
    assert r.latency_ms == pytest.approx(13.0)
    assert res.counters["cold_starts"] == 0


def test_a_measured_spread_is_drawn_per_request_from_its_samples() -> None:
    arrivals = [30.0 * i for i in range(33)]
    res = run(arrivals, frontend_ms=2.0, frontend_jitter_ms=(-1.5, 0.0, 5.0, -3.0))
    lats = {round(r.latency_ms or -1.0, 6) for r in res.requests}
    # 2 + 4 + 6 = 12 ms, plus an offset drawn per request (30 ms apart: no overlap); the
    # front end's delay is never below 0 (-3 ms: 10 ms, the stages alone)
    assert lats == {10.5, 12.0, 17.0, 10.0}
    with pytest.raises(ValueError, match="frontend_jitter_ms"):
        WorkflowSimConfig(frontend_jitter_ms=(float("nan"),))


def test_without_the_constants_the_latency_is_the_profile() -> None:
    (r,) = run([0.0]).requests
    assert r.latency_ms == pytest.approx(10.0)


def test_a_fixed_pool_queues_instead_of_starting_containers() -> None:
    # two requests at once, one instance per function: the second waits for each stage
    res = run([0.0, 0.0])
    lats = sorted(r.latency_ms for r in res.requests if r.latency_ms is not None)
    assert res.counters["cold_starts"] == 0
    assert len(lats) == 2 and lats[1] > lats[0]
    assert max(res.peak_vcpus) <= 2


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="fixed_pools"):
        WorkflowSimConfig(fixed_pools=True, initial_warm_per_pool=0, prewarm=None)
    with pytest.raises(ValueError, match="dispatch_ms"):
        WorkflowSimConfig(dispatch_ms=-1.0)
