"""ESG §4.2 baselines (INFless, FaST-GShare, Orion, Aquatope): the SLO split by average service
time, each scheduler's configuration and invoker rules on hand-built data (arithmetic in the
comments), Orion's search against brute force, the WorkflowPolicy invariants, the registry, and
purity (no scikit-learn / networkx / pydantic / clock in the policy layer)."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gshare.policy.workflow.baselines import (
    BASELINES,
    FALLBACK_CONFIG,
    Z_P95,
    AquatopePolicy,
    FastGSharePolicy,
    InflessPolicy,
    OrionPolicy,
    StageLattice,
    average_service_times_ms,
    fast_candidates,
    fast_select,
    infless_candidates,
    infless_select,
    leftover_share,
    make_baseline,
    orion_search,
    p95_of_paths_ms,
    resource_efficiency,
    rpr,
    service_time_slo_split,
    source_to_sink_paths,
)
from gshare.policy.workflow.dispatch import Dispatch, DispatchRequest, InvokerState, NoInvoker
from gshare.policy.workflow.schedulers import StageContext, StagePlan, WorkflowPolicy
from gshare.workflows.catalogue import SloLevel, application
from gshare.workflows.config import MIN_CONFIG, ConfigGrid, ConfigOption, FunctionConfig
from gshare.workflows.perf import PerfModel
from gshare.workflows.spec import WorkflowSpec, parse_workflow

C = FunctionConfig


def chain(slo_ms: float, n: int = 3) -> WorkflowSpec:
    stages = [
        {"name": f"s{i}", "function": f"f{i}", "after": [f"s{i - 1}"] if i else []}
        for i in range(n)
    ]
    return parse_workflow(
        {"name": "w", "slo_ms": slo_ms, "stages": stages},
        known_functions=[f"f{i}" for i in range(n)],
    )


def diamond(slo_ms: float) -> WorkflowSpec:
    return parse_workflow(
        {
            "name": "d",
            "slo_ms": slo_ms,
            "stages": [
                {"name": "a", "function": "fa"},
                {"name": "b", "function": "fb", "after": ["a"]},
                {"name": "c", "function": "fc", "after": ["a"]},
                {"name": "d", "function": "fd", "after": ["b", "c"]},
            ],
        },
        known_functions=["fa", "fb", "fc", "fd"],
    )


def opts(*times: float, cost: float = 1.0) -> list[ConfigOption]:
    """Options with the given times on distinct batch-1 configurations."""
    return [ConfigOption(C(1, i + 1, 1), t, cost) for i, t in enumerate(times)]


def ctx_for(
    wf: WorkflowSpec,
    stage: str,
    options: Mapping[str, Sequence[ConfigOption]],
    *,
    app: str | None = None,
    done: Sequence[str] = (),
    elapsed_ms: float = 0.0,
    waiting_ms: float = 0.0,
    queue_len: int = 8,
    request_plan: Mapping[str, FunctionConfig] | None = None,
) -> StageContext:
    return StageContext(
        application=app or wf.name,
        workflow=wf,
        stage=stage,
        done_stages=frozenset(done),
        elapsed_ms=elapsed_ms,
        waiting_ms=waiting_ms,
        queue_len=queue_len,
        options=options,
        request_plan=request_plan,
        now_ms=0.0,
    )


def inv(i: int, cpu: int, gpu: int, warm: dict[str, int] | None = None) -> InvokerState:
    return InvokerState(i, cpu, gpu, warm or {})


# -- SLO split by average service time (INFless, FaST-GShare) -----------------------------------

# f0 times {10, 30} -> avg 20; f1 {40, 60} -> 50; f2 {20, 40} -> 30; sum 100
SPLIT_OPTS = {"f0": opts(10, 30), "f1": opts(40, 60), "f2": opts(20, 40)}


@pytest.mark.parametrize(
    ("slo_ms", "expected"),
    [
        (200.0, {"s0": 40.0, "s1": 100.0, "s2": 60.0}),  # 200 * (20, 50, 30) / 100
        (100.0, {"s0": 20.0, "s1": 50.0, "s2": 30.0}),  # 100 * (20, 50, 30) / 100
        (55.0, {"s0": 11.0, "s1": 27.5, "s2": 16.5}),  # 55 * (0.2, 0.5, 0.3)
    ],
)
def test_slo_split_by_average_service_time_on_a_chain(
    slo_ms: float, expected: dict[str, float]
) -> None:
    wf = chain(slo_ms)
    assert average_service_times_ms(wf, SPLIT_OPTS) == {"s0": 20.0, "s1": 50.0, "s2": 30.0}
    split = service_time_slo_split(wf, SPLIT_OPTS)
    assert split == pytest.approx(expected)
    assert sum(split.values()) == pytest.approx(slo_ms)


def test_slo_split_on_a_diamond_never_overbooks_a_path() -> None:
    # averages a 10, b 20, c 40, d 30; paths a-b-d = 60, a-c-d = 80 (critical)
    o = {"fa": opts(10), "fb": opts(20), "fc": opts(40), "fd": opts(30)}
    split = service_time_slo_split(diamond(160.0), o)
    # a, c, d lie on the critical path (L = 80): 160 * (10, 40, 30) / 80 = 20, 80, 60;
    # b's longest path is a-b-d (L = 60): 160 * 20 / 60 = 53.33
    assert split == pytest.approx({"a": 20.0, "b": 160 * 20 / 60, "c": 80.0, "d": 60.0})
    assert split["a"] + split["c"] + split["d"] == pytest.approx(160.0)
    assert split["a"] + split["b"] + split["d"] <= 160.0
    assert sorted(source_to_sink_paths(diamond(1.0))) == [("a", "b", "d"), ("a", "c", "d")]


# -- P95 model ----------------------------------------------------------------------------------


def test_p95_of_a_chain_is_the_convolution_of_independent_stages() -> None:
    # times 100, 200, sigma 10 %: mean 300, sd = 0.1 * sqrt(100^2 + 200^2) = 22.36
    p95 = p95_of_paths_ms({"a": 100.0, "b": 200.0}, [("a", "b")], 0.1)
    assert p95 == pytest.approx(300 + Z_P95 * 0.1 * math.sqrt(100**2 + 200**2))
    # less than the sum of the stages' own P95s (110*..): 300 * (1 + 1.645 * 0.1) = 349.3
    assert p95 < 300 * (1 + Z_P95 * 0.1)
    # a DAG takes its worst path
    assert p95_of_paths_ms({"a": 1.0, "b": 5.0, "c": 2.0}, [("a", "b"), ("a", "c")], 0.0) == 6.0


# -- INFless ------------------------------------------------------------------------------------

# (config, time) -> throughput = batch * 1000 / time
INF_OPTS = [
    ConfigOption(C(1, 1, 1), 100.0, 1.0),  # 10 rps
    ConfigOption(C(2, 4, 1), 50.0, 2.0),  # 40 rps
    ConfigOption(C(4, 8, 2), 80.0, 3.0),  # 50 rps
    ConfigOption(C(8, 16, 7), 120.0, 9.0),  # 66.7 rps
    ConfigOption(C(2, 2, 1), 50.0, 1.5),  # 40 rps, cheaper than (2, 4, 1)
]


@pytest.mark.parametrize(
    ("target_ms", "queue_len", "expected"),
    [
        # everything fits 120 ms with 8 jobs queued: by throughput 66.7, 50, 40 (cheaper first), 10
        (120.0, 8, [C(8, 16, 7), C(4, 8, 2), C(2, 2, 1), C(2, 4, 1), C(1, 1, 1)]),
        # 4 jobs queued: batch 8 is out
        (120.0, 4, [C(4, 8, 2), C(2, 2, 1), C(2, 4, 1), C(1, 1, 1)]),
        # target 60 ms: only the 50 ms options
        (60.0, 8, [C(2, 2, 1), C(2, 4, 1)]),
        # target 40 ms: nothing
        (40.0, 8, []),
    ],
)
def test_infless_enumeration(
    target_ms: float, queue_len: int, expected: list[FunctionConfig]
) -> None:
    assert [o.config for o in infless_candidates(INF_OPTS, target_ms, queue_len)] == expected


def test_infless_half_slo_rule_for_batches() -> None:
    # with INFless's own batching rule a batch > 1 must run in half the target: 120 / 2 = 60,
    # so only the 50 ms batch-2 options and the batch-1 100 ms option remain
    got = infless_candidates(INF_OPTS, 120.0, 8, batch_wait_half_slo=True)
    assert [o.config for o in got] == [C(2, 2, 1), C(2, 4, 1), C(1, 1, 1)]


def test_infless_resource_efficiency_prefers_to_fill_an_invoker() -> None:
    # weights: CPU 64 x 16 = 1024, GPU 14200 (a whole GPU) -> total 15224
    x, y = C(1, 4, 1), C(2, 8, 2)  # throughputs 10 and 20 rps
    empty, nearly_full = inv(0, 16, 7), inv(1, 4, 1)
    # x on the empty node: used after 4/16, 1/7 ->
    #   leftover = (1024 (1.001 - .25) + 14200 (1.001 - 1/7)) / 15224 = 0.85093, CRE = 11.75
    assert resource_efficiency(10.0, x, empty) == pytest.approx(
        10 / ((1024 * (1.001 - 0.25) + 14200 * (1.001 - 1 / 7)) / 15224)
    )
    assert resource_efficiency(10.0, x, empty) == pytest.approx(11.752, rel=1e-3)
    # x fills the nearly full node exactly: leftover = 0.001, CRE = 10 / 0.001 = 10000
    assert resource_efficiency(10.0, x, nearly_full) == pytest.approx(10_000.0)
    # y on the empty node: used after 8/16, 2/7 -> leftover 0.70087, CRE = 28.54
    assert resource_efficiency(20.0, y, empty) == pytest.approx(28.536, rel=1e-3)
    req = DispatchRequest("f", (y, x))
    d = infless_select(req, [empty, nearly_full], {x: 10.0, y: 20.0})
    # joint choice: x on invoker 1 (CRE 10000) beats y on invoker 0 (28.5), although y is
    # ranked first and has twice the throughput; y does not fit on invoker 1
    assert d == Dispatch(1, x, "cold", False, 1)
    # with two empty invokers: y (28.5) beats x (11.75); the tie between the invokers goes to
    # the lower id
    d = infless_select(req, [inv(3, 16, 7), inv(2, 16, 7)], {x: 10.0, y: 20.0})
    assert d == Dispatch(2, y, "cold", False, 0)


def test_infless_never_picks_an_invoker_without_room() -> None:
    req = DispatchRequest("f", (C(1, 8, 4),))
    assert isinstance(infless_select(req, [inv(0, 7, 7), inv(1, 16, 3)], {}), NoInvoker)
    assert isinstance(infless_select(DispatchRequest("f", ()), [inv(0, 16, 7)], {}), NoInvoker)


def test_infless_policy_uses_its_fixed_stage_share_not_the_elapsed_time() -> None:
    # chain s0 -> s1 -> s2 with averages 20, 50, 30 and SLO 200: s1's share is 100 ms
    wf = chain(200.0)
    o = {
        "f0": opts(10, 30),
        "f1": [ConfigOption(C(1, 1, 1), 60.0, 1.0), ConfigOption(C(1, 2, 1), 40.0, 2.0)],
        "f2": opts(20, 40),
    }
    # (the split uses f1's average (60 + 40) / 2 = 50 -> still 200 * 50 / 100 = 100 ms)
    pol = InflessPolicy()
    pol.prepare([("w", wf)], o, seed=0)
    # waiting 30 ms: target 100 - 30 = 70 -> both (60 and 40 ms) meet it; by throughput:
    # 1000/40 = 25 rps first, then 16.7
    plan = pol.plan_stage(ctx_for(wf, "s1", o, done=["s0"], waiting_ms=30.0))
    assert plan.candidates == (C(1, 2, 1), C(1, 1, 1))
    # INFless is per function: 150 ms already spent before this stage changes nothing
    late = pol.plan_stage(ctx_for(wf, "s1", o, done=["s0"], elapsed_ms=180.0, waiting_ms=30.0))
    assert late.candidates == plan.candidates
    # waiting 70 ms: target 30 -> nothing meets it -> the minimum configuration
    none = pol.plan_stage(ctx_for(wf, "s1", o, done=["s0"], waiting_ms=70.0))
    assert none.candidates == (FALLBACK_CONFIG,) == (MIN_CONFIG,)
    assert none.request_plan is None


# -- FaST-GShare --------------------------------------------------------------------------------

# RPR = throughput / (vcpus / 16 + vgpus / 7)
P = ConfigOption(C(1, 1, 1), 100.0, 1.0)  # 10 rps / 0.205357 = 48.70
Q = ConfigOption(C(4, 2, 1), 200.0, 1.0)  # 20 rps / 0.267857 = 74.67
R = ConfigOption(C(4, 16, 7), 50.0, 1.0)  # 80 rps / 2 = 40.00
S = ConfigOption(C(8, 1, 1), 600.0, 1.0)  # 13.3 rps / 0.205357 = 64.93
FAST_OPTS = [P, Q, R, S]


def test_fast_rpr_arithmetic() -> None:
    assert rpr(P) == pytest.approx(10 / (1 / 16 + 1 / 7))
    assert rpr(Q) == pytest.approx(74.667, rel=1e-4)
    assert rpr(R) == pytest.approx(40.0)
    assert rpr(S) == pytest.approx(64.928, rel=1e-4)


@pytest.mark.parametrize(
    ("target_ms", "queue_len", "expected"),
    [
        (300.0, 4, [Q, P, R]),  # S: batch 8 > 4 and 600 ms > 300; by RPR 74.7, 48.7, 40
        (700.0, 8, [Q, S, P, R]),  # all: 74.7, 64.9, 48.7, 40
        (150.0, 4, [P, R]),  # Q takes 200 ms
        (300.0, 1, [P]),  # batch-1 only
        (30.0, 8, []),
    ],
)
def test_fast_enumeration_by_rpr(
    target_ms: float, queue_len: int, expected: list[ConfigOption]
) -> None:
    assert list(fast_candidates(FAST_OPTS, target_ms, queue_len)) == expected


def test_fast_best_fit_node_selection() -> None:
    q = Q.config  # 2 vCPUs, 1 vGPU
    invs = [inv(0, 16, 7), inv(1, 3, 2), inv(2, 2, 1), inv(3, 1, 7)]
    # leftover after placing q: inv0 14/16 + 6/7 = 1.73; inv1 1/16 + 1/7 = 0.21;
    # inv2 0 + 0 = 0 (exact fit); inv3 does not fit (1 vCPU)
    assert leftover_share(invs[0], q) == pytest.approx(14 / 16 + 6 / 7)
    assert leftover_share(invs[1], q) == pytest.approx(1 / 16 + 1 / 7)
    d = fast_select(DispatchRequest("f", (q,)), invs)
    assert d == Dispatch(2, q, "cold", False, 0)
    # the first candidate that fits somewhere wins, even if a later one would fit tighter
    big, small = C(1, 16, 7), C(1, 1, 1)
    d = fast_select(DispatchRequest("f", (big, small)), [inv(0, 16, 7), inv(1, 1, 1)])
    assert isinstance(d, Dispatch) and (d.invoker_id, d.config, d.candidate_rank) == (0, big, 0)
    # equal leftover shares: fewer leftover vGPUs, then the lower id
    d = fast_select(DispatchRequest("f", (small,)), [inv(5, 2, 2), inv(4, 2, 2)])
    assert isinstance(d, Dispatch) and d.invoker_id == 4
    # locality is not a FaST-GShare rule, but the dispatch says where it landed
    d = fast_select(DispatchRequest("f", (q,), preferred=(2,), first_stage=False), invs)
    assert isinstance(d, Dispatch) and d.via == "predecessor"
    assert isinstance(fast_select(DispatchRequest("f", (big,)), [inv(0, 15, 7)]), NoInvoker)


def test_fast_policy_plan_and_fallback() -> None:
    wf = chain(600.0, n=1)  # one stage: its share is the whole SLO
    o = {"f0": FAST_OPTS}
    pol = FastGSharePolicy()
    pol.prepare([("w", wf)], o, seed=0)
    # target 600 - 100 waited = 500 ms, 4 jobs: Q, P, R (S is batch 8)
    plan = pol.plan_stage(ctx_for(wf, "s0", o, waiting_ms=100.0, queue_len=4))
    assert plan.candidates == (Q.config, P.config, R.config)
    # waited 580 ms: target 20 ms -> nothing -> minimum configuration
    assert pol.plan_stage(ctx_for(wf, "s0", o, waiting_ms=580.0)).candidates == (MIN_CONFIG,)


# -- Orion --------------------------------------------------------------------------------------

PERF = PerfModel.default()
SMALL_GRID = ConfigGrid(batches=(1, 2, 4), vcpus=(1, 2, 4), vgpus=(1, 2))  # 18 per stage


def brute_force_orion(
    stages: Sequence[str],
    options: Sequence[Sequence[ConfigOption]],
    goal_ms: float,
    sigma: float,
    paths: Sequence[Sequence[str]] | None = None,
) -> tuple[float, float] | None:
    """(cost, p95) of the cheapest plan whose P95 meets the goal, by enumeration."""
    paths = paths or [list(stages)]
    best: tuple[float, float] | None = None
    for combo in itertools.product(*options):
        times = {s: o.time_ms for s, o in zip(stages, combo, strict=True)}
        p95 = p95_of_paths_ms(times, paths, sigma)
        if p95 <= goal_ms:
            cost = sum(o.cost_usd for o in combo)
            if best is None or cost < best[0]:
                best = (cost, p95)
    return best


@pytest.mark.parametrize("slo_factor", [0.7, 0.8, 1.0, 1.2, 2.0])
def test_orion_search_equals_brute_force_on_esg_functions(slo_factor: float) -> None:
    # image-classification's functions on an 18-configuration grid: 18^3 = 5832 plans
    fns = ["super_resolution", "segmentation", "classification"]
    options = [PERF.options(f, SMALL_GRID) for f in fns]
    goal = slo_factor * (86 + 293 + 147)
    res = orion_search(fns, [StageLattice.build(o) for o in options], goal, sigma_frac=0.05)
    bf = brute_force_orion(fns, options, goal, 0.05)
    assert res.status == "goal" and bf is not None
    assert res.cost_usd == pytest.approx(bf[0], rel=1e-12)
    assert res.meets_goal
    # the plan's fields are consistent with the options it names
    by_cfg = [{o.config: o for o in lst} for lst in options]
    assert res.cost_usd == pytest.approx(
        sum(by_cfg[i][c].cost_usd for i, c in enumerate(res.configs))
    )
    assert res.generated <= 5832


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(1.0, 100.0), st.floats(0.01, 10.0)), min_size=16, max_size=16),
    st.floats(5.0, 250.0),
)
def test_orion_search_equals_brute_force_with_arbitrary_costs(
    tc: list[tuple[float, float]], goal: float
) -> None:
    # two stages on a full 2x2x2 grid, times and costs arbitrary (cost need not grow with
    # resources): the bound-guided best-first search still finds the brute-force optimum
    grid = ConfigGrid(batches=(1, 2), vcpus=(1, 2), vgpus=(1, 2)).configs()
    options = [
        [ConfigOption(c, t, k) for c, (t, k) in zip(grid, tc[i * 8 : (i + 1) * 8], strict=True)]
        for i in range(2)
    ]
    res = orion_search(["a", "b"], [StageLattice.build(o) for o in options], goal, sigma_frac=0.05)
    bf = brute_force_orion(["a", "b"], options, goal, 0.05)
    if bf is None:
        assert res.status == "unreachable" and not res.meets_goal
        fastest = p95_of_paths_ms(
            {"a": min(o.time_ms for o in options[0]), "b": min(o.time_ms for o in options[1])},
            [("a", "b")],
            0.05,
        )
        assert res.p95_ms == pytest.approx(fastest)
    else:
        assert res.status == "goal"
        assert res.cost_usd == pytest.approx(bf[0])
        assert res.meets_goal


def test_orion_search_without_pruning_gives_the_same_plan() -> None:
    fns = ["deblur", "super_resolution", "depth_recognition"]
    options = [PERF.options(f, SMALL_GRID) for f in fns]
    lats = [StageLattice.build(o) for o in options]
    a = orion_search(fns, lats, 1233.0, prune=True)
    b = orion_search(fns, lats, 1233.0, prune=False)
    assert (a.status, b.status) == ("goal", "goal")
    assert a.cost_usd == pytest.approx(b.cost_usd)
    assert a.generated <= b.generated


def test_orion_cut_off_returns_the_best_it_has_seen() -> None:
    fns = ["super_resolution", "segmentation", "classification"]
    lats = [StageLattice.build(PERF.options(f)) for f in fns]  # 448 configs each
    res = orion_search(fns, lats, 526.0, max_evaluations=50)
    assert res.status == "cut-off" and res.generated < 80  # stops at the first pop after 50
    # a tiny budget: either a plan meeting the goal, or the fastest plan seen
    full = orion_search(fns, lats, 526.0, max_evaluations=5000)
    assert full.generated > res.generated
    if full.meets_goal and res.meets_goal:
        assert full.cost_usd <= res.cost_usd
    # the start state alone: S0 = min config everywhere, P95 > goal -> "closest" = S0 itself
    one = orion_search(fns, lats, 526.0, max_evaluations=1)
    assert one.configs == (MIN_CONFIG,) * 3 and not one.meets_goal
    # 86 + 293 + 147 = 526, plus the noise margin
    assert one.p95_ms == pytest.approx(526 + Z_P95 * 0.05 * math.sqrt(86**2 + 293**2 + 147**2))


def test_orion_unreachable_goal_returns_the_fastest_plan() -> None:
    fns = ["super_resolution", "segmentation"]
    options = [PERF.options(f, SMALL_GRID) for f in fns]
    res = orion_search(fns, [StageLattice.build(o) for o in options], 10.0)
    assert res.status == "unreachable"
    assert [c for c in res.configs] == [min(o, key=lambda x: x.time_ms).config for o in options]


def test_stage_lattice_steps_one_dimension_at_a_time() -> None:
    lat = StageLattice.build(PERF.options("classification", SMALL_GRID))
    start = lat.configs[lat.start]
    assert start == C(1, 1, 1)
    assert {lat.configs[j] for j in lat.succ[lat.start]} == {C(2, 1, 1), C(1, 2, 1), C(1, 1, 2)}
    top = lat.configs.index(C(4, 4, 2))
    assert lat.succ[top] == ()
    # the cone of the start holds every configuration
    assert lat.cone_cost[lat.start] == min(lat.cost_usd)


def test_orion_policy_plans_at_the_first_stage_and_never_adapts() -> None:
    wf = application("image-classification", "moderate")  # SLO 526 ms
    o = {
        f: PERF.options(f, SMALL_GRID)
        for f in ("super_resolution", "segmentation", "classification")
    }
    pol = OrionPolicy(noise_sigma_frac=0.05)
    pol.prepare([(wf.name, wf)], o, seed=0)
    first = pol.plan_stage(
        ctx_for(wf, "super_resolution", o, queue_len=2, elapsed_ms=6.0, waiting_ms=6.0)
    )
    assert first.request_plan is not None
    plan = dict(first.request_plan)
    assert set(plan) == {"super_resolution", "segmentation", "classification"}
    assert first.candidates == (plan["super_resolution"],)
    assert plan["super_resolution"].batch <= 2  # only 2 jobs to batch at the first stage
    # the plan is the cheapest one meeting the goal 526 - 6 = 520 with the first stage's
    # batch <= 2
    capped = [
        [x for x in o["super_resolution"] if x.config.batch <= 2],
        o["segmentation"],
        o["classification"],
    ]
    bf = brute_force_orion(list(plan), capped, 520.0, 0.05)
    assert bf is not None and pol.last_result is not None
    assert pol.last_result.cost_usd == pytest.approx(bf[0])
    # later stage: the carried configuration, whatever the state (here: the SLO is blown)
    later = pol.plan_stage(
        ctx_for(
            wf,
            "segmentation",
            o,
            done=["super_resolution"],
            elapsed_ms=5000.0,
            queue_len=1,
            request_plan=plan,
        )
    )
    assert later.candidates == (plan["segmentation"],)
    assert later.request_plan == plan
    if plan["segmentation"].batch > 1:
        assert "config-miss" in later.note
    # memo: goals are rounded down to 1 ms, so 526 - 5.5 = 520.5 -> 520 reuses the search
    n, work = pol.searches, pol.nominal_search_ms
    again = pol.plan_stage(ctx_for(wf, "super_resolution", o, queue_len=2, elapsed_ms=5.5))
    assert pol.searches == n and again.request_plan == first.request_plan
    # ... but the work Orion would have done is still counted: evaluations x 0.004 ms
    assert pol.nominal_search_ms == pytest.approx(work + pol.last_result.generated * 0.004)
    pol.plan_stage(ctx_for(wf, "super_resolution", o, queue_len=2, elapsed_ms=6.5))  # 519
    assert pol.searches == n + 1


def test_orion_and_aquatope_dispatch_with_esg_locality() -> None:
    cfg = C(1, 2, 1)
    invs = [inv(0, 16, 7), inv(1, 4, 1), inv(2, 16, 7, {"f": 1})]
    wf = chain(100.0, n=1)
    o = {"f0": opts(10)}
    ctx = ctx_for(wf, "s0", o)
    for pol in (OrionPolicy(), AquatopePolicy({"w": {"s0": cfg}})):
        # the predecessor's invoker (1) has room: it wins over emptier ones
        d = pol.select_invoker(
            DispatchRequest("f", (cfg,), preferred=(1,), first_stage=False), invs, ctx
        )
        assert d == Dispatch(1, cfg, "predecessor", False, 0)
        # no preference: the warm invoker
        d = pol.select_invoker(DispatchRequest("f", (cfg,)), invs, ctx)
        assert isinstance(d, Dispatch) and (d.invoker_id, d.via) == (2, "warm")


# -- Aquatope (the policy; the BO is in tests/experiments/test_offline_bo.py) -------------------


def test_aquatope_serves_its_static_plan_whatever_the_state() -> None:
    wf = chain(100.0, n=2)
    o = {"f0": opts(10), "f1": opts(10)}
    static = {"w": {"s0": C(4, 2, 1), "s1": C(1, 1, 1)}}
    pol = AquatopePolicy.from_plans(static)
    pol.prepare([("w", wf)], o, seed=0)
    a = pol.plan_stage(ctx_for(wf, "s0", o, queue_len=8))
    b = pol.plan_stage(ctx_for(wf, "s0", o, queue_len=1, elapsed_ms=999.0))
    assert a.candidates == b.candidates == (C(4, 2, 1),)
    assert "config-miss" in b.note and "config-miss" not in a.note  # batch 4 > 1 queued
    assert a.request_plan == static["w"]
    # an application it has no plan for: the minimum configuration
    assert pol.plan_stage(ctx_for(wf, "s0", o, app="other")).candidates == (MIN_CONFIG,)


def test_aquatope_prepare_runs_the_injected_optimiser_with_the_seed() -> None:
    wf = chain(100.0, n=2)
    o = {"f0": opts(10), "f1": opts(10)}
    calls: list[tuple[list[str], int]] = []

    def optimiser(
        workflows: Sequence[tuple[str, object]],
        options: Mapping[str, Sequence[ConfigOption]],
        seed: int,
    ) -> dict[str, dict[str, FunctionConfig]]:
        calls.append(([a for a, _ in workflows], seed))
        return {a: {"s0": C(2, 1, 1), "s1": C(1, 1, 1)} for a, _ in workflows}

    pol = AquatopePolicy({"w": {"s0": C(1, 1, 1), "s1": C(1, 1, 1)}}, optimiser=optimiser)
    pol.prepare([("w", wf), ("w2", wf)], o, seed=7)
    assert calls == [(["w2"], 7)]  # only the application without a plan
    assert pol.static_plans["w2"]["s0"] == C(2, 1, 1)
    with pytest.raises(ValueError, match="no static plan for w"):
        AquatopePolicy().prepare([("w", wf)], o, seed=0)
    with pytest.raises(ValueError, match="s1"):
        AquatopePolicy({"w": {"s0": C(1, 1, 1)}}).prepare([("w", wf)], o, seed=0)


# -- registry and protocol invariants -----------------------------------------------------------


def _static_plan(apps: Sequence[tuple[str, WorkflowSpec]]) -> dict[str, dict[str, FunctionConfig]]:
    return {a: {s.name: C(2, 2, 1) for s in wf.stages} for a, wf in apps}


def test_registry_builds_every_baseline_uniformly() -> None:
    assert list(BASELINES) == ["infless", "fast-gshare", "orion", "aquatope"]
    wf = application("image-classification", "strict")
    apps = [(wf.name, wf)]
    kw = {"perf": PERF, "seed": 3, "static_plans": _static_plan(apps)}
    for name, factory in BASELINES.items():
        pol = factory(**kw)
        assert pol.name == name
        assert isinstance(pol, (InflessPolicy, FastGSharePolicy, OrionPolicy, AquatopePolicy))
    orion = BASELINES["orion"](perf=PERF, max_evaluations=10)
    assert isinstance(orion, OrionPolicy)
    assert orion.noise_sigma_frac == PERF.params.noise_sigma_frac
    assert orion.max_evaluations == 10
    with pytest.raises(TypeError, match="offline_bo"):
        BASELINES["aquatope"](perf=PERF, seed=0)
    with pytest.raises(KeyError, match="known: infless"):
        make_baseline("esg-ish")
    with pytest.raises(TypeError):
        make_baseline("infless", max_evaluations=3)  # a typo-ed keyword is an error


def _policies(apps: Sequence[tuple[str, WorkflowSpec]]) -> list[WorkflowPolicy]:
    return [
        make_baseline("infless"),
        make_baseline("fast-gshare"),
        make_baseline("orion", perf=PERF, max_evaluations=300),
        make_baseline("aquatope", static_plans=_static_plan(apps)),
    ]


@pytest.mark.parametrize("slo", ["strict", "relaxed"])
def test_every_baseline_keeps_the_protocol_invariants(slo: SloLevel) -> None:
    # ESG's apps on a 36-config grid, random-but-seeded states and invoker snapshots: every
    # plan has >= 1 candidate, every dispatch fits where it goes
    grid = ConfigGrid(batches=(1, 2, 4, 8), vcpus=(1, 4, 16), vgpus=(1, 3, 7))
    apps = [
        (a, application(a, slo)) for a in ("image-classification", "expanded-image-classification")
    ]
    o = {f: PERF.options(f, grid) for f in PERF.functions}
    rng = np.random.default_rng(0)
    for pol in _policies(apps):
        pol.prepare(apps, o, seed=0)
        for app, wf in apps:
            order = [s.name for s in wf.stages]
            carried: Mapping[str, FunctionConfig] | None = None
            for i, stage in enumerate(order):
                ctx = ctx_for(
                    wf,
                    stage,
                    o,
                    app=app,
                    done=order[:i],
                    elapsed_ms=float(rng.uniform(0, wf.slo_ms)),
                    waiting_ms=float(rng.uniform(0, 50)),
                    queue_len=int(rng.integers(1, 10)),
                    request_plan=carried,
                )
                plan = pol.plan_stage(ctx)
                assert isinstance(plan, StagePlan) and len(plan.candidates) >= 1
                carried = plan.request_plan if plan.request_plan is not None else carried
                invs = [
                    inv(
                        k,
                        int(rng.integers(0, 17)),
                        int(rng.integers(0, 8)),
                        {wf.stage(stage).function: int(rng.integers(0, 2))},
                    )
                    for k in range(6)
                ]
                req = DispatchRequest(
                    wf.stage(stage).function,
                    plan.candidates,
                    preferred=(int(rng.integers(0, 6)),),
                    first_stage=i == 0,
                )
                d = pol.select_invoker(req, invs, ctx)
                if isinstance(d, Dispatch):
                    chosen = next(x for x in invs if x.invoker_id == d.invoker_id)
                    assert chosen.fits(d.config)
                    assert d.config == plan.candidates[d.candidate_rank]
                else:
                    assert isinstance(d, NoInvoker)
                    assert not any(x.fits(c) for x in invs for c in plan.candidates)


# -- purity -------------------------------------------------------------------------------------


def test_baselines_import_nothing_forbidden() -> None:
    forbidden = sorted(
        {
            "time",
            "asyncio",
            "ray",
            "torch",
            "socket",
            "subprocess",
            "requests",
            "httpx",
            "sqlite3",
            "threading",
            "multiprocessing",
            "fastapi",
            "uvicorn",
            "simpy",
            "pydantic",
            "networkx",
            "sklearn",
            "joblib",
            "threadpoolctl",
        }
    )
    mods = ["gshare.policy.workflow.baselines"] + [
        f"gshare.policy.workflow.baselines.{m}"
        for m in ("common", "infless", "fast_gshare", "orion", "aquatope")
    ]
    code = (
        "import sys\nbefore = set(sys.modules)\n"
        + "".join(f"import {m}\n" for m in mods)
        + f"print(','.join(sorted(m for m in set(sys.modules) - before "
        f"if m.split('.')[0] in {forbidden!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
