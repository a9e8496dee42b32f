"""policy.priority.live: the decisions a live instance takes at its preemption points from the
device's board (task switching, gap prediction, the idle window, BestPrioFit over the waiting
launches). Table-driven with the arithmetic in comments, and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gshare.policy.priority import KernelId, KernelSpan, TaskPhase
from gshare.policy.priority.live import (
    FillCandidate,
    choose_fill,
    fillable_kernels,
    gap_end_after,
    must_yield,
    phase_of,
    window_end_ms,
)
from gshare.policy.priority.profile import profile_from_runs


@pytest.mark.parametrize(
    ("top", "prio", "expected"),
    [
        (None, 3, False),  # nobody active: run
        (3, 3, False),  # own class on top: tokens share it, no yield
        (2, 3, False),  # a lower class on top (it will yield to us)
        (9, 3, True),  # a higher class is active: yield at this preemption point
    ],
)
def test_must_yield(top: int | None, prio: int, expected: bool) -> None:
    assert must_yield(top, prio) is expected


def test_phase_of() -> None:
    assert phase_of(0, 10) is TaskPhase.MEASURING
    assert phase_of(9, 10) is TaskPhase.MEASURING
    assert phase_of(10, 10) is TaskPhase.SHARING


@pytest.mark.parametrize(
    ("now", "sg", "left", "expected"),
    [
        (100.0, None, 0.0, None),  # unknown SG: no gap
        (100.0, 0.05, 0.0, None),  # 0.05 < 0.1 ms: skipped (Algorithm 1, lines 6-8)
        (100.0, 0.1, 0.0, 100.1),  # exactly the minimum: 100 + 0.1
        (100.0, 2.0, 0.0, 102.0),  # CPU: the op is done, the gap starts now: 100 + 2
        (100.0, 2.0, 0.5, 102.5),  # GPU: the op's kernels run 0.5 ms more: 100 + 0.5 + 2
    ],
)
def test_gap_end_after(now: float, sg: float | None, left: float, expected: float | None) -> None:
    assert gap_end_after(now, sg, kernel_left_ms=left) == expected


@pytest.mark.parametrize(
    ("ends", "expected"),
    [
        ([], None),  # no top-class task runs: no window (the class plan lets lower ones run)
        ([5.0], 5.0),
        ([5.0, 3.0], 3.0),  # two top tasks in gaps: the earlier end bounds the window
        ([5.0, None], None),  # one of them runs a kernel: the device is not idle
    ],
)
def test_window_end(ends: list[float | None], expected: float | None) -> None:
    assert window_end_ms(ends) == expected


def _c(cid: str, prio: int, sk: float | None, since: float = 0.0) -> FillCandidate:
    return FillCandidate(cid, prio, sk, since)


@pytest.mark.parametrize(
    ("cands", "remaining", "overhead", "expected"),
    [
        # 0.3 fits 0.5; 0.6 does not: b
        ([_c("a", 2, 0.6), _c("b", 2, 0.3)], 0.5, 0.0, "b"),
        # both fit 1.0: the longest of the level (0.6) is closest to the rest
        ([_c("a", 2, 0.6), _c("b", 2, 0.3)], 1.0, 0.0, "a"),
        # the higher level first even with a shorter kernel: c (prio 4, 0.1) over a (prio 2, 0.6)
        ([_c("a", 2, 0.6), _c("c", 4, 0.1)], 1.0, 0.0, "c"),
        # the higher level has nothing that fits (0.9 > 0.5): go down to a (0.3)
        ([_c("a", 2, 0.3), _c("c", 4, 0.9)], 0.5, 0.0, "a"),
        # overhead 0.25 per fill: 0.3 + 0.25 = 0.55 > 0.5 -> nothing
        ([_c("a", 2, 0.3)], 0.5, 0.25, None),
        # unknown SK never fills
        ([_c("a", 2, None)], 5.0, 0.0, None),
        # equal SK on one level: the longest waiting (since 1.0 before 2.0)
        ([_c("late", 2, 0.3, 2.0), _c("early", 2, 0.3, 1.0)], 0.5, 0.0, "early"),
        # no time left
        ([_c("a", 2, 0.1)], 0.0, 0.0, None),
    ],
)
def test_choose_fill_table(
    cands: list[FillCandidate], remaining: float, overhead: float, expected: str | None
) -> None:
    pick = choose_fill(cands, remaining, overhead_ms=overhead)
    assert (pick.client_id if pick else None) == expected


CANDS = st.lists(
    st.tuples(
        st.integers(0, 8),
        st.one_of(st.none(), st.floats(0.0, 3.0, allow_nan=False)),
        st.floats(0.0, 100.0, allow_nan=False),
    ),
    max_size=8,
)


@given(cs=CANDS, remaining=st.floats(0.0, 3.0, allow_nan=False), over=st.floats(0.0, 0.5))
def test_choose_fill_is_best_prio_fit(
    cs: list[tuple[int, float | None, float]], remaining: float, over: float
) -> None:
    cands = [FillCandidate(f"c{i}", p, sk, since) for i, (p, sk, since) in enumerate(cs)]
    pick = choose_fill(cands, remaining, overhead_ms=over)
    fits = [c for c in cands if c.sk_ms is not None and c.sk_ms + over <= remaining + 1e-9]
    if remaining <= 0.0 or not fits:
        assert pick is None
        return
    assert pick is not None and pick in fits
    # highest priority that has a fitting launch, then the longest there
    assert pick.priority == max(c.priority for c in fits)
    same = [c for c in fits if c.priority == pick.priority]
    assert pick.sk_ms is not None
    assert all(c.sk_ms is not None and c.sk_ms <= pick.sk_ms + 1e-9 for c in same)


@given(top=st.one_of(st.none(), st.integers(0, 9)), prio=st.integers(0, 9))
def test_only_lower_classes_yield(top: int | None, prio: int) -> None:
    assert must_yield(top, prio) == (top is not None and prio < top)


def test_fillable_kernels_from_the_profile() -> None:
    conv = KernelId.cpu("Conv2d", [[1, 3, 8, 8]])
    relu = KernelId.cpu("ReLU", [[1, 8, 8, 8]])
    # one run: conv 0-1, gap 1 ms, relu 2-2.1, gap 0.02 ms, conv 2.12-3.0
    run = [KernelSpan(conv, 0.0, 1.0), KernelSpan(relu, 2.0, 2.1), KernelSpan(conv, 2.12, 3.0)]
    p = profile_from_runs("f", [run])
    # SG(conv) = 1.0 (only the first conv has a next kernel); SG(relu) = 0.02 < 0.1
    assert fillable_kernels(p) == frozenset({conv})
    assert fillable_kernels(p, min_gap_ms=2.0) == frozenset()


@pytest.mark.parametrize(("reserve_lower", "expected_ms"), [(True, 20.0), (False, 35.0)])
def test_class_plan_owes_lower_classes_nothing(reserve_lower: bool, expected_ms: float) -> None:
    """``TokenConfig.reserve_for_lower_priority`` (False under FIKIT's class plan): a higher
    class's token is not shortened for a lower class's guarantee."""
    from gshare.policy.tokens import ClientSpec, TokenConfig, TokenScheduler

    cfg = TokenConfig(idle_token_ms=40.0, reserve_for_lower_priority=reserve_lower)
    s = TokenScheduler(cfg)
    s.add_client(ClientSpec("lo", 100.0, 0.5, 1.0, 1), 0.0)
    s.add_client(ClientSpec("hi", 100.0, 0.5, 1.0, 9), 0.0)
    assert [g.client_id for g in s.request("lo", 0.0)] == ["lo"]
    s.release("lo", 5.0, 5.0, completed=False)  # lo used 5 of its 20-ms guarantee
    (g,) = s.request("hi", 5.0)
    # hi alone: a 40-ms uncontended token, clipped by the reservation to
    # max(hi's own missing 20, window rest 40 - 5 = 35 - owed to lo (20 - 5 = 15) = 20) = 20;
    # owing lo nothing: max(20, 35 - 0) = 35
    assert g.client_id == "hi" and g.quota_ms == pytest.approx(expected_ms)
