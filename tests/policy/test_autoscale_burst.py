"""policy.autoscale.BurstAutoscaler (``gshare-burst``, gshare's default): the demand it sizes
for (predicted rate, peak hold, backlog), its decisions, its bounds, and — through
``policy.control.control_step`` with an injected clock — how long it holds capacity after a
burst compared with Algorithm 1. Hand-built configs use round numbers; the arithmetic is in
the comments."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gshare.policy.autoscale import (
    AUTOSCALERS,
    DEFAULT_AUTOSCALER,
    AutoscaleError,
    Autoscaler,
    BurstAutoscaler,
    DemandSource,
    FastHeuristic,
    Instance,
    LoadSignals,
    ScaleConfig,
    ScaleContext,
    ScaleDecision,
    burst_demand,
    get_autoscaler,
)
from gshare.policy.control import ControlParams, FunctionObservation, control_step
from gshare.policy.rate import RatePredictor

# RPR = T / (S · Q) with S, Q as fractions.
THIN = ScaleConfig(sm_pct=12, quota_pct=40, batch=1, throughput_rps=40, latency_ms=25)
# THIN: 40 / 0.048 = 833 (the most efficient)
MID = ScaleConfig(sm_pct=24, quota_pct=40, batch=2, throughput_rps=60, latency_ms=33)
# MID: 60 / 0.096 = 625
FULL = ScaleConfig(sm_pct=100, quota_pct=100, batch=8, throughput_rps=400, latency_ms=20)
# FULL: 400 / 1 = 400
CONFIGS = (THIN, MID, FULL)


def inst(iid: str, cfg: ScaleConfig, fn: str = "f") -> Instance:
    return Instance(instance_id=iid, function=fn, config=cfg)


def sig(
    *, last: float = 0.0, peak: float = 0.0, outstanding: int = 0, period: float = 1.0
) -> LoadSignals:
    return LoadSignals(period_s=period, last_rps=last, peak_rps=peak, outstanding=outstanding)


def capacity(running: list[Instance], d: ScaleDecision) -> float:
    gone = set(d.remove)
    return sum(i.config.throughput_rps for i in running if i.instance_id not in gone) + sum(
        c.throughput_rps for c in d.add
    )


# -- the demand --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("predicted", "signals", "running", "headroom", "demand", "source", "backlog"),
    [
        # no signals: the predicted rate alone
        (30.0, None, [], 2.0, 30.0, DemandSource.RATE, 0),
        # peak 50 · h 2 = 100 > R 30, > last 10 · 2 = 20
        (30.0, sig(last=10, peak=50), [], 2.0, 100.0, DemandSource.PEAK, 0),
        # R 120 (the controller's own burst estimate) > 2 · 50
        (120.0, sig(last=10, peak=50), [], 2.0, 120.0, DemandSource.RATE, 0),
        # backlog: 30 outstanding − Σ batch (1 + 2) = 27 queued, drained in 1 s: 1.5 · 40 + 27
        (
            10.0,
            sig(last=40, peak=40, outstanding=30),
            [inst("a", THIN), inst("b", MID)],
            1.5,
            87.0,
            DemandSource.BACKLOG,
            27,
        ),
        # the same backlog over a 0.5 s period: 1.5 · 40 + 27 / 0.5 = 114
        (
            10.0,
            sig(last=40, peak=40, outstanding=30, period=0.5),
            [inst("a", THIN), inst("b", MID)],
            1.5,
            114.0,
            DemandSource.BACKLOG,
            27,
        ),
        # in service only (outstanding ≤ Σ batch): no backlog; peak wins 1.5 · 40 = 60
        (
            10.0,
            sig(last=40, peak=40, outstanding=3),
            [inst("a", THIN), inst("b", MID)],
            1.5,
            60.0,
            DemandSource.PEAK,
            0,
        ),
    ],
)
def test_burst_demand(
    predicted: float,
    signals: LoadSignals | None,
    running: list[Instance],
    headroom: float,
    demand: float,
    source: DemandSource,
    backlog: int,
) -> None:
    d = burst_demand(predicted, running, signals, headroom)
    assert d.demand_rps == pytest.approx(demand)
    assert d.source is source
    assert d.backlog == backlog


# -- decisions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("predicted", "signals", "running", "add", "remove"),
    [
        # cold function, demand 1.5 · 20 = 30 fits one config: the smallest sufficient, THIN
        (0.0, sig(last=20, peak=20), [], (THIN,), ()),
        # cold, demand 1.5 · 300 = 450 fits none: ⌈450 / 40⌉ = 12 copies of p_eff (THIN)
        (0.0, sig(last=300, peak=300), [], (THIN,) * 12, ()),
        # running MID (60), demand 1.5 · 100 = 150: gap 90 → ⌈90 / 40⌉ = 3 THIN, no thin residual
        # of another size (Algorithm 1 would add 2 THIN + p_ideal for r = 10: THIN too)
        (0.0, sig(last=100, peak=100), [inst("m", MID)], (THIN,) * 3, ()),
        # peak hold: last period idle but the window's peak 1.5 · 60 = 90 ≤ 100 held: steady
        (0.0, sig(last=0, peak=60), [inst("m", MID), inst("t", THIN)], (), ()),
        # the peak fell: demand 1.5 · 20 = 30; MID (least RPR) goes, THIN (40) covers 30
        (0.0, sig(last=0, peak=20), [inst("m", MID), inst("t", THIN)], (), ("m",)),
        # nothing left in the window: everything goes (no min_instances)
        (0.0, sig(), [inst("m", MID), inst("t", THIN)], (), ("m", "t")),
        # no signals: sized for R alone (cold: one p_ideal of T ≥ 50, MID)
        (50.0, None, [], (MID,), ()),
    ],
)
def test_decisions(
    predicted: float,
    signals: LoadSignals | None,
    running: list[Instance],
    add: tuple[ScaleConfig, ...],
    remove: tuple[str, ...],
) -> None:
    d = BurstAutoscaler(headroom=1.5)(
        ScaleContext("f", predicted, running, CONFIGS, signals=signals)
    )
    assert d.add == add
    assert d.remove == remove


def test_bounds() -> None:
    scale = BurstAutoscaler(headroom=1.0)
    # max_instances caps additions: demand 400 wants 10 THIN, room for 2
    d = scale(
        ScaleContext("f", 0.0, [inst("a", THIN)], CONFIGS, max_instances=3, signals=sig(peak=400))
    )
    assert d.add == (THIN, THIN)
    assert "max_instances=3" in d.reason
    # min_instances undoes removals first, then adds p_ideal for a cold function
    running = [inst("m", MID), inst("t", THIN)]
    d = scale(ScaleContext("f", 0.0, running, CONFIGS, min_instances=1, signals=sig()))
    assert d.remove == ("m",)
    d = scale(ScaleContext("f", 0.0, [], CONFIGS, min_instances=2, signals=sig(peak=10)))
    assert d.add == (THIN, THIN)  # one p_ideal (THIN for 10) and one more (p_eff = THIN)
    with pytest.raises(AutoscaleError, match="no candidate configs"):
        scale(ScaleContext("f", 0.0, [], (), signals=sig(peak=10)))
    with pytest.raises(AutoscaleError, match="headroom"):
        BurstAutoscaler(headroom=0.5)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"period_s": 0.0}, "period_s"),
        ({"last_rps": -1.0}, "last_rps"),
        ({"peak_rps": float("inf")}, "peak_rps"),
        ({"outstanding": -1}, "outstanding"),
    ],
)
def test_signals_validation(kw: dict[str, float], match: str) -> None:
    base = {"period_s": 1.0, "last_rps": 0.0, "peak_rps": 0.0, "outstanding": 0}
    with pytest.raises(AutoscaleError, match=match):
        LoadSignals(**{**base, **kw})  # type: ignore[arg-type]


def test_registry_and_default() -> None:
    assert DEFAULT_AUTOSCALER == "gshare-burst"
    burst = get_autoscaler("gshare-burst")
    assert isinstance(burst, BurstAutoscaler) and "gshare-burst" in AUTOSCALERS
    # one call signature for all: every registered autoscaler takes a ScaleContext (the burst
    # autoscaler reads its signals; Algorithm 1 and target-util size for the predicted rate)
    sig = LoadSignals(period_s=1.0, last_rps=50.0, peak_rps=80.0, outstanding=3)
    for name, scaler in AUTOSCALERS.items():
        with_signals = scaler(ScaleContext("f", 10.0, [], CONFIGS, min_instances=1, signals=sig))
        without = scaler(ScaleContext("f", 10.0, [], CONFIGS, min_instances=1))
        if name == "gshare-burst":
            assert sum(c.throughput_rps for c in with_signals.add) >= 80.0  # the peak, held
        else:
            assert with_signals == without, name


@settings(max_examples=150, deadline=None)
@given(
    counts=st.lists(st.integers(0, 4), min_size=3, max_size=3),
    peak=st.floats(0.0, 500.0),
    last=st.floats(0.0, 500.0),
    outstanding=st.integers(0, 200),
    predicted=st.floats(0.0, 500.0),
    seed=st.integers(0, 1000),
)
def test_properties(
    counts: list[int], peak: float, last: float, outstanding: int, predicted: float, seed: int
) -> None:
    running = [
        inst(f"{c.batch}-{k}", c) for c, n in zip(CONFIGS, counts, strict=True) for k in range(n)
    ]
    s = sig(last=last, peak=peak, outstanding=outstanding)
    scale = BurstAutoscaler(headroom=1.5)
    d = scale(ScaleContext("f", predicted, running, CONFIGS, signals=s))
    demand = burst_demand(predicted, running, s, 1.5).demand_rps
    # coverage: the fleet after the decision covers the demand
    assert capacity(running, d) >= demand - 1e-6
    # minimal scale-down: removing the next least-RPR instance would break coverage
    if d.remove:
        rest = sorted(
            (i for i in running if i.instance_id not in set(d.remove)),
            key=lambda i: (i.config.rpr, i.config.throughput_rps, i.instance_id),
        )
        if rest:
            assert capacity(rest, ScaleDecision("f", (), (rest[0].instance_id,), 0, "")) < (
                demand - 1e-9
            )
    # never both adds and removes; order of running and configs does not matter
    assert not (d.add and d.remove)
    shuffled = list(running)
    random.Random(seed).shuffle(shuffled)
    d2 = scale(ScaleContext("f", predicted, shuffled, tuple(reversed(CONFIGS)), signals=s))
    assert (d2.add, d2.remove) == (d.add, d.remove)


# -- through the reconcile step, with an injected clock ----------------------------------------

ONE = ScaleConfig(sm_pct=50, quota_pct=50, batch=1, throughput_rps=10, latency_ms=100)
"""One config of 10 rps: R maps to ⌈R / 10⌉ instances."""


def _replay(autoscaler: Autoscaler, arrivals: list[int], params: ControlParams) -> list[int]:
    """Instances after each 1 s step (clock t = 1, 2, ...) applying every decision."""
    state = params.fresh_state()
    running: list[Instance] = []
    counts = []
    next_id = 0
    for k, n in enumerate(arrivals, start=1):
        o = FunctionObservation(
            function="f",
            arrivals=n,
            interval_s=1.0,
            idle_since_s=None,
            outstanding=0,
            queued=0,
            running=tuple(running),
            configs=(ONE,),
        )
        dec, state = control_step(o, state, float(k), autoscaler, params)
        running = [i for i in running if i.instance_id not in set(dec.remove)]
        for c in dec.add:
            next_id += 1
            running.append(inst(f"i{next_id}", c))
        counts.append(len(running))
    return counts


@pytest.mark.parametrize(
    ("arrivals", "burst_counts", "algorithm1_counts"),
    [
        # a 1 s burst of 40, then idle. headroom 1.2 (controller), h = 1.5 (gshare-burst):
        # Algorithm 1: R = max(EWMA, max of 3) · 1.2 → 48 → 5, then EWMA 20/10/5 but the window
        # keeps 40 for 3 steps: 5, 5, 5, then EWMA 2.5 · 1.2 = 3 → 1 instance, 1.5 → 1.
        # gshare-burst: 1.5 · peak 40 = 60 → 6, held for the 5-period hold window; then the
        # controller's R (EWMA 1.25 · 1.2 = 1.5) → 1.
        ([40, 0, 0, 0, 0, 0], [6, 6, 6, 6, 6, 1], [5, 5, 5, 1, 1, 1]),
        # steady 20 rps: Algorithm 1 ⌈24 / 10⌉ = 3; gshare-burst ⌈1.5 · 20 / 10⌉ = 3
        ([20, 20, 20, 20], [3, 3, 3, 3], [3, 3, 3, 3]),
        # a burst building up: the hold follows the rise at once
        ([10, 30, 60, 0], [2, 5, 9, 9], [2, 4, 8, 8]),
    ],
)
def test_hold_vs_algorithm1(
    arrivals: list[int], burst_counts: list[int], algorithm1_counts: list[int]
) -> None:
    params = ControlParams(hold_window=5)
    assert _replay(BurstAutoscaler(headroom=1.5), arrivals, params) == burst_counts
    assert _replay(FastHeuristic(), arrivals, params) == algorithm1_counts


def test_predictor_hold_signals() -> None:
    p = RatePredictor.fresh(window=2, hold_window=3)
    assert (p.peak_rps(), p.last_rps()) == (0.0, 0.0)
    p = p.observed(30, 1.0).observed(0, 1.0).observed(0, 1.0)
    assert (p.peak_rps(), p.last_rps()) == (30.0, 0.0)  # the 2-window forgot it, the hold not
    assert p.predicted_rps() == pytest.approx(30 * 0.25 * 1.2)  # EWMA 30 → 15 → 7.5 · 1.2
    p = p.observed(0, 1.0)
    assert p.peak_rps() == 0.0
    assert p.reset().hold.k == 3
