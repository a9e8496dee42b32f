"""The workflow cluster simulator: capacity, accounting of every request, determinism, transfer,
containers (cold start, keep-alive, pre-warming), batching and retries after NoInvoker.

Most tests drive the simulator with ``FixedPolicy`` — a real (tiny) ``WorkflowPolicy`` that
always plans one configuration and places the task by a rule — so the expected times follow
from the catalogue by hand (noise off): super_resolution 86 ms at (1, 1, 1), cold start 3503
ms; classification 147 ms, input 0.147 MB, cold start 18299 ms.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pytest

from gshare.policy.prewarm import PrewarmParams
from gshare.policy.workflow.dispatch import Dispatch, DispatchRequest, InvokerState, NoInvoker
from gshare.policy.workflow.esg import EsgPolicy
from gshare.policy.workflow.replan import WorkflowLike
from gshare.policy.workflow.schedulers import StageContext, StagePlan
from gshare.sim.engine import SimulationError
from gshare.sim.workflow import (
    Invoker,
    TransferModel,
    WorkflowRunResult,
    WorkflowSim,
    WorkflowSimConfig,
    azure2021_arrivals,
    load_arrivals,
    uniform_intervals,
)
from gshare.workflows.catalogue import application, applications
from gshare.workflows.config import ConfigOption, FunctionConfig
from gshare.workflows.spec import WorkflowSpec, parse_workflow

MIN = FunctionConfig(1, 1, 1)
Chooser = Callable[[DispatchRequest, Sequence[InvokerState], StageContext], int | None]


class FixedPolicy:
    """Plans ``config`` for every stage; places on the invoker ``choose`` returns (None: no
    invoker). Records every context it saw."""

    def __init__(self, config: FunctionConfig = MIN, choose: Chooser | None = None) -> None:
        self.name = "fixed"
        self.config = config
        self.choose = choose or first_fit
        self.contexts: list[StageContext] = []

    def prepare(
        self,
        workflows: Sequence[tuple[str, WorkflowLike]],
        options: Mapping[str, Sequence[ConfigOption]],
        seed: int,
    ) -> None:
        pass

    def plan_stage(self, ctx: StageContext) -> StagePlan:
        self.contexts.append(ctx)
        return StagePlan((self.config,))

    def select_invoker(
        self, request: DispatchRequest, invokers: Sequence[InvokerState], ctx: StageContext
    ) -> Dispatch | NoInvoker:
        i = self.choose(request, invokers, ctx)
        if i is None:
            return NoInvoker("none")
        return Dispatch(i, request.candidates[0], "cold", False, 0)


def first_fit(req: DispatchRequest, invs: Sequence[InvokerState], ctx: StageContext) -> int | None:
    return next((v.invoker_id for v in invs if v.fits(req.candidates[0])), None)


def sr_cls(slo_ms: float = 10_000.0) -> WorkflowSpec:
    return parse_workflow(
        {
            "name": "w",
            "slo_ms": slo_ms,
            "stages": [
                {"name": "sr", "function": "super_resolution"},
                {"name": "cls", "function": "classification", "after": ["sr"]},
            ],
        }
    )


def config(**kw: object) -> WorkflowSimConfig:
    base: dict[str, object] = {"nodes": 2, "noise_sigma_frac": 0.0, "prewarm": None}
    base.update(kw)
    return WorkflowSimConfig(**base)  # type: ignore[arg-type]


def latencies(res: WorkflowRunResult) -> list[float | None]:
    return [r.latency_ms for r in res.requests]


# -- transfer model ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("local_mb", "local_n", "remote_mb", "remote_n", "want"),
    [
        (0.0, 0, 0.0, 0, 0.0),  # first stage: nothing to move
        (2.7, 1, 0.0, 0, 3.7),  # local: 1 + 2.7 / 1000 MB/s * 1000 = 1 + 2.7
        (0.0, 0, 2.7, 1, 47.0),  # remote: 20 + 2.7 / 100 * 1000 = 20 + 27
        (5.4, 2, 2.7, 1, 47.0),  # both in parallel: max(1 + 5.4, 47)
        (0.0, 0, 0.294, 2, 22.94),  # two remote 0.147 MB inputs share the path: 20 + 2.94
    ],
)
def test_transfer_model(
    local_mb: float, local_n: int, remote_mb: float, remote_n: int, want: float
) -> None:
    assert TransferModel().batch_ms(local_mb, local_n, remote_mb, remote_n) == pytest.approx(want)


def test_local_vs_remote_transfer_in_the_simulation() -> None:
    # one request; sr runs on invoker 0; cls on invoker 0 (local) or 1 (remote); all warm.
    # local : 86 + (1 + 0.147) + 147      = 234.147 ms
    # remote: 86 + (20 + 0.147 * 10) + 147 = 254.47 ms
    def same(req: DispatchRequest, invs: Sequence[InvokerState], ctx: StageContext) -> int:
        return 0

    def other(req: DispatchRequest, invs: Sequence[InvokerState], ctx: StageContext) -> int:
        return 0 if ctx.stage == "sr" else 1

    out = {}
    for name, rule in (("local", same), ("remote", other)):
        sim = WorkflowSim(
            {"w": sr_cls()}, FixedPolicy(choose=rule), config(initial_warm_per_pool=1)
        )
        res = sim.run([(0.0, "w")], 1000.0)
        out[name] = res
    assert latencies(out["local"]) == [pytest.approx(234.147)]
    assert latencies(out["remote"]) == [pytest.approx(254.47)]
    assert (
        out["local"].counters["local_inputs"] == 1 and out["local"].counters["remote_inputs"] == 0
    )
    assert out["remote"].counters["remote_inputs"] == 1
    assert out["remote"].requests[0].remote_inputs == 1


# -- containers ----------------------------------------------------------------------------------


def test_cold_then_warm_start() -> None:
    # cold cluster: request 0 pays sr's 3503 ms and cls's 18299 ms cold starts (same node):
    # 3503 + 86 + 1.147 + 18299 + 147 = 22036.147; request 1 at 30 s finds both warm: 234.147
    sim = WorkflowSim({"w": sr_cls(slo_ms=1000.0)}, FixedPolicy(), config())
    res = sim.run([(0.0, "w"), (30_000.0, "w")], 40_000.0)
    assert latencies(res) == [pytest.approx(22036.147), pytest.approx(234.147)]
    assert [r.hit for r in res.requests] == [False, True]
    assert res.counters["cold_starts"] == 2 and res.counters["warm_starts"] == 2
    assert res.requests[0].cold_starts == 2 and res.requests[1].cold_starts == 0


def test_keep_alive_evicts_idle_containers() -> None:
    # keep-alive 1 s: the containers of request 0 idle since ~0.23 s are gone at 5 s -> cold again
    cfg = config(initial_warm_per_pool=1, keep_alive_ms=1000.0)
    sim = WorkflowSim({"w": sr_cls()}, FixedPolicy(), cfg)
    res = sim.run([(0.0, "w"), (5000.0, "w")], 6000.0)
    assert res.counters["evictions"] >= 2
    assert res.requests[1].cold_starts == 2
    assert latencies(res)[1] == pytest.approx(22036.147)


def test_prewarming_starts_containers_and_tasks_use_them() -> None:
    # a steady stream every 100 ms on one node: the pools get call statistics and the pre-warm
    # ticks start containers; with a cold start of 3.5 s / 18 s most tasks still find a warm one
    cfg = config(nodes=1, prewarm=PrewarmParams(period_ms=500.0), initial_warm_per_pool=1)
    arrivals = [(100.0 * i, "w") for i in range(300)]
    res = WorkflowSim({"w": sr_cls()}, FixedPolicy(), cfg).run(arrivals, 30_000.0)
    assert res.counters["prewarm_started"] > 0
    assert (
        res.counters["warm_starts"] + res.counters["adopted_prewarm"] > res.counters["cold_starts"]
    )


# -- capacity, retries, batching -----------------------------------------------------------------


def test_invoker_rejects_over_capacity() -> None:
    inv = Invoker(0, 16, 7)
    inv.reserve(10, 5)
    with pytest.raises(SimulationError, match="cannot hold"):
        inv.reserve(7, 1)  # 10 + 7 > 16 vCPUs
    inv.release(10, 5)
    with pytest.raises(SimulationError, match="released more"):
        inv.release(1, 0)


def test_a_dispatch_without_room_is_a_policy_bug() -> None:
    # always invoker 0, even when it is full: the second concurrent task does not fit
    big = FunctionConfig(1, 16, 7)
    sim = WorkflowSim(
        {"w": sr_cls()}, FixedPolicy(big, lambda r, i, c: 0), config(initial_warm_per_pool=2)
    )
    with pytest.raises(SimulationError, match="only 0 vCPUs"):
        sim.run([(0.0, "w"), (1.0, "w")], 1000.0)


def test_no_invoker_waits_for_a_release() -> None:
    # one node, every task takes the whole node: request 1 (at 1 ms) waits for request 0's sr
    # to end at 0 + sr_time; sr at (1, 16, 7): cpu 43 * (0.1 + 0.9/16) = 6.71875 ms plus the
    # GPU part 43 ms (data-parallel: 1 job per slice) = 49.71875 ms
    whole = FunctionConfig(1, 16, 7)
    sim = WorkflowSim({"w": sr_cls()}, FixedPolicy(whole), config(nodes=1, initial_warm_per_pool=2))
    res = sim.run([(0.0, "w"), (1.0, "w")], 10_000.0)
    # cls at (1, 16, 7): 73.5 * 0.15625 + 73.5 = 84.984375 ms, + local input 1.147 = 86.131375
    # 0     - 49.72  : request 0's sr; request 1 (t=1) is blocked (NoInvoker)
    # 49.72 - 99.44  : the release retries the blocked sr queue first: request 1's sr;
    #                  request 0's cls, queued at 49.72, is blocked in turn
    # 99.44 - 185.57 : request 0's cls; 185.57 - 271.70: request 1's cls
    assert res.counters["no_invoker"] >= 3
    assert latencies(res) == [
        pytest.approx(2 * 49.71875 + 86.131375),
        pytest.approx(2 * 49.71875 + 2 * 86.131375 - 1.0),
    ]
    assert res.peak_vcpus == [16] and res.peak_vgpus == [7]


def test_batching_takes_up_to_batch_jobs_and_counts_misses() -> None:
    # 5 requests at t=0; every stage planned with batch 4: sr takes 4 jobs, then 1 (a miss:
    # batch 4 > 1 queued); cls gets the 4 and later the 1 -> another miss
    sim = WorkflowSim(
        {"w": sr_cls()}, FixedPolicy(FunctionConfig(4, 4, 2)), config(initial_warm_per_pool=4)
    )
    res = sim.run([(0.0, "w")] * 5, 1000.0)
    assert res.counters["tasks"] == 4 and res.counters["jobs"] == 10
    assert res.counters["config_misses"] == 2
    assert res.counters["mean_batch"] == pytest.approx(2.5)


def test_context_times() -> None:
    # the contexts the policy sees: elapsed = now - arrival, waiting = now - enqueued
    pol = FixedPolicy()
    WorkflowSim({"w": sr_cls()}, pol, config(initial_warm_per_pool=1)).run([(5.0, "w")], 1000.0)
    sr, cls = pol.contexts
    assert (sr.stage, sr.elapsed_ms, sr.waiting_ms, sr.queue_len) == ("sr", 0.0, 0.0, 1)
    assert sr.done_stages == frozenset()
    assert cls.stage == "cls" and cls.done_stages == frozenset({"sr"})
    assert cls.elapsed_ms == pytest.approx(86.0) and cls.waiting_ms == 0.0


# -- accounting and invariants under load --------------------------------------------------------


def _esg_run(
    seed: int, nodes: int = 3, duration_ms: float = 3000.0
) -> tuple[WorkflowRunResult, list[tuple[float, str]]]:
    wfs = applications("moderate")
    arr = load_arrivals("normal", duration_ms, list(wfs), seed)
    cfg = WorkflowSimConfig(nodes=nodes, initial_warm_per_pool=2, warmup_ms=500.0)
    return WorkflowSim(wfs, EsgPolicy(), cfg, seed=seed).run(arr, duration_ms), arr


def test_every_request_is_accounted_and_capacity_holds_under_load() -> None:
    # 3 nodes for a load sized for 16: queues build up, NoInvoker happens, nothing is lost
    res, arr = _esg_run(0)
    assert len(res.requests) == len(arr)
    assert sorted(r.arrival_ms for r in res.requests) == [t for t, _ in arr]
    assert [r.measured for r in res.requests] == [t >= 500.0 for t, _ in arr]
    assert res.counters["no_invoker"] > 0
    assert all(p <= 16 for p in res.peak_vcpus) and all(p <= 7 for p in res.peak_vgpus)
    st = res.stats()
    assert st["requests"] == sum(t >= 500.0 for t, _ in arr)
    assert (
        st["unfinished"] + sum(r.latency_ms is not None for r in res.measured()) == st["requests"]
    )
    # every stage of every finished request ran exactly once (3 or 5 jobs per request)
    finished_jobs = sum(
        len(application(r.application).stages) for r in res.requests if r.latency_ms is not None
    )
    assert finished_jobs <= res.counters["jobs"]
    if res.counters["unfinished"] == 0:
        assert finished_jobs == res.counters["jobs"]


def test_unfinished_requests_count_as_misses() -> None:
    # drain 0: arrivals stop at 300 ms and the run ends there; a cold start (3.5 s) keeps the
    # request unfinished -> latency None, a miss, counted in the denominator
    sim = WorkflowSim({"w": sr_cls()}, FixedPolicy(), config(drain_ms=0.0))
    res = sim.run([(0.0, "w"), (100.0, "w")], 300.0)
    assert [r.latency_ms for r in res.requests] == [None, None]
    st = res.stats()
    assert st["unfinished"] == 2 and st["slo_hit_rate"] == 0.0 and st["requests"] == 2
    # latency percentiles use the age at the end as a lower bound: 300 - 0 and 300 - 100
    assert st["p50_ms"] == pytest.approx(250.0)


def test_deterministic_for_a_seed() -> None:
    a, _ = _esg_run(7)
    b, _ = _esg_run(7)
    c, _ = _esg_run(8)
    assert latencies(a) == latencies(b)
    assert [r.cost_usd for r in a.requests] == [r.cost_usd for r in b.requests]
    skip = {"rounds"}
    assert {k: v for k, v in a.counters.items() if k not in skip} == {
        k: v for k, v in b.counters.items() if k not in skip
    }
    assert latencies(a) != latencies(c)


def test_cost_is_resources_times_billed_time() -> None:
    # one warm request, local transfer: sr (1,1,1) 86 ms, cls (1,1,1) 1.147 + 147 ms;
    # ($0.034 + $0.67) / 3.6e6 ms per ms x (86 + 148.147) ms
    sim = WorkflowSim({"w": sr_cls()}, FixedPolicy(), config(initial_warm_per_pool=1))
    res = sim.run([(0.0, "w")], 1000.0)
    want = (0.034 + 0.67) / 3_600_000.0 * (86.0 + 148.147)
    assert res.requests[0].cost_usd == pytest.approx(want)
    assert res.counters["cost_usd"] == pytest.approx(want)


def test_run_rejects_bad_arrivals() -> None:
    sim = WorkflowSim({"w": sr_cls()}, FixedPolicy(), config())
    with pytest.raises(ValueError, match="sorted"):
        sim.run([(10.0, "w"), (5.0, "w")], 100.0)
    with pytest.raises(ValueError, match="unknown application"):
        WorkflowSim({"w": sr_cls()}, FixedPolicy(), config()).run([(1.0, "x")], 100.0)


# -- workloads -----------------------------------------------------------------------------------


def test_uniform_intervals_stay_in_range() -> None:
    t = uniform_intervals(40.0, 67.2, 10_000.0, np.random.default_rng(0))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.min() >= 40.0 and gaps.max() <= 67.2 and t.max() < 10_000.0
    # mean gap 53.6 ms -> about 10000 / 53.6 = 186.6 arrivals
    assert 170 <= len(t) <= 200


def test_azure_trace_is_scaled_and_tiled() -> None:
    # light: 1000 / 53.6 = 18.66 per s; 60 s -> about 1119 arrivals (the sample's 199, tiled)
    t = azure2021_arrivals(60_000.0, 1000.0 / 53.6)
    assert np.all(np.diff(t) >= 0) and t.max() < 60_000.0
    assert 1000 <= len(t) <= 1250


def test_load_arrivals_is_seeded() -> None:
    apps = ["a", "b"]
    assert load_arrivals("light", 2000.0, apps, 3) == load_arrivals("light", 2000.0, apps, 3)
    assert load_arrivals("light", 2000.0, apps, 3) != load_arrivals("light", 2000.0, apps, 4)
