"""gshare's configuration space for ESG (``gshare.workflows.shares``) and the ESG search over it:
the same policy code as ESG's (batch, vCPU, vGPU) space, fed (batch, quota) options."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gshare.policy.workflow.dispatch import DispatchRequest, InvokerState
from gshare.policy.workflow.esg import make_policy
from gshare.policy.workflow.schedulers import StageContext
from gshare.profiles import ProfilePoint, ProfileTable
from gshare.workflows.shares import (
    QUOTA_UNITS,
    ShareError,
    ShareFunction,
    SharePerf,
    quota_pct_of,
    share_config,
)
from gshare.workflows.spec import parse_workflow


def fluid(fn: str, busy_ms: float, sm: float = 50.0) -> ProfileTable:
    # latency = batch x busy x 100 / quota: batching does not help, a smaller quota is slower
    return ProfileTable(
        ProfilePoint(fn, sm, q, b, b * busy_ms * 100.0 / q)
        for b in (1, 2, 4)
        for q in (25.0, 50.0, 100.0)
    )


def perf() -> SharePerf:
    fns = [
        ShareFunction("a", "a", 50.0, (1, 2, 4), (25.0, 50.0, 100.0)),
        ShareFunction("b", "b", 50.0, (1, 2, 4), (25.0, 50.0, 100.0)),
    ]
    return SharePerf(fns, {"a": fluid("a", 10.0), "b": fluid("b", 20.0)})


def test_quota_converts_to_units_and_back() -> None:
    for q in (5.0, 25.0, 50.0, 100.0):
        c = share_config(2, q)
        assert c.batch == 2 and c.vcpus == 1 and quota_pct_of(c) == q
    assert share_config(1, 100.0).vgpus == QUOTA_UNITS
    for bad in (0.0, 12.5, 105.0):
        with pytest.raises(ShareError, match="quota_pct"):
            share_config(1, bad)


def test_cost_is_share_area_times_time() -> None:
    p = perf()
    # a at 25 %, batch 1: 10 x 100 / 25 = 40 ms; area 0.5 x 0.25 = 0.125 of a device
    c = share_config(1, 25.0)
    assert p.exec_ms("a", c) == pytest.approx(40.0)
    expect = 0.125 * 40.0 / 3.6e6 * p.usd_per_device_hour
    assert p.cost_usd("a", c) == pytest.approx(expect)
    # a task of 4 jobs costs 4 per-request costs
    c4 = share_config(4, 50.0)
    assert p.task_cost_usd("a", c4, p.exec_ms("a", c4)) == pytest.approx(4 * p.cost_usd("a", c4))
    # under the fluid model the per-request cost is the same at every quota (area x time const.)
    costs = {p.cost_usd("a", share_config(1, q)) for q in (25.0, 50.0, 100.0)}
    assert max(costs) == pytest.approx(min(costs))


def test_options_are_sorted_by_time_and_cover_the_space() -> None:
    opts = perf().options("b")
    assert len(opts) == 3 * 3
    times = [o.time_ms for o in opts]
    assert times == sorted(times)


def test_noise_draws_one_normal() -> None:
    p = perf()
    r1, r2 = np.random.default_rng(1), np.random.default_rng(1)
    x = p.sample_exec_ms("a", share_config(1, 100.0), r1)
    r2.standard_normal()
    assert r1.bit_generator.state == r2.bit_generator.state and x > 0


def test_an_unprofiled_function_is_a_clear_error() -> None:
    with pytest.raises(LookupError, match="no profile of 'c'"):
        SharePerf([ShareFunction("c", "c", 50.0)], {"a": fluid("a", 1.0)})


def _ctx(p: SharePerf, slo_ms: float) -> StageContext:
    wf = parse_workflow(
        {
            "name": "ab",
            "slo_ms": slo_ms,
            "stages": [
                {"name": "a", "function": "a"},
                {"name": "b", "function": "b", "after": ["a"]},
            ],
        },
        known_functions=["a", "b"],
    )
    return StageContext(
        application="ab",
        workflow=wf,
        stage="a",
        done_stages=frozenset(),
        elapsed_ms=0.0,
        waiting_ms=0.0,
        queue_len=1,
        options={fn: p.options(fn) for fn in ("a", "b")},
        request_plan=None,
        now_ms=0.0,
    )


@pytest.mark.parametrize(
    ("slo_ms", "quota"),
    [
        # fastest path: a 10 ms + b 20 ms at 100 % = 30 ms; with a 31 ms SLO only 100 % fits
        (31.0, 100.0),
        # a roomy SLO: every quota fits; all cost the same per request (fluid), and ESG's
        # tie-break is the faster option, so the answer must at least meet the split budget
        (10_000.0, None),
    ],
)
def test_esg_searches_the_share_space(slo_ms: float, quota: float | None) -> None:
    p = perf()
    ctx = _ctx(p, slo_ms)
    policy = make_policy("esg", perf=p)
    policy.prepare([("ab", ctx.workflow)], ctx.options, 0)
    plan = policy.plan_stage(ctx)
    first = plan.candidates[0]
    assert first.batch == 1  # one job queued: no larger batch is searched
    if quota is not None:
        assert quota_pct_of(first) == quota
    assert p.exec_ms("a", first) <= slo_ms
    # dispatch: a device with an idle instance and the free quota units
    inv = [InvokerState(0, 1, QUOTA_UNITS, {"a": 1}, 1, QUOTA_UNITS)]
    d = policy.select_invoker(DispatchRequest("a", plan.candidates, (0,), True), inv, ctx)
    assert getattr(d, "invoker_id", None) == 0
    # no idle instance: nowhere to run
    busy = [InvokerState(0, 0, QUOTA_UNITS, {}, 1, QUOTA_UNITS)]
    d2 = make_policy("esg", perf=p).select_invoker(
        DispatchRequest("a", plan.candidates, (0,), True), busy, ctx
    )
    assert not hasattr(d2, "invoker_id")


def test_esg_prefers_the_cheaper_share_when_batching_pays() -> None:
    # a profile where batching amortises: batch b takes (1 + 0.25 (b - 1)) x base
    rows = [
        ProfilePoint(fn, 50.0, q, b, (1 + 0.25 * (b - 1)) * base * 100.0 / q)
        for fn, base in (("a", 10.0), ("b", 20.0))
        for b in (1, 2, 4)
        for q in (25.0, 50.0, 100.0)
    ]
    t = ProfileTable(rows)
    p = SharePerf(
        [ShareFunction(f, f, 50.0, (1, 2, 4), (25.0, 50.0, 100.0)) for f in ("a", "b")], t
    )
    ctx = _ctx(p, 10_000.0)
    ctx = StageContext(**{**{f: getattr(ctx, f) for f in ctx.__dataclass_fields__}, "queue_len": 4})
    policy = make_policy("esg", perf=p)
    policy.prepare([("ab", ctx.workflow)], ctx.options, 0)
    first = policy.plan_stage(ctx).candidates[0]
    cheapest = min((o for o in p.options("a") if o.config.batch <= 4), key=lambda o: o.cost_usd)
    assert first.batch == 4
    assert math.isclose(p.cost_usd("a", first), cheapest.cost_usd)


def test_anl_over_spaces_without_a_common_configuration_uses_the_shared_batches() -> None:
    from gshare.policy.workflow.replan import anl_from_options

    # a offers only quota 50 %, b only 25 %: no common config; batch 1 and 2 are shared
    p = SharePerf(
        [
            ShareFunction("a", "a", 50.0, (1, 2), (50.0,)),
            ShareFunction("b", "b", 50.0, (1, 2), (25.0,)),
        ],
        {"a": fluid("a", 10.0), "b": fluid("b", 20.0)},
    )
    labels = anl_from_options({"a": p.options("a"), "b": p.options("b")})
    # batch b: a = b x 20 ms, b = b x 80 ms -> a's share is 20 / 100 at every batch
    assert labels["a"] == pytest.approx(0.2) and labels["b"] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="no batch"):
        anl_from_options(
            {
                "a": [o for o in p.options("a") if o.config.batch == 1],
                "b": [o for o in p.options("b") if o.config.batch == 2],
            }
        )
