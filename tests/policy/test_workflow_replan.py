"""plan_remaining: SLO split + ESG_1Q over the remaining stages, re-run before every dispatch."""

from __future__ import annotations

import pytest

from gshare.policy.workflow.astar import Infeasible, Plans, brute_force
from gshare.policy.workflow.replan import anl_from_options, plan_remaining
from gshare.workflows.catalogue import application
from gshare.workflows.config import ConfigGrid, ConfigOption, FunctionConfig
from gshare.workflows.perf import PerfModel
from gshare.workflows.spec import WorkflowSpec, parse_workflow

FAST = FunctionConfig(batch=1, vcpus=8, vgpus=1)
SLOW = FunctionConfig(batch=1, vcpus=1, vgpus=1)
BATCH4 = FunctionConfig(batch=4, vcpus=1, vgpus=1)


def chain(slo_ms: float, n: int = 3) -> WorkflowSpec:
    stages = [
        {"name": f"s{i}", "function": f"f{i}", "after": [f"s{i - 1}"] if i else []}
        for i in range(n)
    ]
    return parse_workflow(
        {"name": "w", "slo_ms": slo_ms, "stages": stages},
        known_functions=[f"f{i}" for i in range(n)],
    )


# every function: fast (10 ms, $3 per request) or slow (30 ms, $1); equal times per config, so
# each stage's ANL is 1/3 and a 3-stage group gets quota 1
OPTS = {f"f{i}": [ConfigOption(FAST, 10.0, 3.0), ConfigOption(SLOW, 30.0, 1.0)] for i in range(3)}


def test_first_plan_uses_the_whole_slo() -> None:
    rp = plan_remaining(chain(100.0), [], 0.0, 0.0, options=OPTS)
    assert rp.budget_ms == 100.0
    assert rp.split is not None and rp.split.structure == "[s0 s1 s2]"
    gp = rp.group_plan("s0")
    assert gp.target_ms == pytest.approx(100.0)
    # all slow: 90 ms <= 100, $3 -- the cheapest
    assert isinstance(gp.result, Plans) and gp.result.best.configs == (SLOW, SLOW, SLOW)
    assert rp.config("s0") == SLOW


def test_replanning_absorbs_a_late_stage() -> None:
    # s0 is done but took 60 ms (e.g. a cold start); the oldest job of s1 waited 0 ms.
    # Budget 100 - 60 = 40 ms for s1, s2: slow+slow = 60 ms is too slow; fast+slow and slow+fast
    # both take 40 ms for $4; the tie goes to the faster option first in time order -> s1 fast
    rp = plan_remaining(chain(100.0), ["s0"], 60.0, 0.0, options=OPTS)
    assert rp.budget_ms == 40.0
    assert rp.split is not None and rp.split.structure == "[s1 s2]"
    assert rp.config("s1") == FAST
    best = rp.group_plan("s1").result
    assert isinstance(best, Plans) and (best.best.time_ms, best.best.cost_usd) == (40.0, 4.0)


def test_waiting_time_counts_against_the_budget_and_infeasible_gives_no_candidates() -> None:
    # 100 - 70 - 15 = 15 ms left; the fastest remaining path takes 20 ms
    rp = plan_remaining(chain(100.0), ["s0"], 70.0, 15.0, options=OPTS)
    assert rp.budget_ms == 15.0
    assert isinstance(rp.group_plan("s1").result, Infeasible)
    assert rp.candidates("s1") == () and rp.config("s1") is None


def test_queue_len_limits_the_batch_of_the_current_stage_only() -> None:
    opts = {f: [*o, ConfigOption(BATCH4, 31.0, 0.5)] for f, o in OPTS.items()}
    # budget 200: unconstrained, every stage would take BATCH4 ($0.5)
    free = plan_remaining(chain(200.0), [], 0.0, 0.0, options=opts)
    assert free.config("s0") == BATCH4
    # only 2 jobs queued at s0: s0 cannot batch 4, later stages still may
    rp = plan_remaining(chain(200.0), [], 0.0, 0.0, options=opts, for_stages=["s0"], queue_len=2)
    res = rp.group_plan("s0").result
    assert isinstance(res, Plans)
    assert res.best.configs == (SLOW, BATCH4, BATCH4)
    assert all(c.batch <= 2 for c in rp.candidates("s0"))


def test_for_stages_plans_only_their_groups() -> None:
    # g = 1: three groups; only s1's is searched
    rp = plan_remaining(
        chain(90.0), [], 0.0, 0.0, options=OPTS, for_stages=["s1"], max_group_size=1
    )
    assert [gp.group.stages for gp in rp.groups] == [("s1",)]
    assert rp.groups[0].target_ms == pytest.approx(30.0)  # 90 x 1/3
    with pytest.raises(KeyError, match="was not planned"):
        rp.group_plan("s0")


def test_input_errors_are_named() -> None:
    with pytest.raises(ValueError, match=r"stage 's1' is done but its predecessor\(s\) s0"):
        plan_remaining(chain(100.0), ["s1"], 0.0, 0.0, options=OPTS)
    with pytest.raises(ValueError, match="not among the remaining stages"):
        plan_remaining(chain(100.0), ["s0"], 0.0, 0.0, options=OPTS, for_stages=["s0"])
    with pytest.raises(KeyError, match="no options for function 'f2'"):
        plan_remaining(chain(100.0), [], 0.0, 0.0, options={"f0": OPTS["f0"], "f1": OPTS["f1"]})
    done = plan_remaining(chain(100.0), ["s0", "s1", "s2"], 50.0, 0.0, options=OPTS)
    assert done.split is None and done.groups == ()


def test_anl_from_options_uses_common_configs() -> None:
    # f: FAST 10, SLOW 30; g: FAST 30, SLOW 10 -> ANL(f) = (10/40 + 30/40) / 2 = 0.5
    a = anl_from_options(
        {
            "f": [ConfigOption(FAST, 10, 1), ConfigOption(SLOW, 30, 1), ConfigOption(BATCH4, 5, 1)],
            "g": [ConfigOption(FAST, 30, 1), ConfigOption(SLOW, 10, 1)],
        }
    )
    assert a == pytest.approx({"f": 0.5, "g": 0.5})


# -- with the catalogue and the performance model ----------------------------------------------

GRID = ConfigGrid(batches=(1, 2, 4), vcpus=(1, 2, 4, 8, 16), vgpus=(1, 2))  # 30 configs


def test_expanded_image_classification_is_split_and_planned() -> None:
    pm = PerfModel.default()
    wf = application("expanded-image-classification", "strict")
    opts = {f: pm.options(f, GRID) for f in pm.functions}
    rp = plan_remaining(wf, [], 0.0, 0.0, options=opts)
    assert rp.split is not None
    assert rp.split.structure == (
        "[deblur super_resolution background_removal] [segmentation classification]"
    )
    assert sum(g.quota for g in rp.split.groups) == pytest.approx(1.0)
    for gp in rp.groups:
        res = gp.result
        assert isinstance(res, Plans) and res.best.time_ms <= gp.target_ms
        lists = [opts[wf.function_of(s)] for s in gp.group.stages]
        bf = brute_force(lists, gp.target_ms)
        assert isinstance(bf, Plans) and res.best.cost_usd == pytest.approx(bf.best.cost_usd)
    fast = plan_remaining(wf, [], 0.0, 0.0, options=opts, pareto=True)
    for a, b in zip(rp.groups, fast.groups, strict=True):
        assert a.result.best.cost_usd == pytest.approx(b.result.best.cost_usd)  # type: ignore[union-attr]


def test_real_model_speeds_up_the_next_stage_after_a_delay() -> None:
    pm = PerfModel.default()
    wf = application("image-classification", "moderate")  # SLO 526 ms
    opts = {f: pm.options(f, GRID) for f in pm.functions}
    on_time = plan_remaining(wf, ["super_resolution"], 60.0, 0.0, options=opts)
    late = plan_remaining(wf, ["super_resolution"], 200.0, 0.0, options=opts)
    t_on = pm.exec_ms("segmentation", on_time.config("segmentation"))  # type: ignore[arg-type]
    t_late = pm.exec_ms("segmentation", late.config("segmentation"))  # type: ignore[arg-type]
    assert t_late < t_on
    assert late.group_plan("segmentation").result.best.cost_usd > (  # type: ignore[union-attr]
        on_time.group_plan("segmentation").result.best.cost_usd  # type: ignore[union-attr]
    )
