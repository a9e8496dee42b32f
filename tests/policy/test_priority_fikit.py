"""policy.priority.fikit: BestPrioFit and the FIKIT procedure (§3.2, Algorithms 1-2).

Table-driven: each case lists the waiting launches as (priority, SK ms) in launch order, the
gap, and what must be chosen; the arithmetic is in the comments.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gshare.policy.priority import (
    KernelId,
    PendingLaunch,
    PriorityQueues,
    best_prio_fit,
    fikit_fill,
    paper_queue,
)
from gshare.policy.priority.fikit import fill_remaining


def queues(*items: tuple[int, float | None]) -> tuple[PriorityQueues, dict[int, float | None]]:
    """Launch i (seq i) has priority items[i][0] and SK items[i][1] (None: unknown)."""
    q = PriorityQueues()
    sk: dict[int, float | None] = {}
    for i, (prio, d) in enumerate(items):
        q.push(PendingLaunch(f"t{i}", KernelId.gpu(f"k{i}", (1, 1, 1), (1, 1, 1)), prio, i, 0.0))
        sk[i] = d
    return q, sk


def lookup(sk: dict[int, float | None]):  # type: ignore[no-untyped-def]
    return lambda p: sk[p.seq]


@pytest.mark.parametrize(
    ("items", "remaining", "chosen"),
    [
        # one level: the longest kernel that fits 1.0 ms is 0.8 (0.3 and 0.8 fit, 1.2 does not)
        ([(5, 0.3), (5, 1.2), (5, 0.8)], 1.0, 2),
        # an exact fit counts: 1.0 <= 1.0
        ([(5, 0.3), (5, 1.0)], 1.0, 1),
        # priority first: level 7 has 0.2 that fits, so level 5's better-fitting 0.9 is ignored
        ([(5, 0.9), (7, 0.2)], 1.0, 1),
        # ...unless nothing of the higher level fits: 7's 1.5 > 1.0, so level 5's 0.9
        ([(5, 0.9), (7, 1.5)], 1.0, 0),
        # ties in length: the earlier launch (FIFO)
        ([(3, 0.4), (3, 0.4)], 0.5, 0),
        # an unknown SK never fits (a measuring task's kernel)
        ([(6, None), (2, 0.1)], 1.0, 1),
        # nothing fits: 0.6 and 0.7 > 0.5
        ([(4, 0.6), (1, 0.7)], 0.5, None),
        # no idle time left
        ([(4, 0.01)], 0.0, None),
    ],
)
def test_best_prio_fit_table(
    items: list[tuple[int, float | None]], remaining: float, chosen: int | None
) -> None:
    q, sk = queues(*items)
    fit = best_prio_fit(q, remaining, lookup(sk))
    if chosen is None:
        assert fit is None
        assert len(q) == len(items)
    else:
        assert fit is not None
        assert fit.launch.seq == chosen
        assert fit.duration_ms == sk[chosen]
        assert len(q) == len(items) - 1  # BestPrioFit dequeues its pick
        assert fit.launch not in list(q)


def test_best_prio_fit_charges_the_overhead() -> None:
    # 0.45 + 0.1 overhead = 0.55 > 0.5: no; 0.35 + 0.1 = 0.45 <= 0.5: yes
    q, sk = queues((5, 0.45), (5, 0.35))
    fit = best_prio_fit(q, 0.5, lookup(sk), overhead_ms=0.1)
    assert fit is not None and fit.launch.seq == 1


@pytest.mark.parametrize(
    ("items", "gap", "chosen"),
    [
        # gap 1.0: best fit 0.8 (left 0.2), then 0.15 (left 0.05), then nothing (0.3 > 0.05)
        ([(5, 0.3), (5, 0.8), (5, 0.15)], 1.0, [1, 2]),
        # priority before size at every step: 7's 0.5 (left 0.5), then 5's 0.4 (left 0.1)
        ([(5, 0.4), (7, 0.5), (5, 0.45)], 1.0, [1, 2]),
        # gaps under 0.1 ms are skipped even if a kernel would fit: 0.09 < 0.1
        ([(5, 0.01)], 0.09, []),
        # exactly 0.1 is filled
        ([(5, 0.01), (5, 0.02)], 0.1, [1, 0]),
        # three levels: 9 is the top class (never here), 4 before 2; 4's 0.3 (left 0.2), then
        # 4's 0.25 no longer fits, 2's 0.2 does (left 0)
        ([(2, 0.2), (4, 0.3), (4, 0.25)], 0.5, [1, 0]),
    ],
)
def test_fikit_fill_table(
    items: list[tuple[int, float | None]], gap: float, chosen: list[int]
) -> None:
    q, sk = queues(*items)
    fits = fikit_fill(q, gap, lookup(sk))
    assert [f.launch.seq for f in fits] == chosen
    assert sum(f.duration_ms for f in fits) <= gap + 1e-12


def test_the_rescan_of_an_open_gap_has_no_minimum() -> None:
    # A gap already open has 0.05 ms left when a 0.04-ms kernel is queued: the paper's rescan
    # ("a kernel added to any queue triggers a scan") fills it; only a new gap is skipped < 0.1.
    q, sk = queues((5, 0.04))
    assert [f.launch.seq for f in fill_remaining(q, 0.05, lookup(sk))] == [0]


def test_paper_queue_order() -> None:
    # gshare 9 (highest) is the paper's Q0, gshare 0 its Q9
    assert [paper_queue(p) for p in (9, 5, 0)] == [0, 4, 9]


ITEMS = st.lists(
    st.tuples(st.integers(0, 9), st.one_of(st.none(), st.floats(0.001, 3.0))),
    max_size=12,
)


@given(items=ITEMS, gap=st.floats(0.0, 5.0))
def test_fills_never_exceed_the_gap_and_respect_priority(
    items: list[tuple[int, float | None]], gap: float
) -> None:
    q, sk = queues(*items)
    fits = fikit_fill(q, gap, lookup(sk))
    if gap < 0.1:
        assert fits == []
        return
    assert sum(f.duration_ms for f in fits) <= gap + 1e-9
    left = gap
    remaining = dict(enumerate(items))
    for f in fits:
        del remaining[f.launch.seq]
        # no waiting launch of a higher level fitted at the moment of this pick
        for _, (p, d) in remaining.items():
            if p > f.launch.priority and d is not None:
                assert d > left + 1e-9
        left -= f.duration_ms
    # when the procedure stops, nothing left fits
    assert all(d is None or d > left + 1e-9 for p, d in remaining.values())
