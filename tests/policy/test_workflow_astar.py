"""ESG_1Q (A* with dual-blade pruning): hand-checked cases and equality with brute force."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gshare.policy.workflow.astar import (
    Infeasible,
    Plans,
    brute_force,
    esg_1q,
    fits_target,
    group_target_ms,
    pareto_front,
)
from gshare.workflows.config import ConfigOption, FunctionConfig


def opt(i: int, t: float, c: float) -> ConfigOption:
    return ConfigOption(FunctionConfig(batch=1, vcpus=i, vgpus=1), t, c)


# Stage A: a1 (10 ms, $5), a2 (20 ms, $2), a3 (30 ms, $1)
# Stage B: b1 (10 ms, $6), b2 (25 ms, $3), b3 (40 ms, $1)
A = [opt(1, 10, 5), opt(2, 20, 2), opt(3, 30, 1)]
B = [opt(1, 10, 6), opt(2, 25, 3), opt(3, 40, 1)]


def test_hand_checked_two_stage_instance() -> None:
    # Target 50 ms. Feasible paths (time, cost): a1b1 (20, 11), a1b2 (35, 8), a1b3 (50, 6),
    # a2b1 (30, 8), a2b2 (45, 5), a3b1 (40, 7); a2b3 = 60, a3b2 = 55, a3b3 = 70 are too slow.
    # Cheapest: a2b2 at $5, then a1b3 at $6 (50 ms = target is feasible), then a3b1 at $7.
    res = esg_1q([A, B], 50.0, k_best=3, stages=["A", "B"])
    assert isinstance(res, Plans)
    assert [(p.configs[0].vcpus, p.configs[1].vcpus) for p in res.paths] == [(2, 2), (1, 3), (3, 1)]
    assert [(p.time_ms, p.cost_usd) for p in res.paths] == [(45, 5), (50, 6), (40, 7)]
    assert res.best.config_of("B") == FunctionConfig(1, 2, 1)
    assert res.paths == brute_force([A, B], 50.0, k_best=3, stages=["A", "B"]).paths  # type: ignore[union-attr]


def test_tighter_target_forces_faster_costlier_path() -> None:
    # Target 30: feasible a1b1 (20, $11) and a2b1 (30, $8) -> a2b1
    res = esg_1q([A, B], 30.0)
    assert isinstance(res, Plans)
    assert (res.best.time_ms, res.best.cost_usd) == (30, 8)


def test_infeasible_reports_the_fastest_path() -> None:
    # fastest path a1b1 takes 20 ms > 19 ms
    res = esg_1q([A, B], 19.0, stages=["A", "B"])
    assert isinstance(res, Infeasible)
    assert res.fastest is not None and res.fastest.time_ms == 20
    assert "takes 20.0 ms, more than the target 19.0 ms" in res.reason
    assert isinstance(brute_force([A, B], 19.0), Infeasible)
    assert isinstance(esg_1q([A, []], 100.0, stages=["A", "B"]), Infeasible)
    assert "no configuration for stage B" in esg_1q([A, []], 1e9, stages=["A", "B"]).reason  # type: ignore[union-attr]


def test_single_stage_group() -> None:
    res = esg_1q([A], 25.0, k_best=2)
    assert isinstance(res, Plans)
    assert [p.cost_usd for p in res.paths] == [2, 5]  # a2 then a1; a3 (30 ms) too slow


def test_cost_blade_prunes_and_time_blade_breaks() -> None:
    # 3 stages x 3 options = 27 paths; with K = 1 the search must not generate all of the
    # 3 + 9 + 27 = 39 partial paths a plain layered enumeration would
    res = esg_1q([A, B, A], 80.0, k_best=1)
    assert isinstance(res, Plans)
    assert res.stats.generated < 39
    assert res.stats.pruned_cost > 0 and res.stats.pruned_time > 0
    assert res.best.cost_usd == brute_force([A, B, A], 80.0, k_best=1).best.cost_usd  # type: ignore[union-attr]


def test_helpers() -> None:
    # (SLO - w) x q: (500 - 40) x 0.25 = 115
    assert group_target_ms(500.0, 40.0, 0.25) == 115.0
    assert fits_target(50.0, 50.0) and not fits_target(50.001, 50.0)
    dominated = [opt(1, 10, 5), opt(2, 12, 6), opt(3, 20, 2), opt(4, 20, 3), opt(5, 30, 2)]
    # (12, 6) is beaten by (10, 5); (20, 3) by (20, 2); (30, 2) by (20, 2)
    assert [o.config.vcpus for o in pareto_front(dominated)] == [1, 3]
    with pytest.raises(ValueError, match="k_best must be >= 1"):
        esg_1q([A], 10.0, k_best=0)


# -- property: ESG_1Q's cheapest feasible path == brute force ----------------------------------

times = st.one_of(st.integers(1, 40).map(float), st.floats(0.5, 40.0))
costs = st.one_of(st.integers(0, 20).map(float), st.floats(0.0, 20.0))
stage_options = st.lists(st.tuples(times, costs), min_size=1, max_size=5).map(
    lambda xs: [opt(i + 1, t, c) for i, (t, c) in enumerate(xs)]
)


@settings(max_examples=300, deadline=None)
@given(
    options=st.lists(stage_options, min_size=2, max_size=3),
    target=st.one_of(st.integers(1, 130).map(float), st.floats(0.0, 130.0)),
    k=st.integers(1, 4),
    pareto=st.booleans(),
)
def test_esg_1q_cheapest_equals_brute_force(
    options: list[list[ConfigOption]], target: float, k: int, pareto: bool
) -> None:
    a = esg_1q(options, target, k_best=k, pareto=pareto)
    b = brute_force(options, target, k_best=k)
    # the exhaustive minimum, computed independently of both implementations
    feasible = [
        (sum(o.cost_usd for o in path), sum(o.time_ms for o in path))
        for path in itertools.product(*options)
        if fits_target(sum(o.time_ms for o in path), target)
    ]
    assert a.feasible == b.feasible == bool(feasible)
    if not feasible:
        return
    assert isinstance(a, Plans) and isinstance(b, Plans)
    assert a.best.cost_usd == pytest.approx(min(feasible)[0], rel=1e-9, abs=1e-12)
    assert b.best.cost_usd == pytest.approx(min(feasible)[0], rel=1e-9, abs=1e-12)
    assert [p.cost_usd for p in b.paths] == pytest.approx(sorted(f[0] for f in feasible)[:k])
    for p in a.paths:  # every returned path is feasible and its totals are its options' sums
        assert fits_target(p.time_ms, target)
        chosen = [
            next(o for o in opts if o.config == cfg)
            for opts, cfg in zip(options, p.configs, strict=True)
        ]
        assert p.time_ms == pytest.approx(sum(o.time_ms for o in chosen))
        assert p.cost_usd == pytest.approx(sum(o.cost_usd for o in chosen))
    assert [p.cost_usd for p in a.paths] == sorted(p.cost_usd for p in a.paths)
    assert len(a.paths) <= k and len(set(a.paths)) == len(a.paths)
