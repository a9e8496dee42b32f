"""ESG_Dispatch: invoker preference order, candidate order, and the recheck list."""

from __future__ import annotations

import pytest

from gshare.policy.workflow.dispatch import (
    Dispatch,
    DispatchRequest,
    IdleInstance,
    InvokerState,
    NoInvoker,
    RecheckList,
    dispatch_with_recheck,
    esg_dispatch,
    home_invoker,
    pick_instance,
    stage_request,
)
from gshare.policy.workflow.queues import AfwKey
from gshare.workflows.config import MIN_CONFIG, FunctionConfig

BIG = FunctionConfig(batch=4, vcpus=8, vgpus=2)
SMALL = FunctionConfig(batch=2, vcpus=2, vgpus=1)


def inv(i: int, cpu: int, gpu: int, warm: dict[str, int] | None = None) -> InvokerState:
    return InvokerState(i, cpu, gpu, warm or {})


def test_home_invoker_first_when_it_fits() -> None:
    invs = [inv(0, 16, 7), inv(1, 8, 2), inv(2, 16, 7, {"deblur": 1})]
    d = esg_dispatch(DispatchRequest("deblur", (BIG,), preferred=(1,), first_stage=True), invs)
    # invoker 1 has exactly 8 vCPUs and 2 vGPUs: BIG fits there, although 0 and 2 are emptier
    assert d == Dispatch(1, BIG, "home", False, 0)


def test_predecessor_invoker_for_later_stages() -> None:
    invs = [inv(0, 16, 7), inv(1, 8, 2, {"deblur": 1})]
    d = esg_dispatch(DispatchRequest("deblur", (BIG,), preferred=(1,), first_stage=False), invs)
    assert d == Dispatch(1, BIG, "predecessor", True, 0)


def test_warm_invoker_before_a_roomier_cold_one() -> None:
    # preferred invoker 0 is too small for BIG (4 vCPUs); invoker 1 is warm with room;
    # invoker 2 is cold and emptier; warm wins
    invs = [inv(0, 4, 7), inv(1, 10, 3, {"deblur": 2}), inv(2, 16, 7)]
    d = esg_dispatch(DispatchRequest("deblur", (BIG,), preferred=(0,)), invs)
    assert isinstance(d, Dispatch) and (d.invoker_id, d.via, d.warm) == (1, "warm", True)


def test_warm_for_another_function_does_not_count() -> None:
    invs = [inv(0, 4, 7), inv(1, 10, 3, {"segmentation": 2}), inv(2, 16, 7)]
    d = esg_dispatch(DispatchRequest("deblur", (BIG,), preferred=(0,)), invs)
    # no warm deblur container: the cold invoker with the most free resources, invoker 2
    # (free share 16/16 + 7/7 = 2.0 vs 10/16 + 3/7 = 1.05)
    assert isinstance(d, Dispatch) and (d.invoker_id, d.via, d.warm) == (2, "cold", False)


def test_cold_invoker_with_most_free_resources_ties_to_lower_id() -> None:
    invs = [inv(5, 12, 4), inv(3, 12, 4), inv(4, 10, 4)]
    d = esg_dispatch(DispatchRequest("deblur", (BIG,)), invs)
    assert isinstance(d, Dispatch) and d.invoker_id == 3


def test_next_candidate_when_the_best_fits_nowhere() -> None:
    # BIG needs 2 vGPUs; every invoker has 1 free -> SMALL (rank 1) on the home invoker
    invs = [inv(0, 16, 1), inv(1, 16, 1, {"deblur": 1})]
    d = esg_dispatch(DispatchRequest("deblur", (BIG, SMALL), preferred=(0,)), invs)
    assert d == Dispatch(0, SMALL, "home", False, 1)


def test_nothing_fits_and_empty_candidates() -> None:
    invs = [inv(0, 1, 0)]
    assert isinstance(esg_dispatch(DispatchRequest("deblur", (SMALL,)), invs), NoInvoker)
    none = esg_dispatch(DispatchRequest("deblur", ()), invs)
    assert isinstance(none, NoInvoker) and "infeasible" in none.reason


def test_invoker_state_checks_capacity() -> None:
    with pytest.raises(ValueError, match="within capacity"):
        InvokerState(0, 17, 1)


def test_home_invoker_is_stable_and_in_range() -> None:
    h = home_invoker("image-classification", "super_resolution", 16)
    assert 0 <= h < 16
    assert h == home_invoker("image-classification", "super_resolution", 16)
    # different functions spread over invokers (not all on one)
    hs = {home_invoker("app", f"f{i}", 16) for i in range(20)}
    assert len(hs) > 1


def test_recheck_falls_back_to_min_config_after_three_rounds() -> None:
    key = AfwKey("app", "deblur")
    full = [inv(0, 1, 1)]  # MIN_CONFIG (1 vCPU, 1 vGPU) fits; SMALL (2 vCPUs) does not
    req = DispatchRequest("deblur", (SMALL,), preferred=(0,))
    rl = RecheckList()
    rounds = []
    for _ in range(4):
        d, rl = dispatch_with_recheck(key, req, full, rl)
        rounds.append(rl.rounds(key))
        if isinstance(d, Dispatch):
            break
    # the first failure enters the list with 0 rounds; the failed retries make it 1, 2, 3;
    # with 3 rounds the next (5th) attempt is forced to MIN_CONFIG, which fits
    assert rounds == [0, 1, 2, 3]
    assert rl.force_min_config(key)
    d, rl = dispatch_with_recheck(key, req, full, rl)
    assert d == Dispatch(0, MIN_CONFIG, "home", False, 0)
    assert rl.rounds(key) is None and rl.keys() == ()


def test_recheck_list_keeps_entry_order_and_clears_on_success() -> None:
    a, b = AfwKey("x", "a"), AfwKey("x", "b")
    rl = RecheckList().fail(a).fail(b).fail(a)
    assert rl.keys() == (a, b) and rl.rounds(a) == 1 and rl.rounds(b) == 0
    d, rl = dispatch_with_recheck(b, DispatchRequest("f", (SMALL,)), [inv(0, 16, 7)], rl)
    assert isinstance(d, Dispatch) and rl.keys() == (a,)


@pytest.mark.parametrize(
    ("candidates", "preds", "queue", "preferred"),
    [
        # a first stage: its home invoker, whatever the queue holds
        ((BIG,), (), [{"x": 5}], (home_invoker("app", "fn", 8),)),
        # later stages: where the predecessors ran, for the first `horizon` queued requests
        # (horizon = the largest candidate batch: 4), in queue order, without repeats
        ((BIG, SMALL), ("a",), [{"a": 3}, {"a": 1}, {"a": 3}, {"a": 2}, {"a": 7}], (3, 1, 2)),
        # batch 2 at most: only the first two requests count
        ((SMALL,), ("a",), [{"a": 3}, {"a": 1}, {"a": 2}], (3, 1)),
        # a join: both predecessors of each request; an unknown location is passed over
        ((SMALL,), ("a", "b"), [{"a": 0, "b": 4}, {"b": 6}], (0, 4, 6)),
        # no candidate (ESG_1Q found the group infeasible): one request's predecessors
        ((), ("a",), [{"a": 2}, {"a": 5}], (2,)),
    ],
)
def test_a_stage_prefers_where_its_inputs_are(
    candidates: tuple[FunctionConfig, ...],
    preds: tuple[str, ...],
    queue: list[dict[str, int]],
    preferred: tuple[int, ...],
) -> None:
    r = stage_request("app", "fn", candidates, preds, iter(queue), n_invokers=8)
    assert r.preferred == preferred
    assert r.first_stage is (not preds) and r.candidates == candidates and r.function == "fn"


@pytest.mark.parametrize(
    ("quotas", "want_pct", "chosen"),
    [
        ({"a": 30.0, "b": 60.0}, 50.0, "b"),  # |60-50| = 10 < |30-50| = 20
        ({"a": 30.0, "b": 60.0}, 40.0, "a"),  # 10 < 20
        ({"b": 45.0, "a": 55.0}, 50.0, "a"),  # a tie (5 and 5): the lower id
        ({"x": 100.0}, 10.0, "x"),  # the only one, however far
    ],
)
def test_pick_instance_takes_the_closest_quota(
    quotas: dict[str, float], want_pct: float, chosen: str
) -> None:
    idle = [IdleInstance(iid, q) for iid, q in quotas.items()]
    assert pick_instance(idle, want_pct).instance_id == chosen


def test_pick_instance_needs_an_instance() -> None:
    with pytest.raises(ValueError, match="at least one idle instance"):
        pick_instance([], 50.0)
