"""policy.sizing: BulkX's (init, step) integer program, solved exactly (``solve_sizing``) and as a
MILP on HiGHS (``solve_sizing_milp``); and how its answer meets the run-time growth rule
``policy.memory.grow_limit``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gshare.policy.memory import grow_limit, idle_limit
from gshare.policy.sizing import (
    TIE_REL,
    WASTE_TOL,
    Demand,
    History,
    Problem,
    Sizing,
    SizingError,
    solve_sizing,
    solve_sizing_milp,
)
from gshare.policy.sizing.problem import better, waste_curve


def hist(*pairs: tuple[float, float]) -> list[Demand]:
    return [Demand(h, t) for h, t in pairs]


# -- table: the arithmetic of small instances ------------------------------------------------

TABLE = [
    pytest.param(
        # Σh = 600, equal times (weights 1): waste(I) = Σ(I − h)+ / 600 <= 0.1 → Σ(I − h)+ <= 60
        # → init_max = 160. Literal objective f = I + Σ S·k_h: at S = 1 f = I + (200 − I) +
        # (300 − I) = 500 − I, least at I = 160: 340. Any S dividing 40 and 140 ties (S·k_h =
        # R_h exactly); the fewest steps take S = gcd = 20: k = 2 + 7 = 9 → 3.0 per demand.
        hist((100, 1), (200, 1), (300, 1)),
        dict(cost_factor=1.0, waste_threshold=0.1),
        (160, 20, 9, 340.0, 0.1),
        id="literal-gcd-step",
    ),
    pytest.param(
        # + 10 MB per step: f = I + (S + 10)·Σk. At I = 160, S = 47: k = ceil(40/47) +
        # ceil(140/47) = 1 + 3 → 160 + 57·4 = 388. One MB less init makes 141 = 3·47 exact:
        # I = 159, S = 47, k = 1 + 3 → 159 + 57·4 = 387 (waste 59/600 = 0.0983); nothing lower.
        hist((100, 1), (200, 1), (300, 1)),
        dict(cost_factor=1.0, waste_threshold=0.1, step_cost_mb=10.0),
        (159, 47, 4, 387.0, 59 / 600),
        id="step-cost",
    ),
    pytest.param(
        # mean time 2 s: the 100-MB demand weighs 1/2 → waste(I) = (I − 100)·0.5/300 <= 0.1 →
        # init_max = 160. c = 2: f = I + 2·S·k, at S = 40: 160 + 2·40 = 240 (below 160 it
        # rises: 400 − I at best).
        hist((100, 1), (200, 3)),
        dict(cost_factor=2.0, waste_threshold=0.1),
        (160, 40, 1, 240.0, 0.1),
        id="short-overallocation-is-cheap",
    ),
    pytest.param(
        # the same demands, the small one now runs long (weight 1.5): (I − 100)·1.5/300 <= 0.1
        # → init_max = 120; f = 120 + 2·80 = 280 with one step of 80.
        hist((100, 3), (200, 1)),
        dict(cost_factor=2.0, waste_threshold=0.1),
        (120, 80, 1, 280.0, 0.1),
        id="long-overallocation-is-dear",
    ),
    pytest.param(
        # threshold 0: init may not exceed any demand → init_max = floor(100.5) = 100. D = 101
        # and 300: R = 1 and 200, gcd 1 → S = 1, k = 1 + 200 → 100 + 201 = 301.
        hist((100.5, 1), (300, 1)),
        dict(cost_factor=1.0, waste_threshold=0.0),
        (100, 1, 201, 301.0, 0.0),
        id="zero-threshold",
    ),
    pytest.param(
        # granularity 64: D = ceil(130/64) = 3, ceil(250/64) = 4 units; a loose threshold lets
        # init = 4 units = 256 cover both (f = 256); init 192 + one 64-step ties at 256 but
        # takes a step. waste = ((256 − 130) + (256 − 250)) / 380 = 132/380.
        hist((130, 1), (250, 1)),
        dict(cost_factor=1.0, waste_threshold=10.0, granularity_mb=64.0),
        (256, 64, 0, 256.0, 132 / 380),
        id="granularity",
    ),
    pytest.param(
        # one demand, c = 1: a step of R costs R, as much as the init it saves; the tie goes
        # to no step: init = 100, f = 100
        hist((100, 1)),
        dict(cost_factor=1.0, waste_threshold=0.1),
        (100, 1, 0, 100.0, 0.0),
        id="one-demand",
    ),
    pytest.param(
        # one demand, c = 0.5: init 0 and one step of 100 costs 0.5·100 = 50 < 100
        hist((100, 1)),
        dict(cost_factor=0.5, waste_threshold=0.1),
        (0, 100, 1, 50.0, 0.0),
        id="one-demand-cheap-steps",
    ),
    pytest.param(
        # a demand of exactly 512 is covered by 512 (cover read as >=, not >)
        hist((512, 1), (512, 2)),
        dict(cost_factor=1.0, waste_threshold=0.0),
        (512, 1, 0, 512.0, 0.0),
        id="exact-fit-covers",
    ),
]


@pytest.mark.parametrize(("history", "kw", "want"), TABLE)
def test_table(history: list[Demand], kw: dict[str, float], want: tuple) -> None:
    init, step, total, objective, waste = want
    for solve in (solve_sizing, solve_sizing_milp):
        s = solve(history, **kw)
        assert s.objective_mb == pytest.approx(objective)
        if solve is solve_sizing:  # the MILP may break ties differently
            assert (s.init_mb, s.step_mb, s.total_steps) == (init, step, total)
            assert s.waste == pytest.approx(waste)
            assert s.expected_steps == pytest.approx(total / len(history))
            assert s.history_len == len(history)


@pytest.mark.parametrize(
    ("history", "kw", "match"),
    [
        ([], {}, "empty"),
        (hist((-1, 1)), {}, "demand_mb"),
        (hist((math.nan, 1)), {}, "demand_mb"),
        (hist((10, -1)), {}, "exec_time_s"),
        (hist((10, 1)), {"cost_factor": -1.0}, "cost_factor"),
        (hist((10, 1)), {"waste_threshold": math.inf}, "waste_threshold"),
        (hist((10, 1)), {"granularity_mb": 0.0}, "granularity_mb"),
        (hist((10, 1)), {"step_cost_mb": -2.0}, "step_cost_mb"),
    ],
)
def test_bad_inputs_are_named(history: list[Demand], kw: dict[str, float], match: str) -> None:
    args = {"cost_factor": 1.0, "waste_threshold": 0.1, **kw}
    with pytest.raises(SizingError, match=match):
        solve_sizing(
            history,
            args.pop("cost_factor"),
            args.pop("waste_threshold"),
            **args,  # type: ignore[arg-type]
        )


def test_all_zero_demands_and_times() -> None:
    # nothing to cover: init 0, no steps; exec times all 0 make every waste 0
    s = solve_sizing(hist((0, 0), (0, 0)), 1.0, 0.0)
    assert (s.init_mb, s.total_steps, s.waste, s.objective_mb) == (0.0, 0, 0.0, 0.0)
    assert solve_sizing_milp(hist((0, 0)), 1.0, 0.0).objective_mb == 0.0
    # zero exec times: over-allocation is free, so init covers the largest demand
    s = solve_sizing(hist((10, 0), (50, 0)), 1.0, 0.0)
    assert (s.init_mb, s.total_steps, s.waste) == (50.0, 0, 0.0)


def test_waste_curve_matches_the_definition() -> None:
    rng = np.random.default_rng(3)
    h = rng.uniform(0, 50, 40)
    w = rng.uniform(0, 2, 40)
    curve = waste_curve(h, w, 1.0, 60)
    for i in range(61):
        direct = float((np.maximum(i - h, 0) * w).sum() / h.sum())
        assert curve[i] == pytest.approx(direct, abs=1e-12)
    assert np.all(np.diff(curve) >= -1e-15)  # waste never falls as init grows


# -- properties ----------------------------------------------------------------------------------


def brute_force(history: list[Demand], **kw: float) -> Sizing:
    """Every (init, step) with init <= init_max and step <= d_max, scored by Problem.sizing."""
    p = Problem.build(
        history,
        kw.get("cost_factor", 1.0),
        kw.get("waste_threshold", 0.1),
        kw.get("granularity_mb", 1.0),
        kw.get("step_cost_mb", 0.0),
    )
    best: Sizing | None = None
    for i in range(p.init_max + 1):
        for s in range(1, max(1, p.d_max) + 1):
            cand = p.sizing(i, s)
            if better(cand, best):
                best = cand
    assert best is not None
    return best


demands = st.one_of(
    st.integers(0, 40).map(float), st.floats(0, 40, allow_nan=False, allow_infinity=False)
)
times = st.one_of(st.just(1.0), st.floats(0, 5, allow_nan=False, allow_infinity=False))
histories = st.lists(st.tuples(demands, times), min_size=1, max_size=10).map(
    lambda xs: [Demand(h, t) for h, t in xs]
)
params = st.fixed_dictionaries(
    {
        "cost_factor": st.sampled_from([0.0, 0.2, 0.5, 1.0, 1.5, 3.0]),
        "waste_threshold": st.sampled_from([0.0, 0.01, 0.05, 0.2, 1.0, 10.0]),
        "granularity_mb": st.sampled_from([0.5, 1.0, 2.0, 3.0]),
        "step_cost_mb": st.sampled_from([0.0, 0.0, 1.0, 4.0, 25.0]),
    }
)


def check_constraints(history: list[Demand], s: Sizing, kw: dict[str, float]) -> None:
    """Every constraint of the program, checked from the answer alone (package doc)."""
    g = kw["granularity_mb"]
    assert s.init_mb / g == pytest.approx(round(s.init_mb / g))
    assert s.step_mb / g == pytest.approx(round(s.step_mb / g)) and s.step_mb >= g
    assert s.waste <= kw["waste_threshold"] + WASTE_TOL
    # every demand covered with the fewest steps, counted the way the run time grows
    total = 0
    for d in history:
        need = math.ceil(d.demand_mb / g - 1e-9) * g  # the demand in whole units
        if need > s.init_mb:
            grown = grow_limit(s.init_mb, need, s.init_mb, s.step_mb, math.inf)
            assert grown.limit_mb is not None and grown.limit_mb >= need
            assert grown.limit_mb - s.step_mb < need  # one step fewer would not cover it
            total += grown.steps
    assert total == s.total_steps


@settings(max_examples=300, deadline=None)
@given(histories, params)
def test_exact_equals_brute_force(history: list[Demand], kw: dict[str, float]) -> None:
    s = solve_sizing(history, **kw)
    assert s == brute_force(history, **kw)  # the same optimum and the same tie-break
    check_constraints(history, s, kw)


def _clear_of_threshold(history: list[Demand], kw: dict[str, float]) -> bool:
    """No init's waste lies within 1e-6 of the threshold: HiGHS's feasibility tolerance (1e-7)
    and ``WASTE_TOL`` (1e-9) could then disagree about it."""
    p = Problem.build(
        history,
        kw["cost_factor"],
        kw["waste_threshold"],
        kw["granularity_mb"],
        kw["step_cost_mb"],
    )
    curve = waste_curve(p.demand_mb, p.weight, p.granularity_mb, p.d_max)
    return bool(np.all(np.abs(curve - kw["waste_threshold"]) > 1e-6))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories, params)
def test_exact_and_milp_reach_the_same_optimum(history: list[Demand], kw: dict[str, float]) -> None:
    assume(_clear_of_threshold(history, kw))
    exact = solve_sizing(history, **kw)
    ref = solve_sizing_milp(history, **kw)
    assert ref.objective_mb == pytest.approx(exact.objective_mb, rel=1e-9, abs=1e-9)
    check_constraints(history, exact, kw)
    check_constraints(history, ref, kw)


@settings(max_examples=100, deadline=None)
@given(histories, params, st.sampled_from([0.0, 0.05, 0.3]), st.sampled_from([0.0, 2.0, 20.0]))
def test_parametric_monotonicity(
    history: list[Demand], kw: dict[str, float], more_waste: float, more_step_cost: float
) -> None:
    base = solve_sizing(history, **kw)
    # a looser threshold only adds feasible inits: the optimum cannot get worse
    looser = solve_sizing(history, **{**kw, "waste_threshold": kw["waste_threshold"] + more_waste})
    assert looser.objective_mb <= base.objective_mb + 1e-9 * max(1.0, base.objective_mb)
    # a dearer step: the optimum cannot get cheaper, nor take more steps (f = A + p·F is
    # linear in p, so the minimiser's F does not grow with p)
    dearer = solve_sizing(history, **{**kw, "step_cost_mb": kw["step_cost_mb"] + more_step_cost})
    assert dearer.objective_mb >= base.objective_mb - 1e-9 * max(1.0, base.objective_mb)
    assert dearer.total_steps <= base.total_steps


@settings(max_examples=100, deadline=None)
@given(histories, params, st.floats(0, 60, allow_nan=False))
def test_grow_and_shrink_with_a_solved_sizing(
    history: list[Demand], kw: dict[str, float], need: float
) -> None:
    """The run-time rule on the solver's numbers: a grow from init covers any need up to max,
    in steps of ``step``, never past max; an idle instance returns to init."""
    s = solve_sizing(history, **kw)
    cap = max(s.max_demand_mb, s.init_mb)
    grown = grow_limit(s.init_mb, need, s.init_mb, s.step_mb, cap)
    if need > cap + 1e-9:
        assert grown.limit_mb is None  # over max: refused, the request fails
    elif need > s.init_mb + 1e-9:
        assert grown.limit_mb is not None
        assert need - 1e-9 <= grown.limit_mb <= cap
        assert grown.steps == math.ceil((grown.limit_mb - s.init_mb) / s.step_mb - 1e-9)
    assert idle_limit(0.0, s.init_mb, s.step_mb, cap) == s.init_mb


def test_realistic_history_is_sized_fast_enough_for_the_controller() -> None:
    """2,000 peaks spread over 1,200..1,700 MB (the live controller's bound): the answer obeys
    the constraints, init lies within one step below the waste bound (c·#{h > init} >= 1:
    raising init by a whole step never hurts), and the literal objective takes the
    smallest step while a step cost makes it larger (package doc, item 4)."""
    rng = np.random.default_rng(0)
    peaks = rng.uniform(1200, 1700, 2000)
    history = [
        Demand(float(h), float(t)) for h, t in zip(peaks, rng.uniform(0.1, 2, 2000), strict=True)
    ]
    kw = {"cost_factor": 1.0, "waste_threshold": 0.05, "granularity_mb": 1.0}
    literal = solve_sizing(history, **kw, step_cost_mb=0.0)
    priced = solve_sizing(history, **kw, step_cost_mb=32.0)
    p = Problem.build(history, 1.0, 0.05, 1.0, 0.0)
    for s, cost in ((literal, 0.0), (priced, 32.0)):
        check_constraints(history, s, {**kw, "step_cost_mb": cost})
        assert p.init_max - s.step_mb < s.init_mb <= p.init_max  # 1-MB units: units = MB
    assert literal.step_mb == 1.0
    assert priced.step_mb > 8.0 and priced.expected_steps < literal.expected_steps


# -- the fast paths of the exact solver: windows opened by a bound, sort-free waste curve --------


def brute_force_grid(history: list[Demand], **kw: float) -> Sizing:
    """Every (init, step) with init <= init_max and step <= d_max at once (numpy), preferred as
    ``problem.better`` prefers: least objective within ``TIE_REL``, then fewest steps, smallest
    init, smallest step. For histories too long for ``brute_force``'s Python loop."""
    p = Problem.build(
        history,
        kw.get("cost_factor", 1.0),
        kw.get("waste_threshold", 0.1),
        kw.get("granularity_mb", 1.0),
        kw.get("step_cost_mb", 0.0),
    )
    g = p.granularity_mb
    inits = np.arange(p.init_max + 1)[:, None, None]
    steps = np.arange(1, max(1, p.d_max) + 1)[None, :, None]
    r = p.units[None, None, :] - inits
    total = np.where(r > 0, (r + steps - 1) // steps, 0).sum(axis=2)
    f = inits[:, :, 0] * g + (p.cost_factor * g * steps[:, :, 0] + p.step_cost_mb) * total
    fmin = float(f.min())
    ii, ss = np.nonzero(f <= fmin + TIE_REL * max(1.0, abs(fmin)))
    k = np.lexsort((ss, ii, total[ii, ss]))[0]
    return p.sizing(int(ii[k]), int(ss[k]) + 1)


long_histories = (
    st.integers(20, 120)
    .flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(0, 150), min_size=n, max_size=n),
            st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=n, max_size=n),
        )
    )
    .map(lambda ht: [Demand(float(h), t) for h, t in zip(*ht, strict=True)])
)
"""Many demands over a wide range: ``c·N(init_max) >= 1`` (the windows of case 2) in most draws."""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(long_histories, params)
def test_exact_equals_brute_force_on_long_histories(
    history: list[Demand], kw: dict[str, float]
) -> None:
    s = solve_sizing(history, **kw)
    assert s == brute_force_grid(history, **kw)
    check_constraints(history, s, kw)


@settings(max_examples=100, deadline=None)
@given(st.one_of(histories, long_histories), params)
def test_history_columns_give_the_same_answer(history: list[Demand], kw: dict[str, float]) -> None:
    cols = History(
        np.array([d.demand_mb for d in history]), np.array([d.exec_time_s for d in history])
    )
    assert len(cols) == len(history)
    assert solve_sizing(cols, **kw) == solve_sizing(history, **kw)


def test_history_columns_are_checked() -> None:
    with pytest.raises(SizingError, match="one length"):
        solve_sizing(History(np.ones(3), np.ones(2)), 1.0, 0.1)
    with pytest.raises(SizingError, match="empty"):
        solve_sizing(History(np.ones(0), np.ones(0)), 1.0, 0.1)
    with pytest.raises(SizingError, match="demand_mb"):
        solve_sizing(History(np.array([1.0, math.inf]), np.ones(2)), 1.0, 0.1)
    with pytest.raises(SizingError, match="exec_time_s"):
        solve_sizing(History(np.ones(2), np.array([1.0, math.nan])), 1.0, 0.1)


def sorted_waste_curve(h: np.ndarray, w: np.ndarray, unit_mb: float, d_max: int) -> np.ndarray:
    """The definition by sorting: demands strictly below ``x = v·unit_mb`` by ``searchsorted``."""
    order = np.argsort(h, kind="stable")
    hs, ws = h[order], w[order]
    cum_w = np.concatenate(([0.0], np.cumsum(ws)))
    cum_hw = np.concatenate(([0.0], np.cumsum(hs * ws)))
    x = np.arange(d_max + 1, dtype=np.float64) * unit_mb
    below = np.searchsorted(hs, x, side="left")
    num = np.maximum(x * cum_w[below] - cum_hw[below], 0.0)
    return num / h.sum() if h.sum() > 0 else np.where(num > 0, np.inf, 0.0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.integers(0, 60).map(float),  # on a unit boundary for granularity 1
                st.integers(0, 400).map(lambda k: k * 0.1),  # 0.1·k: float noise at boundaries
                st.floats(0, 60, allow_nan=False, allow_infinity=False),
            ),
            st.floats(0, 3, allow_nan=False, allow_infinity=False),
        ),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from([0.1, 0.3, 0.5, 1.0, 3.0, 7.0]),
)
def test_waste_curve_buckets_equal_the_sorted_definition(
    pairs: list[tuple[float, float]], unit_mb: float
) -> None:
    """The buckets ``b_h`` put every demand on the same side of every ``x_v`` as the sort."""
    h = np.array([a for a, _ in pairs])
    w = np.array([b for _, b in pairs])
    p = Problem.build([Demand(a, b) for a, b in pairs], 1.0, 0.1, unit_mb, 0.0)
    fast = waste_curve(h, w, unit_mb, p.d_max)
    ref = sorted_waste_curve(h, w, unit_mb, p.d_max)
    assert np.array_equal(np.isinf(fast), np.isinf(ref))
    finite = ~np.isinf(ref)
    assert np.allclose(fast[finite], ref[finite], rtol=1e-12, atol=1e-15)
    assert np.array_equal(fast == 0, ref == 0)  # the same inits over-allocate nothing


@settings(max_examples=200, deadline=None)
@given(st.one_of(histories, long_histories), params, st.integers(0, 160), st.integers(1, 160))
def test_total_steps_counts_every_demand(
    history: list[Demand], kw: dict[str, float], init: int, step: int
) -> None:
    """``Problem.total_steps`` (strided sum of ``at_least``) against ``ceil`` per demand."""
    p = Problem.build(
        history,
        kw["cost_factor"],
        kw["waste_threshold"],
        kw["granularity_mb"],
        kw["step_cost_mb"],
    )
    direct = sum(max(0, -(-(int(d) - init) // step)) for d in p.units)
    assert p.total_steps(init, step) == direct
